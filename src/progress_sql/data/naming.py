"""Names as real schemas spell them: a naming style drawn per database, and the measure of how
often a question names its tables.

A style (``NamingStyle``) says how words join (``CASES``: ``release_year``, ``releaseYear``,
``ReleaseYear``, ``RELEASE_YEAR``, ``Release_year``), whether table names carry a prefix
(``tbl_``, ``t_``) and are plural, how often a column carries its table's word
(``Song_release_year``), how often a word is abbreviated (``qty``, ``amt``, ``dt``, ``num``) and
whether primary keys are a bare ``id``. ``physical_names`` names each table and column of a
domain in a style. A table's name is built from one of its nouns, drawn per database (mostly
the first): that noun becomes the table's schema word, its other nouns its synonyms, so the
questions that use a synonym ("tracks" for ``tblSongs``) do not name the table.

Names stay plain identifiers (letters, digits, underscores; no SQL keyword, no function name):
a gold query never quotes one, and the ODT, which reads an unqualified double-quoted name as a
string (Spider's spelling of values), reads the gold as written.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Sequence

from progress_sql.corpus.schema import quote_identifier
from progress_sql.params import NAMING_CASES
from progress_sql.data.domains.spec import Domain, Table
from progress_sql.data.phrasing import mentions

CASES = NAMING_CASES  # the choices of data.naming_styles
PREFIXES = ("", "tbl", "t")
_PREFIX_WEIGHTS = (0.7, 0.2, 0.1)
ABBREVIATIONS = {
    "quantity": "qty", "amount": "amt", "date": "dt", "number": "num", "year": "yr", "description": "descr",
    "department": "dept", "category": "cat", "count": "cnt", "customer": "cust", "employee": "emp",
    "product": "prod", "address": "addr", "percent": "pct", "temperature": "temp", "reference": "ref",
    "location": "loc", "organisation": "org", "organization": "org", "manager": "mgr", "account": "acct",
    "transaction": "txn", "balance": "bal", "position": "pos", "capacity": "cap", "duration": "dur",
    "height": "ht", "weight": "wt", "rating": "rtg", "salary": "sal", "registration": "reg", "price": "prc",
    "total": "tot", "telephone": "tel", "phone": "ph", "experience": "exp", "attendance": "attnd",
    "population": "pop", "distance": "dist", "length": "len", "value": "val", "budget": "bdgt",
    "revenue": "rev", "status": "stat", "average": "avg", "maximum": "max", "minimum": "min",
    "student": "stu", "instructor": "instr", "professor": "prof", "application": "app", "vehicle": "veh",
    "insurance": "ins", "payment": "pmt", "invoice": "inv", "order": "ord", "building": "bldg",
    "identifier": "id", "member": "mbr", "company": "co", "country": "ctry",
    "certificate": "cert", "standard": "std", "minutes": "mins", "seconds": "secs", "kilograms": "kg",
    "kilometres": "km", "percentage": "pct", "score": "scr", "season": "ssn", "estimated": "est",
}
# Words a bare name must not be: SQLite reads them as functions or keywords in places.
_RISKY = frozenset(
    "abs avg count date datetime day glob group hour index key left length like lower max min month "
    "order replace right round substr sum time trim type upper value values year".split())
_PREFIX_WORDS = frozenset(("tbl", "t", "tb"))

# How styles are drawn (implementation constants).
_CANONICAL = 0.6  # tables named after their first noun, else after another of their nouns
_PLURAL_SHARE = 0.35
_BARE_ID_SHARE = 0.3
_COLUMN_PREFIX = (0.0, 0.0, 0.3, 1.0)  # share of a style's value columns that carry their table's word
_ABBREVIATE = (0.0, 0.0, 0.4, 0.8)  # share of a style's abbreviable words it abbreviates


@dataclass(frozen=True)
class NamingStyle:
    case: str  # one of CASES
    prefix: str = ""  # one of PREFIXES: tables only
    plural: bool = False  # table names in the plural
    column_prefix: float = 0.0
    abbreviate: float = 0.0
    bare_id: bool = False  # primary keys named "id"; foreign keys "<parent>_id"

    @property
    def label(self) -> str:
        """"pascal+tbl_+plural+table-prefixed+abbreviated+bare-id": the manifest's name of it."""
        parts = [self.case, f"{self.prefix}_" if self.prefix else "", "plural" if self.plural else "",
                 "table-prefixed" if self.column_prefix else "", "abbreviated" if self.abbreviate else "",
                 "bare-id" if self.bare_id else ""]
        return "+".join(p for p in parts if p)

    def join(self, words: Sequence[str]) -> str:
        """Words joined in the style's case ("id" is "ID" where words are capitalised)."""
        words = [w.lower() for w in words]

        def cap(w: str) -> str:
            return "ID" if w == "id" else w.capitalize()
        if self.case == "snake":
            return "_".join(words)
        if self.case == "upper":
            return "_".join(words).upper()
        if self.case == "camel":
            return words[0] + "".join("Id" if w == "id" else w.capitalize() for w in words[1:])
        if self.case == "pascal":
            return "".join(cap(w) for w in words)
        return "_".join([cap(words[0])] + ["ID" if w == "id" else w for w in words[1:]])  # capitalised

    def table(self, words: Sequence[str]) -> str:
        if not self.prefix:
            return self.join(words)
        if self.case in ("camel", "pascal"):
            return self.prefix + NamingStyle("pascal").join(words)  # tblRecordLabel
        joined = self.join(words)
        return f"{self.prefix.upper() if self.case == 'upper' else self.prefix}_{joined}"


def draw_style(rng: random.Random, cases: Sequence[str]) -> NamingStyle:
    """A naming style, its case one of ``cases`` (``data.naming_styles``)."""
    return NamingStyle(
        case=rng.choice(list(cases)),
        prefix=rng.choices(PREFIXES, _PREFIX_WEIGHTS)[0],
        plural=rng.random() < _PLURAL_SHARE,
        column_prefix=rng.choice(_COLUMN_PREFIX),
        abbreviate=rng.choice(_ABBREVIATE),
        bare_id=rng.random() < _BARE_ID_SHARE,
    )


# ----------------------------------------------------------------------------- naming a domain
Forms = tuple[tuple[str, str], ...]  # (singular, plural) nouns of a table


@dataclass
class Naming:
    """The names of one database: logical table → name, logical table → column → name, and
    per table its nouns with the one its name was built from first."""

    tables: dict[str, str] = field(default_factory=dict)
    columns: dict[str, dict[str, str]] = field(default_factory=dict)
    nouns: dict[str, Forms] = field(default_factory=dict)


def words_of(text: str) -> list[str]:
    """The words of a noun phrase or a snake_case name, lower-case ("record label" → record, label)."""
    return [w.lower() for w in re.findall(r"[A-Za-z0-9]+", text)]


def physical_names(domain: Domain, style: NamingStyle, rng: random.Random) -> Naming:
    """Every table and column of ``domain`` named in ``style`` (module notes)."""
    naming = Naming()
    heads: dict[str, list[str]] = {}  # logical table → the words its name was built from (singular)
    for t in domain.tables:
        forms = ((t.singular, t.plural), *t.synonyms)
        pick = 0 if len(forms) == 1 or rng.random() < _CANONICAL else rng.randrange(1, len(forms))
        naming.nouns[t.name] = (forms[pick], *(f for i, f in enumerate(forms) if i != pick))
        heads[t.name] = _abbreviated(words_of(forms[pick][0]), style, rng)
        words = _abbreviated(words_of(forms[pick][1]), style, rng) if style.plural else heads[t.name]
        taken = {n.lower() for n in naming.tables.values()}
        candidates = (style.table(words), style.table(words_of(t.name)), style.table(words_of(t.name) + ["data"]))
        naming.tables[t.name] = next(n for n in candidates if _usable(n, taken))
    for t in domain.tables:  # parents' keys are named before their children's references
        naming.columns[t.name] = _column_names(domain, t, style, rng, heads, naming)
    return naming


def _column_names(domain: Domain, t: Table, style: NamingStyle, rng: random.Random, heads: dict[str, list[str]],
                  naming: Naming) -> dict[str, str]:
    names: dict[str, str] = {}
    head = heads[t.name]
    for c in t.columns:
        if c.kind == "id":
            words = ["id"] if style.bare_id else head + ["id"]
        elif c.kind == "ref":
            words = _ref_words(domain, c.name, c.ref, style, heads, naming)
        else:
            words = _abbreviated(words_of(c.name), style, rng)
            if style.column_prefix and rng.random() < style.column_prefix and words[: len(head)] != head:
                words = head[-1:] + words
        taken = {n.lower() for n in names.values()}
        candidates = (style.join(words), style.join(head[-1:] + words), style.join(words_of(c.name)),
                      style.join(head + words_of(c.name)))
        names[c.name] = next((n for n in candidates if _usable(n, taken)), None) or _numbered(style, words, taken)
    return names


def _ref_words(domain: Domain, name: str, parent: str, style: NamingStyle, heads: dict[str, list[str]],
               naming: Naming) -> list[str]:
    """A foreign key named after its parent's key; one with a role of its own (``home_team_id``)
    keeps the role before the parent's word."""
    parent_key = domain.table(parent).primary_key[0]
    if name == parent_key:
        own = naming.columns[parent][parent_key]
        return heads[parent] + ["id"] if style.bare_id else words_of(_snake(own))
    words, key = words_of(name), words_of(parent_key)
    if words[-len(key):] == key and len(words) > len(key):
        return words[: -len(key)] + heads[parent] + ["id"]
    return words


def _snake(name: str) -> str:
    """A name in any case as snake_case words ("RecordLabelID" → record_label_id)."""
    return "_".join(split_words(name))


def _abbreviated(words: list[str], style: NamingStyle, rng: random.Random) -> list[str]:
    return [ABBREVIATIONS[w] if w in ABBREVIATIONS and style.abbreviate and rng.random() < style.abbreviate else w
            for w in words]


def _usable(name: str, taken: set[str]) -> bool:
    return bool(name) and quote_identifier(name) == name and name.lower() not in _RISKY and name.lower() not in taken


def _numbered(style: NamingStyle, words: list[str], taken: set[str]) -> str:
    k = 2
    while not _usable(style.join(words + [str(k)]), taken):
        k += 1
    return style.join(words + [str(k)])


# ----------------------------------------------------------------------------- reading names
def split_words(name: str) -> list[str]:
    """The words of an identifier, lower-case: ``tblRecordLabels`` → tbl, record, labels;
    ``Song_release_year`` → song, release, year; ``SINGER_ID`` → singer, id."""
    return [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", name)]


def natural_name(name: str) -> str:
    """Spider's readable name of an identifier (``column_names`` of tables.json): its words."""
    return " ".join(split_words(name))


def names_table(question: str, table: str) -> bool:
    """Whether ``question`` holds the name of ``table`` as words (its prefix dropped; singular or
    plural): "How many songs ..." names ``tblSong`` and ``SONGS``, not ``tracks``."""
    words = split_words(table)
    while len(words) > 1 and words[0] in _PREFIX_WORDS:
        words = words[1:]
    phrase = " ".join(words)
    return any(mentions(question, form) for form in {phrase, _singular(phrase)})


def _singular(phrase: str) -> str:
    head, _, last = phrase.rpartition(" ")
    if last.endswith("ies") and len(last) > 4:
        last = last[:-3] + "y"
    elif last.endswith(("ches", "shes", "xes", "sses")):
        last = last[:-2]
    elif last.endswith("s") and not last.endswith("ss"):
        last = last[:-1]
    return f"{head} {last}".strip()


__all__ = ["ABBREVIATIONS", "CASES", "Naming", "NamingStyle", "draw_style", "names_table", "natural_name",
           "physical_names", "split_words", "words_of"]
