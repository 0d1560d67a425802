"""Renamed copies of a training domain: the same tables, generators and question templates under
fresh table and column names.

A small policy trained on a dozen databases learns their names by heart and writes them on every
database it meets. A renamed copy keeps the structure and the wording of the questions but not the
names, so the only way to answer it is to read the names from the schema in the prompt and copy
the one the question uses: the skill an unseen dev database asks for. The question side follows
the rename: a renamed table or column is called by its new name ("How many lanterns ...").

Ids and foreign keys follow their table (``<table>_id``); label columns (name, title) keep their
names, being common to every domain; each other column is renamed with probability
``column_share``.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from typing import Iterable, Iterator, Sequence

from progress_sql.data.domains import vocab
from progress_sql.data.domains.spec import After, Column, DKRule, Domain, Table


def plural(word: str) -> str:
    """The regular English plural of ``word`` (the rename pool holds regular nouns only)."""
    if word.endswith(("s", "x", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def domain_words(domain: Domain) -> set[str]:
    """Every word of the domain's identifiers and nouns ("admit_date" → admit, date)."""
    texts: list[str] = []
    for t in domain.tables:
        texts += [t.name, t.singular, t.plural] + [w for pair in t.synonyms for w in pair]
        for c in t.columns:
            texts += [c.name, c.noun, *c.synonyms]
    return {w for text in texts for w in re.split(r"[\s_]+", text.lower()) if w}


def rename_pool(held_out: Iterable[Domain]) -> list[str]:
    """The rename words no held-out (dev or test) domain uses, so no renamed name leaks one."""
    banned = set().union(*(domain_words(d) for d in held_out))
    return [w for w in vocab.RENAME_WORDS if w not in banned and plural(w) not in banned]


def renamed_copies(domains: Sequence[Domain], copies: int, held_out: Iterable[Domain], seed: int | str,
                   column_share: float) -> list[Domain]:
    """``copies`` renamed copies of each domain, named ``<domain>_r<k>``; deterministic in the seed."""
    pool = rename_pool(held_out)
    return [
        rename_domain(d, f"{d.name}_r{k}", random.Random(f"{seed}:rename:{d.name}:{k}"), pool, column_share)
        for d in domains for k in range(1, copies + 1)
    ]


def rename_domain(domain: Domain, name: str, rng: random.Random, pool: Sequence[str],
                  column_share: float) -> Domain:
    """``domain`` as ``name`` with fresh table names and a ``column_share`` of fresh column names."""
    taken = domain_words(domain)
    words = _fresh_words(rng, [w for w in pool if w not in taken])
    tables = {t.name: _fresh_name(words, rng, two_word_share=0.2) for t in domain.tables}
    columns: dict[str, dict[str, str]] = {}  # table → old column name → new
    for t in domain.tables:
        parent_key = {c.name: domain.table(c.ref).primary_key[0] for c in t.foreign_keys}
        cmap = {}
        for c in t.columns:
            if c.kind == "id":
                cmap[c.name] = f"{tables[t.name]}_id"
            elif c.kind == "ref":
                cmap[c.name] = _ref_name(c, parent_key[c.name], tables)
            elif c.kind == "label" or rng.random() >= column_share:
                cmap[c.name] = c.name
            else:
                cmap[c.name] = _fresh_name(words, rng, two_word_share=0.4)
        columns[t.name] = cmap
    copy = renamed(replace(domain, name=name, family=domain.family_name), tables, columns)
    copy.check()
    return copy


def renamed(domain: Domain, tables: dict[str, str], columns: dict[str, dict[str, str]],
            nouns: dict[str, tuple[tuple[str, str], ...]] | None = None) -> Domain:
    """``domain`` under new table and column names: keys, foreign keys, rules and the dates drawn
    after another column follow. Without ``nouns`` the questions follow the names (a renamed
    copy); with them each table is called by its nouns there (the first its schema word, the
    others its synonyms) and the columns keep their nouns (a database's physical names)."""
    return replace(
        domain,
        tables=tuple(_rename_table(t, tables, columns[t.name], None if nouns is None else nouns[t.name])
                     for t in domain.tables),
        dk_rules=tuple(_rename_rule(r, tables, columns) for r in domain.dk_rules),
    )


def _fresh_words(rng: random.Random, pool: list[str]) -> Iterator[str]:
    order = list(pool)
    rng.shuffle(order)
    yield from order
    raise ValueError("the rename word pool ran out: add words to vocab.RENAME_WORDS")


def _fresh_name(words: Iterator[str], rng: random.Random, two_word_share: float) -> str:
    first = next(words)
    return f"{first}_{next(words)}" if rng.random() < two_word_share else first


def _ref_name(col: Column, parent_key: str, tables: dict[str, str]) -> str:
    """A foreign key named after its parent's key follows it; one with its own role name
    (``home_team_id``, ``origin_id``) swaps the parent's name where it holds it."""
    if col.name == parent_key:
        return f"{tables[col.ref]}_id"
    if col.ref in col.name:
        return col.name.replace(col.ref, tables[col.ref])
    return col.name


def _rename_table(t: Table, tables: dict[str, str], cmap: dict[str, str],
                  nouns: tuple[tuple[str, str], ...] | None) -> Table:
    new = tables[t.name]
    cols = []
    for c in t.columns:
        # a value column given a new word, when the questions follow the names
        fresh = nouns is None and cmap[c.name] != c.name and c.kind not in ("id", "ref")
        if c.kind == "ref" and nouns is None:
            noun = tables[c.ref].replace("_", " ")  # a foreign key is called by its parent
        else:
            noun = cmap[c.name].replace("_", " ") if fresh else c.noun
        gen = replace(c.gen, column=cmap[c.gen.column]) if isinstance(c.gen, After) else c.gen
        cols.append(replace(
            c, name=cmap[c.name], gen=gen, noun=noun, synonyms=() if fresh else c.synonyms,
            ref=tables[c.ref] if c.ref else "",
            differs_from=cmap[c.differs_from] if c.differs_from else "",
        ))
    if nouns is not None:
        (singular, plural_), *others = nouns
        words = dict(singular=singular, plural=plural_, synonyms=tuple(others))
    else:
        singular = new.replace("_", " ")
        words = dict(singular=singular, plural=_plural_phrase(singular), synonyms=())
    return replace(t, name=new, columns=tuple(cols), primary_key=tuple(cmap[k] for k in t.primary_key), **words)


def _plural_phrase(phrase: str) -> str:
    head, _, last = phrase.rpartition(" ")
    return f"{head} {plural(last)}".strip()


def _rename_rule(rule: DKRule, tables: dict[str, str], columns: dict[str, dict[str, str]]) -> DKRule:
    new_col = columns[rule.table][rule.column]
    evidence = re.sub(rf"\b{re.escape(rule.column)}\b", new_col, rule.evidence)
    return replace(rule, table=tables[rule.table], column=new_col, evidence=evidence)


__all__ = ["domain_words", "plural", "rename_domain", "rename_pool", "renamed", "renamed_copies"]
