"""The robustness suite: Syn, Realistic and DK variants keep a valid gold and change the
question the documented way; phrasing styles; domain-knowledge rewriting."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from progress_sql.params import settings_from_dict
from progress_sql.data.domains import get_domain
from progress_sql.data.drafting import Draft, apply_dk_rules, draw_examples, make_example
from progress_sql.data.generate_db import generate_rows, write_database
from progress_sql.data.patterns import FAMILY_BY_NAME, DbContext
from progress_sql.data.phrasing import Phraser, pluralize
from progress_sql.data.query import Agg, Col, Cond, Select, render_sql
from progress_sql.sources import VARIANTS
from progress_sql.data.variants import build_variants, dk_variant, mentions, realistic_variant, syn_variant
from progress_sql.sql import execute, hardness

SETTINGS = settings_from_dict({"data": {"dev_size": 80}})


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """Dev drafts drawn on two real databases (hospital and university)."""
    root = tmp_path_factory.mktemp("variants")
    contexts = []
    for name in ("hospital", "university"):
        domain = get_domain(name)
        rows = generate_rows(domain, seed=0)
        path = root / f"{name}.sqlite"
        write_database(path, domain, rows)
        contexts.append(DbContext(name, domain, rows, path))
    drawn, _ = draw_examples("dev", contexts, 80, SETTINGS)
    return drawn


@pytest.fixture(scope="module")
def variants(drafts):
    return build_variants(drafts, SETTINGS)


def test_every_variant_keeps_an_executable_non_empty_gold_and_names_its_original(drafts, variants):
    made, coverage = variants
    originals = {d.example.id: d for d in drafts}
    for name in VARIANTS:
        assert made[name], name
        assert coverage[name] == pytest.approx(len(made[name]) / len(drafts))
        for v in made[name]:
            of = v.meta["of"]
            assert v.id == f"{of}-{name}" and v.meta["variant"] == name
            original = originals[of]
            assert v.db_id == original.example.db_id and v.question
            res = execute(original.ctx.path, v.gold_sql, timeout_s=SETTINGS.data.gold_timeout_s)
            assert res.ok and res.rows, v.gold_sql
            assert v.hardness == hardness(v.gold_sql)
    assert coverage["syn"] > 0.8 and coverage["realistic"] > 0.2


def test_syn_swaps_schema_nouns_for_synonyms_and_keeps_the_gold(drafts, variants):
    originals = {d.example.id: d.example for d in drafts}
    for v in variants[0]["syn"]:
        original = originals[v.meta["of"]]
        assert v.gold_sql == original.gold_sql and v.question != original.question
        for word, synonym in v.meta["swaps"]:
            assert mentions(original.question, word) and mentions(v.question, synonym)


def test_realistic_leaves_column_mentions_out_and_keeps_the_gold(drafts, variants):
    originals = {d.example.id: d.example for d in drafts}
    for v in variants[0]["realistic"]:
        original = originals[v.meta["of"]]
        assert v.gold_sql == original.gold_sql
        for noun in v.meta["implicit"]:
            assert mentions(v.question, noun) < mentions(original.question, noun)


def test_dk_uses_the_rule_word_without_evidence(drafts, variants):
    originals = {d.example.id: d.example for d in drafts}
    for v in variants[0]["dk"]:
        original = originals[v.meta["of"]]
        assert v.evidence == ""
        rules = [r for r in get_domain(v.db_id).dk_rules if r.evidence in v.meta["rules"]]
        assert rules
        for rule in rules:
            word = rule.phrase.replace("{noun}", "").strip()
            assert word in v.question
            assert rule.column in v.gold_sql
        # a new gold, or the original's own (its evidence withheld, or its condition already the
        # rule's, now worded by the rule alone)
        assert v.gold_sql != original.gold_sql or original.evidence or v.question != original.question


def test_no_variant_for_an_empty_gold(drafts):
    empty = replace(drafts[0], empty=True)
    made, _ = build_variants([empty], SETTINGS)
    assert all(not made[v] for v in VARIANTS)


# ----------------------------------------------------------------------------- phrasing units
def _student_query(op: str, value: object) -> Select:
    return Select(("student",), (Col(0, "name"),), where=(Cond(Col(0, "age"), op, value),))


def test_phraser_styles_on_one_condition():
    domain = get_domain("university")
    sel = _student_query(">", 20)
    plain, real, syn = (Phraser(domain, "salt", s) for s in ("plain", "realistic", "syn"))
    p = plain.head("student", ["name"], plain.np("student", sel.where))
    r = real.head("student", ["name"], real.np("student", sel.where))
    s = syn.np("student", sel.where)
    assert "names of students" in p and re.search(r"\bage\b", p)
    assert r == "the students older than 20" and real.implicit == ["age", "name"]
    assert s.split()[0] in ("pupils", "undergraduates") and syn.swaps
    with pytest.raises(ValueError, match="unknown style"):
        Phraser(domain, "salt", "shouty")


def test_pick_is_stable_per_salt_and_key():
    domain = get_domain("university")
    a, b = Phraser(domain, "x"), Phraser(domain, "x", "syn")
    options = list(range(100))
    assert a.pick("k", options) == b.pick("k", options)
    assert len({Phraser(domain, f"s{i}").pick("k", options) for i in range(30)}) > 10


def test_pluralize_handles_the_catalogue_nouns():
    assert [pluralize(w) for w in ("salary", "name", "sex", "status", "years of experience", "day")] == [
        "salaries", "names", "sexes", "status", "years of experience", "days"]


def test_apply_dk_rules_rewrites_and_leaves_or_alone():
    domain = get_domain("university")
    sel = Select(("student",), (Col(0, "name"),), where=(Cond(Col(0, "gpa"), ">", 2.1),))
    new, rules = apply_dk_rules(sel, domain)
    assert [r.column for r in rules] == ["gpa"]
    assert render_sql(new) == "SELECT name FROM student WHERE gpa >= 3.5"
    ph = Phraser(domain, "salt")
    assert ph.np("student", new.where) == "honours students"
    either = Select(("student",), (Col(0, "name"),), conj="OR",
                    where=(Cond(Col(0, "gpa"), ">", 2.1), Cond(Col(0, "age"), "<", 19)))
    assert apply_dk_rules(either, domain) == (either, [])
    nothing = _student_query(">", 20)
    assert apply_dk_rules(nothing, domain) == (nothing, [])


def test_single_variant_builders_return_none_when_nothing_applies(drafts):
    ctx = next(d.ctx for d in drafts if d.ctx.db_id == "hospital")
    sel = Select(("patient",), (Agg("COUNT"),))
    fam = FAMILY_BY_NAME["count"]
    example = make_example("x", ctx, fam, sel, "salt", hardness(render_sql(sel)), [])
    plain = ("how many patients are there", "count the patients", "what is the number of patients",
             "find the total number of patients")
    assert any(q in example.question.lower() for q in plain)  # in one of the registers (Phraser.frame)
    plain_count = Draft(example, "count", sel, ctx, empty=False, salt="salt")
    assert realistic_variant(plain_count) is None
    assert dk_variant(plain_count, SETTINGS) is None
    assert syn_variant(plain_count) is not None  # table nouns still have synonyms
