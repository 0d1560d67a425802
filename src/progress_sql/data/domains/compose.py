"""Composed domains: a sector's vocabulary (``sectors.SECTORS``: its entities, what they are
called, how their rows are named, how they refer to one another) × the archetypes' columns
(``archetypes``), in ``VARIANTS`` variants per sector.

Variant 0 holds every entity of the sector; the others drop one or two entities that are not
``core`` (an assignment goes with either of its parents) and each draws its own subset of the
archetypes' optional columns and row counts, so one sector gives several schemas that share a
vocabulary. The variants of a sector are one ``family``: a build keeps a family out of train
when dev or test use it. Everything is seeded by the sector's name and the variant: the
catalogue is the same in every build.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from progress_sql.data.domains.archetypes import ARCHETYPES, Role, Rule, label_column
from progress_sql.data.domains.spec import Column, DKRule, Domain, Table, category, key, ref, table

VARIANTS = 4  # composed domains per sector
_ATTR_SHARE = 0.65  # an archetype's optional columns a variant keeps
_MIN_VALUES = 2  # value columns every table keeps at least
_MAX_RULES = 3  # domain-knowledge rules per domain
_DROPS = (0, 1, 2, 1)  # entities variant k drops (variant 0: none)
_ROW_JITTER = (0.7, 1.3)  # a variant's row counts: the role's range times a factor in this range


@dataclass(frozen=True)
class Sector:
    """A vocabulary: its entities, parents before children."""

    name: str
    roles: tuple[Role, ...]


_FACTS = ("event", "transaction", "assignment", "work")  # the archetypes whose tables hold most rows


def compose(sector: Sector, k: int) -> Domain:
    """Variant ``k`` of ``sector``, named ``<sector>_<k + 1>`` (Spider's own db_id habit)."""
    if not any(r.core and r.archetype in _FACTS and r.parents for r in sector.roles):
        raise ValueError(f"sector {sector.name}: no core entity of {_FACTS} with a parent (its variants need rows)")
    rng = random.Random(f"compose:{sector.name}:{k}")
    roles = _kept_roles(sector, _DROPS[k % len(_DROPS)], rng)
    kept = {r.key for r in roles}
    tables: list[Table] = []
    rules: list[DKRule] = []
    for role in roles:
        t, role_rules = _table(role, kept, rng)
        tables.append(t)
        rules += role_rules
    chosen = sorted(rng.sample(range(len(rules)), min(len(rules), _MAX_RULES)))
    domain = Domain(f"{sector.name}_{k + 1}", tuple(tables), tuple(rules[i] for i in chosen), family=sector.name)
    domain.check()
    return domain


def _kept_roles(sector: Sector, drop: int, rng: random.Random) -> list[Role]:
    """The sector's roles less ``drop`` non-core ones (and those left without a parent: an
    assignment that loses either, another that loses all), keeping at least three tables joined
    by a foreign key; all of them when no draw fits."""
    optional = [r.key for r in sector.roles if not r.core]
    for _ in range(20):
        gone = set(rng.sample(optional, min(drop, len(optional))))
        for r in sector.roles:  # parents come first: an orphan's own children follow it
            lost = [link.parent in gone for link in r.parents]
            if lost and (all(lost) or (r.archetype == "assignment" and any(lost))):
                gone.add(r.key)
        kept = [r for r in sector.roles if r.key not in gone]
        keys = {r.key for r in kept}
        if len(kept) >= 3 and any(link.parent in keys for r in kept for link in r.parents):
            return kept
    return list(sector.roles)


def _table(role: Role, kept: set[str], rng: random.Random) -> tuple[Table, list[DKRule]]:
    arch = ARCHETYPES[role.archetype]
    links = [link for link in role.parents if link.parent in kept]
    refs: list[Column] = []
    for link in links:
        name = f"{link.role}_{link.parent}_id" if link.role else f"{link.parent}_id"
        twin = next((c.name for c in refs if c.ref == link.parent), "")
        refs.append(ref(name, link.parent, link.rel, differs_from=twin))
    linked = role.archetype == "assignment"
    cols: list[Column] = [] if linked else [key(f"{role.key}_id")]
    name_col = label_column(role) if arch.named or role.names is not None else None
    cols += [c for c in (name_col,) if c is not None] + refs
    if role.kinds:
        cols.append(_kind(role))
    usable = [a for a in arch.attrs if a.key not in role.skip]
    picked = [a for a in usable if rng.random() < _ATTR_SHARE]
    missing = [a for a in usable if a not in picked]
    picked += rng.sample(missing, max(0, min(len(missing), _MIN_VALUES - len(picked))))
    rules = []
    for attr in sorted(picked, key=usable.index):
        col = attr.make(role)
        if any(c.name == col.name for c in cols):
            continue
        cols.append(col)
        rule = attr.rule_for(role)
        if rule is not None:
            rules.append(_rule(role, col, rule))
    cols += [c for c in role.extras if all(c.name != o.name for o in cols)]
    lo, hi = role.rows or arch.rows
    scale = rng.uniform(*_ROW_JITTER)
    rows = (max(3, round(lo * scale)), max(4, round(hi * scale)))
    (singular, plural), *others = role.forms()
    pk = tuple(c.name for c in refs[:2]) if linked else None
    return table(role.key, singular, plural, rows, *cols, primary_key=pk, synonyms=tuple(others)), rules


def _kind(role: Role) -> Column:
    """The role's type column ("species", "genre"): its kinds, worded before the noun ("Equine clinics")."""
    name = role.kind_noun.replace(" ", "_").replace("-", "_")
    return category(name, role.kinds, role.kind_noun, synonyms=("kind",) if role.kind_noun != "kind" else ("sort",),
                    implicit={"=": "{v} {noun}"})


def _rule(role: Role, col: Column, rule: Rule) -> DKRule:
    value = f"'{rule.value}'" if isinstance(rule.value, str) else rule.value
    evidence = f"{rule.word} refers to {col.name} {rule.op} {value}"
    return DKRule(role.key, col.name, rule.op, rule.value, rule.phrase, evidence)


__all__ = ["Sector", "VARIANTS", "compose"]
