"""Renamed copies of training domains (``data.domains.renaming``): fresh names, the same
structure, consistent keys, rules and questions, nothing borrowed from a held-out domain."""

from __future__ import annotations

import random
import re

import pytest

from progress_sql.params import SettingsError, settings_from_dict
from progress_sql.data.build import build_corpus, split_domains
from progress_sql.data.domains import CATALOGUE, get_domain
from progress_sql.data.domains.renaming import domain_words, plural, rename_domain, rename_pool, renamed_copies
from progress_sql.data.domains.spec import After
from progress_sql.corpus.records import CorpusLayout, read_jsonl
from progress_sql.corpus.schema import read_tables_json
from progress_sql.sql import execute

SMALL = {
    "n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1,
    "train_size": 60, "dev_size": 20, "test_size": 20, "neighbours": 1,
}


def test_plural_of_regular_nouns():
    assert [plural(w) for w in ("lantern", "box", "peach", "berry", "key", "glass")] == [
        "lanterns", "boxes", "peaches", "berries", "keys", "glasses"]


@pytest.mark.parametrize("domain", CATALOGUE, ids=lambda d: d.name)
def test_a_renamed_domain_keeps_its_structure_under_fresh_names(domain):
    pool = rename_pool([])
    copy = rename_domain(domain, f"{domain.name}_r1", random.Random(1), pool, column_share=0.5)
    copy.check()  # keys, parents declared first, generators, rules on value columns
    old_words = domain_words(domain)
    assert copy.name == f"{domain.name}_r1"
    assert len(copy.tables) == len(domain.tables)
    renamed_columns = 0
    for old, new in zip(domain.tables, copy.tables):
        assert not set(new.name.split("_")) & old_words, (old.name, new.name)
        assert (new.singular, new.plural) == (new.name.replace("_", " "), plural(new.name.replace("_", " ")))
        assert [c.kind for c in new.columns] == [c.kind for c in old.columns]
        for oc, nc in zip(old.columns, new.columns):
            if oc.kind == "id":
                assert nc.name == f"{new.name}_id"
            elif oc.kind == "ref":  # points at the renamed parent's key (or keeps a role name)
                assert nc.ref == copy.tables[[t.name for t in domain.tables].index(oc.ref)].name
                assert nc.name == copy.table(nc.ref).primary_key[0] or oc.name != domain.table(oc.ref).primary_key[0]
            elif oc.kind == "label":
                assert nc.name == oc.name
            elif nc.name != oc.name:
                renamed_columns += 1
                assert nc.noun == nc.name.replace("_", " ") and nc.synonyms == ()
            if isinstance(oc.gen, After):  # a date drawn after another follows that column's rename
                assert nc.gen.column in [c.name for c in new.columns]
    assert renamed_columns > 0
    for old_rule, rule in zip(domain.dk_rules, copy.dk_rules):
        col = copy.table(rule.table).column(rule.column)
        assert col.kind == domain.table(old_rule.table).column(old_rule.column).kind
        assert rule.evidence == old_rule.evidence.replace(old_rule.column, rule.column)


def test_the_pool_never_holds_a_held_out_word_and_copies_are_seeded():
    for domain in CATALOGUE:
        assert not set(rename_pool([domain])) & domain_words(domain)
    train = [get_domain("music"), get_domain("library")]
    held = [get_domain("university")]
    a = renamed_copies(train, 3, held, 0, 0.5)
    assert [d.name for d in a] == ["music_r1", "music_r2", "music_r3", "library_r1", "library_r2", "library_r3"]
    assert a == renamed_copies(train, 3, held, 0, 0.5)
    assert a != renamed_copies(train, 3, held, 1, 0.5)
    assert len({d.tables[0].name for d in a}) == len(a)  # every copy its own names
    none_renamed = renamed_copies(train, 1, held, 0, 0.0)[0]
    assert [c.name for c in none_renamed.tables[1].columns if c.kind not in ("id", "ref")] == \
        [c.name for c in train[0].tables[1].columns if c.kind not in ("id", "ref")]


def test_settings_bound_the_copies():
    with pytest.raises(SettingsError, match="renamed_copies"):
        settings_from_dict({"data": {"renamed_copies": -1}})
    with pytest.raises(SettingsError, match="renamed_column_share"):
        settings_from_dict({"data": {"renamed_column_share": 1.5}})


def test_a_build_with_renamed_copies_trains_on_them_and_holds_out_the_rest(tmp_path):
    settings = settings_from_dict({"data": {**SMALL, "renamed_copies": 2}})
    plain = split_domains(settings_from_dict({"data": {**SMALL, "renamed_copies": 0}}))
    split = split_domains(settings)
    assert [d.name for d in split["dev"]] == [d.name for d in plain["dev"]]
    assert [d.name for d in split["test"]] == [d.name for d in plain["test"]]
    originals = [d.name for d in plain["train"]]
    assert [d.name for d in split["train"]] == originals + [f"{n}_r{k}" for n in originals for k in (1, 2)]

    manifest = build_corpus(settings, tmp_path / "corpus", progress=False)
    layout = CorpusLayout(tmp_path / "corpus")
    assert manifest["splits"]["train"]["databases"] == [d.name for d in split["train"]]
    tables = read_tables_json(layout.tables_json)
    train = list(read_jsonl(layout.split("train")))
    by_db = {d.name: d for d in split["train"]}
    per_db = {name: [ex for ex in train if ex.db_id == name] for name in by_db}
    assert all(len(exs) >= 5 for exs in per_db.values())  # balanced across the 6 databases
    held_words = set().union(*(domain_words(d) for d in split["dev"] + split["test"]))
    for name, exs in per_db.items():
        if name in originals:
            continue
        domain = by_db[name]
        assert {t.name for t in tables[name].tables} == {t.name for t in domain.tables}
        for ex in exs:  # golds run on the renamed file and name only its tables
            assert execute(layout.database(name), ex.gold_sql).ok
            used = [t for t in domain.tables if re.search(rf"\b{t.name}\b", ex.gold_sql)]
            assert used, ex.gold_sql
        # the questions call the renamed tables by their new nouns
        mentioned = sum(any(n in ex.question.lower() for t in domain.tables for n in (t.singular, t.plural)) for ex in exs)
        assert mentioned >= 0.8 * len(exs)
        assert not set(w for t in domain.tables for w in t.name.split("_")) & held_words
