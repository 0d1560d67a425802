"""The declarative form of a bundled domain: tables, columns, how values are drawn and how a
question names things.

A domain module only declares; ``generate_db`` draws the rows, ``phrasing`` turns the nouns,
synonyms and templates into questions. Templates hold ``{noun}`` (the noun phrase being
built, e.g. "patients") and ``{v}`` (the rendered value), so "elderly {noun}" and
"{noun} older than {v}" compose left to right.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, Mapping

from progress_sql.data.domains import vocab

# Column kinds: how a column may be used by the SQL patterns.
#   id: primary key; ref: foreign key; label: the human name of a row (name, title);
#   category: a few distinct text values; number: a measure; year: an integer year;
#   date: date text (ISO unless the column's ``fmt`` says otherwise); flag: 0/1;
#   extra: a distractor the questions never ask about (audit columns, look-alikes, loose codes).
KINDS = ("id", "ref", "label", "category", "number", "year", "date", "flag", "extra")


# ----------------------------------------------------------------------------- value generators
@dataclass(frozen=True)
class Choice:
    """One of ``values``, optionally weighted."""

    values: tuple
    weights: tuple | None = None

    def draw(self, rng: random.Random, row: Mapping[str, Any]) -> Any:
        if self.weights:
            return rng.choices(self.values, self.weights)[0]
        return rng.choice(self.values)


@dataclass(frozen=True)
class Number:
    """A number in [lo, hi]: uniform, normal (mean/sd) or log-normal (median/sigma), rounded
    to ``decimals`` places and then to a multiple of ``step`` when given."""

    lo: float
    hi: float
    dist: str = "uniform"  # uniform | normal | lognormal
    centre: float = 0.0  # mean (normal) or median (lognormal)
    spread: float = 0.0  # sd (normal) or sigma (lognormal)
    decimals: int = 0
    step: float = 0.0

    def draw(self, rng: random.Random, row: Mapping[str, Any]) -> Any:
        if self.dist == "normal":
            x = rng.gauss(self.centre, self.spread)
        elif self.dist == "lognormal":
            x = rng.lognormvariate(0.0, self.spread) * self.centre
        else:
            x = rng.uniform(self.lo, self.hi)
        x = min(self.hi, max(self.lo, x))
        if self.step:
            x = round(x / self.step) * self.step
        return int(round(x)) if self.decimals == 0 else round(x, self.decimals)


@dataclass(frozen=True)
class Dates:
    """An ISO date between ``start`` and ``end`` (inclusive)."""

    start: str
    end: str

    def draw(self, rng: random.Random, row: Mapping[str, Any]) -> Any:
        a, b = date.fromisoformat(self.start), date.fromisoformat(self.end)
        return (a + timedelta(days=rng.randint(0, (b - a).days))).isoformat()


@dataclass(frozen=True)
class After:
    """An ISO date ``lo``..``hi`` days after another date column of the same row."""

    column: str
    lo: int
    hi: int

    def draw(self, rng: random.Random, row: Mapping[str, Any]) -> Any:
        base = row.get(self.column)
        if base is None:
            return None
        return (date.fromisoformat(base) + timedelta(days=rng.randint(self.lo, self.hi))).isoformat()


@dataclass(frozen=True)
class Compose:
    """One word from each part, joined by ``sep``; an empty word is skipped."""

    parts: tuple[tuple[str, ...], ...]
    sep: str = " "

    def draw(self, rng: random.Random, row: Mapping[str, Any]) -> Any:
        return self.sep.join(w for w in (rng.choice(p) for p in self.parts) if w)


@dataclass(frozen=True)
class Person:
    """A first and last name."""

    def draw(self, rng: random.Random, row: Mapping[str, Any]) -> Any:
        return f"{rng.choice(vocab.FIRST_NAMES)} {rng.choice(vocab.LAST_NAMES)}"


@dataclass(frozen=True)
class Code:
    """A code from a format: ``#`` a digit, ``@`` an upper-case letter, anything else kept."""

    fmt: str

    def draw(self, rng: random.Random, row: Mapping[str, Any]) -> Any:
        out = []
        for ch in self.fmt:
            if ch == "#":
                out.append(str(rng.randint(0, 9)))
            elif ch == "@":
                out.append(chr(ord("A") + rng.randint(0, 25)))
            else:
                out.append(ch)
        return "".join(out)


@dataclass(frozen=True)
class Unique:
    """Distinct values, one per row (a table using it has at most len(values) rows)."""

    values: tuple[str, ...]

    def draw(self, rng: random.Random, row: Mapping[str, Any]) -> Any:  # pragma: no cover
        raise TypeError("Unique values are drawn for the whole column by generate_db")


Gen = Choice | Number | Dates | After | Compose | Person | Code | Unique


# ----------------------------------------------------------------------------- schema
@dataclass(frozen=True)
class Column:
    name: str
    sqltype: str  # INTEGER | REAL | TEXT
    kind: str  # one of KINDS
    noun: str  # how a question names the column: "age", "release year"
    gen: Gen | None = None  # None for id and ref columns (filled by the generator)
    synonyms: tuple[str, ...] = ()  # other words for the noun (the Syn variant)
    nulls: float = 0.0  # share of NULL values
    # Realistic phrasing per operator, naming no column: {"<": "{noun} younger than {v}"}.
    implicit: Mapping[str, str] = field(default_factory=dict)
    quote: bool = False  # values are quoted in questions (titles)
    additive: bool = False  # SUM(...) makes sense (amounts, counts), not for ages or ratings
    ref: str = ""  # parent table of a foreign key
    rel: str = ""  # phrase from child to parent: "students *in* departments ..."
    differs_from: str = ""  # a ref column whose value this ref never repeats (home vs away)
    # How values are stored (data.mess): a text case ("upper", "lower") or a date format
    # ("date:dmy", ...) kept by every row; "" as drawn.
    fmt: str = ""
    noise: float = 0.0  # share of rows whose text gets stray spaces or another case (data.mess)


@dataclass(frozen=True)
class Table:
    name: str
    singular: str
    plural: str
    rows: tuple[int, int]  # row count range before data.rows_scale
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    synonyms: tuple[tuple[str, str], ...] = ()  # (singular, plural) pairs
    distractor: bool = False  # in the schema, never asked about (an archive, a log)

    def column(self, name: str) -> Column:
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(f"{self.name} has no column {name}")

    @property
    def label(self) -> Column | None:
        """The column that names a row (name, title), if the table has one."""
        return next((c for c in self.columns if c.kind == "label"), None)

    @property
    def foreign_keys(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.kind == "ref")


@dataclass(frozen=True)
class DKRule:
    """Domain knowledge: a phrase that stands for a condition ("elderly" for age >= 65)."""

    table: str
    column: str
    op: str
    value: Any
    phrase: str  # template with {noun}: "elderly {noun}", "{noun} that are out of stock"
    evidence: str  # BIRD-style definition: "elderly refers to age >= 65"


@dataclass(frozen=True)
class Domain:
    name: str
    tables: tuple[Table, ...]
    dk_rules: tuple[DKRule, ...] = ()
    # The domains one vocabulary gave (composed variants): a build keeps a family out of train
    # when dev or test use it. "": the domain is its own family.
    family: str = ""
    # How often a question uses the noun a name was built from, rather than a synonym or an
    # implicit wording (data.schema_word_share; 1.0 in the catalogue: the schema's own words).
    schema_word_share: float = 1.0
    style: str = ""  # the naming style of a database's names (data.naming), "" in the catalogue
    messy: bool = False  # a database whose values were messed up (data.mess)

    @property
    def family_name(self) -> str:
        return self.family or self.name

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"domain {self.name} has no table {name}")

    def dk_rule(self, table: str, column: str) -> DKRule | None:
        return next((r for r in self.dk_rules if r.table == table and r.column == column), None)

    def check(self) -> None:
        """Raise ValueError when the declaration is inconsistent (caught by the tests)."""
        names = [t.name.lower() for t in self.tables]  # SQLite's names ignore case
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate table names")
        asked = [t for t in self.tables if not t.distractor]
        if not 3 <= len(asked) <= 8:
            raise ValueError(f"{self.name}: {len(asked)} tables asked about, expected 3 to 8")
        for i, t in enumerate(self.tables):
            cols = [c.name.lower() for c in t.columns]
            if len(set(cols)) != len(cols):
                raise ValueError(f"{self.name}.{t.name}: duplicate columns")
            for key in t.primary_key:
                t.column(key)
            for c in t.columns:
                if c.kind not in KINDS:
                    raise ValueError(f"{self.name}.{t.name}.{c.name}: unknown kind {c.kind}")
                if c.kind == "ref":
                    parents = [p.name for p in self.tables[:i]]
                    if c.ref not in parents:
                        raise ValueError(f"{self.name}.{t.name}.{c.name}: parent {c.ref} must be declared before")
                    if len(self.table(c.ref).primary_key) != 1:
                        raise ValueError(f"{self.name}.{t.name}.{c.name}: parent needs a one-column key")
                elif c.kind != "id" and c.gen is None:
                    raise ValueError(f"{self.name}.{t.name}.{c.name}: no generator")
        for r in self.dk_rules:
            col = self.table(r.table).column(r.column)
            if col.kind in ("id", "ref", "label", "extra"):
                raise ValueError(f"{self.name}: DK rule on {r.table}.{r.column} must be on a value column")


# ----------------------------------------------------------------------------- constructors
def key(name: str, noun: str = "id") -> Column:
    """An integer primary key numbered 1..n."""
    return Column(name, "INTEGER", "id", noun)


def ref(name: str, parent: str, rel: str, differs_from: str = "") -> Column:
    """A foreign key to ``parent``'s primary key; ``rel`` reads child → parent."""
    return Column(name, "INTEGER", "ref", parent, ref=parent, rel=rel, differs_from=differs_from)


def label(name: str, gen: Gen, noun: str = "name", synonyms: tuple[str, ...] = (), quote: bool = False) -> Column:
    return Column(name, "TEXT", "label", noun, gen, synonyms, quote=quote)


def category(name: str, values: tuple[str, ...], noun: str, weights: tuple | None = None,
             synonyms: tuple[str, ...] = (), implicit: Mapping[str, str] | None = None,
             nulls: float = 0.0) -> Column:
    return Column(name, "TEXT", "category", noun, Choice(values, weights), synonyms, nulls, implicit or {})


def number(name: str, gen: Number, noun: str, synonyms: tuple[str, ...] = (),
           implicit: Mapping[str, str] | None = None, nulls: float = 0.0, additive: bool = False) -> Column:
    sqltype = "INTEGER" if gen.decimals == 0 else "REAL"
    return Column(name, sqltype, "number", noun, gen, synonyms, nulls, implicit or {}, additive=additive)


def year(name: str, lo: int, hi: int, noun: str, synonyms: tuple[str, ...] = (),
         implicit: Mapping[str, str] | None = None, nulls: float = 0.0) -> Column:
    return Column(name, "INTEGER", "year", noun, Number(lo, hi), synonyms, nulls, implicit or {})


def day(name: str, gen: Dates | After, noun: str, synonyms: tuple[str, ...] = (),
        implicit: Mapping[str, str] | None = None, nulls: float = 0.0) -> Column:
    return Column(name, "TEXT", "date", noun, gen, synonyms, nulls, implicit or {})


def flag(name: str, share: float, noun: str, synonyms: tuple[str, ...] = ()) -> Column:
    return Column(name, "INTEGER", "flag", noun, Choice((1, 0), (share, 1.0 - share)), synonyms)


def extra(name: str, gen: Gen, noun: str, sqltype: str = "TEXT", nulls: float = 0.0) -> Column:
    """A distractor column: in the schema and the data, never in a question."""
    return Column(name, sqltype, "extra", noun, gen, nulls=nulls)


def attr(name: str, gen: Gen, noun: str, synonyms: tuple[str, ...] = (), nulls: float = 0.0,
         implicit: Mapping[str, str] | None = None) -> Column:
    """A text column with many distinct values that is not the row's name (email, code)."""
    return Column(name, "TEXT", "category", noun, gen, synonyms, nulls, implicit or {})


def table(name: str, singular: str, plural: str, rows: tuple[int, int], *columns: Column,
          primary_key: tuple[str, ...] | None = None,
          synonyms: tuple[tuple[str, str], ...] = (), distractor: bool = False) -> Table:
    pk = primary_key or tuple(c.name for c in columns if c.kind == "id")[:1]
    return Table(name, singular, plural, rows, tuple(columns), pk, synonyms, distractor)


def age_phrases(noun_word: str = "{noun}") -> dict[str, str]:
    """Realistic phrasing of an age column."""
    return {
        ">": f"{noun_word} older than {{v}}", "<": f"{noun_word} younger than {{v}}",
        ">=": f"{noun_word} aged {{v}} or older", "<=": f"{noun_word} aged {{v}} or younger",
        "=": f"{noun_word} aged {{v}}", "BETWEEN": f"{noun_word} aged between {{a}} and {{b}}",
    }


def when_phrases(verb: str) -> dict[str, str]:
    """Realistic phrasing of a year or date column: "{noun} founded after {v}"."""
    return {
        ">": f"{{noun}} {verb} after {{v}}", "<": f"{{noun}} {verb} before {{v}}",
        "=": f"{{noun}} {verb} in {{v}}", ">=": f"{{noun}} {verb} in or after {{v}}",
        "<=": f"{{noun}} {verb} in or before {{v}}",
        "BETWEEN": f"{{noun}} {verb} between {{a}} and {{b}}",
    }


def place_phrases(prep: str = "from") -> dict[str, str]:
    """Realistic phrasing of a city or country column: "{noun} from {v}"."""
    return {"=": f"{{noun}} {prep} {{v}}", "IN": f"{{noun}} {prep} {{v}}",
            "!=": f"{{noun}} not {prep} {{v}}"}
