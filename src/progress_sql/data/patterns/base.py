"""The family registry, and the wording helpers the families share."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from progress_sql.data.domains.spec import Column, Domain
from progress_sql.data.patterns.context import DbContext
from progress_sql.data.phrasing import AGG_WORDS, Phraser, sentence
from progress_sql.data.query import Agg, Col, Select

LEVELS = ("easy", "medium", "hard", "extra")

Sampler = Callable[[DbContext, random.Random], Select | None]  # None: nothing fits this database
Asker = Callable[[Phraser, Select], str]


@dataclass(frozen=True)
class Family:
    """A query shape: how to sample it on a database and how to ask for it."""

    name: str
    level: str  # the Spider hardness it aims at
    sample: Sampler
    ask: Asker


FAMILIES: list[Family] = []


def family(name: str, level: str, ask: Asker):
    """Register the decorated sampler as family ``name`` (asked by ``ask``)."""

    def register(sample: Sampler) -> Sampler:
        FAMILIES.append(Family(name, level, sample, ask))
        return sample
    return register


def tpl(ph: Phraser, options: list[tuple[str, bool]], **slots: str) -> str:
    """One of ``options`` (template, is_question), filled with ``slots`` and a verb, in one of
    the phraser's registers."""
    text, question = ph.pick("tpl", options)
    return ph.frame(sentence(text.format(verb=ph.verb(), **slots), question), question)


def where_np(ph: Phraser, sel: Select, t: int = 0, det_all: bool = True) -> str:
    """The noun phrase of table ``t`` under the WHERE conditions on it ("all students" when none)."""
    conds = [c for c in sel.where if isinstance(c.left, Col) and c.left.t == t and not isinstance(c.value, Select)]
    np = ph.np(sel.tables[t], conds, sel.conj)
    return np if conds or not det_all else f"all {np}"


def agg_word(ph: Phraser, fn: str) -> str:
    """"average", "highest", ... for an aggregate function."""
    return ph.pick(f"agg:{fn}", AGG_WORDS[fn])


def superlative(ph: Phraser, column: Column, desc: bool) -> str:
    """"highest" / "lowest"; "most recent" / "earliest" for years and dates."""
    if column.kind in ("year", "date"):
        return ph.pick("sup", ("most recent", "latest") if desc else ("earliest", "oldest"))
    return ph.pick("sup", ("highest", "largest", "greatest") if desc else ("lowest", "smallest"))


def most_words(ph: Phraser, desc: bool) -> str:
    """"most" / "fewest" (or "largest number of" / "smallest number of")."""
    return ph.pick("most", ("most", "largest number of") if desc else ("fewest", "smallest number of"))


def order_words(ph: Phraser, column: Column, desc: bool) -> str:
    """How a question says the sort direction of ``column``."""
    if column.kind in ("year", "date"):
        return ph.pick("dir", ("from newest to oldest", "from the most recent") if desc
                       else ("from oldest to newest", "from the earliest"))
    return ph.pick("dir", ("in descending order", "from highest to lowest") if desc
                   else ("in ascending order", "from lowest to highest"))


def be_rel(rel: str) -> str:
    """"are in", "are offered by"; "of" reads "belong to"."""
    return "belong to" if rel in ("of", "for", "to") else f"are {rel}"


def column_of(ph: Phraser, sel: Select, e: Col | Agg) -> Column:
    """The catalogue column behind a column reference or an aggregate's argument."""
    c = e if isinstance(e, Col) else e.col
    return ph.domain.table(sel.tables[c.t]).column(c.name)  # type: ignore[union-attr]


def path_of(ph: Phraser, sel: Select) -> tuple[list[bool], list[str]]:
    """Directions (child → parent?) and foreign-key phrases of the joins of ``sel``."""
    domain = ph.domain
    forward, rels = [], []
    for j in sel.joins:
        src, dst = sel.tables[j.left.t], sel.tables[j.right.t]
        src_col = domain.table(src).column(j.left.name)
        if src_col.kind == "ref" and src_col.ref == dst:
            forward.append(True)
            rels.append(src_col.rel)
        else:
            forward.append(False)
            rels.append(domain.table(dst).column(j.right.name).rel)
    return forward, rels


def path_np(ph: Phraser, sel: Select, key: str = "path") -> str:
    """The join path of ``sel`` as a noun phrase, the WHERE conditions on its last table included."""
    forward, rels = path_of(ph, sel)
    last = len(sel.tables) - 1
    conds = [c for c in sel.where if isinstance(c.left, Col) and c.left.t == last]
    return ph.path(sel.tables, forward, rels, conds, sel.conj, key=key)


def families_for(level: str) -> list[Family]:
    """The families aimed at Spider hardness ``level``, by name (independent of import order)."""
    return sorted((f for f in FAMILIES if f.level == level), key=lambda f: f.name)


def ask(fam: Family, domain: Domain, sel: Select, salt: str, style: str = "plain") -> tuple[str, Phraser]:
    """The question of ``sel`` in ``style``, and the Phraser (its swaps and implicit nouns)."""
    ph = Phraser(domain, salt, style)
    return fam.ask(ph, sel), ph
