"""Entity archetypes: the parts composed domains are built from (``domains.compose``).

An archetype (a person, a staff member, an organisation, a site, a product, a creative work,
an event, a transaction, an assignment) holds the columns such entities carry in real
databases, each with its nouns, synonyms, implicit wordings and, where one reads naturally, a
domain-knowledge rule ("senior" for age >= 65). A sector's ``Role`` says which archetype an
entity is, what it is called, how its rows are named, the values of its type column and which
entities it refers to; ``compose`` picks, per domain, which of the archetype's columns it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from progress_sql.data.domains import vocab
from progress_sql.data.domains.renaming import plural
from progress_sql.data.domains.spec import (
    Code, Column, Dates, Gen, Number, Person, age_phrases, attr, category, day, label, number,
    place_phrases, when_phrases, year,
)


@dataclass(frozen=True)
class Link:
    """A foreign key of a role: to ``parent``, read child → parent as ``rel`` ("owned by"); a
    ``role`` names it when two keys point at one parent ("home", "away")."""

    parent: str
    rel: str
    role: str = ""


@dataclass(frozen=True)
class Money:
    """The range of a role's amounts (prices, fees, totals): uniform bounds and a median."""

    lo: float
    hi: float
    median: float


@dataclass(frozen=True)
class Role:
    """One entity of a sector. ``nouns``: "pet" or "person|people", the first the canonical."""

    key: str  # its logical table name
    archetype: str  # a key of ARCHETYPES
    nouns: tuple[str, ...]
    names: Gen | None = None  # how a row is named (None: the archetype's default, or no name)
    kinds: tuple[str, ...] = ()  # values of its type column (none: no type column)
    kind_noun: str = "type"
    parents: tuple[Link, ...] = ()
    rows: tuple[int, int] | None = None
    money: Money | None = None
    verb: str = ""  # how its date reads: "held", "placed" (the archetype's by default)
    extras: tuple[Column, ...] = ()  # the sector's own value columns
    skip: tuple[str, ...] = ()  # archetype columns that make no sense for it ("stock" of a pet)
    core: bool = False  # kept by every composed variant

    def forms(self) -> tuple[tuple[str, str], ...]:
        """(singular, plural) of each noun; a regular plural unless given ("person|people")."""
        out = []
        for noun in self.nouns:
            singular, _, given = noun.partition("|")
            head, _, last = singular.rpartition(" ")
            out.append((singular, given or f"{head} {plural(last)}".strip()))
        return tuple(out)


@dataclass(frozen=True)
class Rule:
    """A domain-knowledge rule of an attribute: ``column op value`` read as ``phrase``."""

    op: str
    value: object
    phrase: str  # "senior {noun}"
    word: str  # what the evidence defines: "senior"


@dataclass(frozen=True)
class Attr:
    """An optional column of an archetype: the column itself, or how a role makes it (its money
    range, its verb); ``rule`` its domain-knowledge rule, if any (made for the role likewise)."""

    column: Column | Callable[[Role], Column]
    rule: Rule | Callable[[Role], Rule] | None = None
    name: str = ""  # what a role's ``skip`` names: the column's name (given when ``column`` is made)

    def make(self, role: Role) -> Column:
        return self.column if isinstance(self.column, Column) else self.column(role)

    def rule_for(self, role: Role) -> Rule | None:
        return self.rule if self.rule is None or isinstance(self.rule, Rule) else self.rule(role)

    @property
    def key(self) -> str:
        return self.name or self.column.name  # type: ignore[union-attr]


@dataclass(frozen=True)
class Archetype:
    rows: tuple[int, int]
    attrs: tuple[Attr, ...]
    named: bool = True  # rows carry a name column
    verb: str = ""  # how its date reads ("{noun} held after {v}")


_PRICE = Money(2, 900, 40)
_AMOUNT = Money(5, 5_000, 120)
_COSTING = {">": "{noun} costing more than {v}", "<": "{noun} costing less than {v}"}


def _price(name: str, noun: str, synonyms: tuple[str, ...], default: Money) -> Callable[[Role], Column]:
    def make(role: Role) -> Column:
        m = role.money or default
        return number(name, Number(m.lo, m.hi, "lognormal", m.median, 0.9, decimals=2), noun, synonyms=synonyms,
                      implicit=_COSTING)
    return make


def _amount(role: Role) -> Column:
    m = role.money or _AMOUNT
    return number("amount", Number(m.lo, m.hi, "lognormal", m.median, 1.0, decimals=2), "amount",
                  synonyms=("total", "sum"), additive=True)


def _above_median(times: float, phrase: str, word: str, default: Money) -> Callable[[Role], Rule]:
    """A rule on an amount: at least ``times`` the role's median."""
    return lambda role: Rule(">=", round((role.money or default).median * times), phrase, word)


def _date(name: str, noun: str, synonyms: tuple[str, ...], start: str, end: str) -> Callable[[Role], Column]:
    def make(role: Role) -> Column:
        verb = role.verb or ARCHETYPES[role.archetype].verb
        return day(name, Dates(start, end), noun, synonyms=synonyms, implicit=when_phrases(verb))
    return make


_CITY = Attr(category("city", vocab.CITIES, "city", synonyms=("town",), implicit=place_phrases()))
_COUNTRY = Attr(category("country", vocab.COUNTRIES, "country", synonyms=("nation",), implicit=place_phrases()))
_RATING = Attr(number("rating", Number(1.0, 5.0, "normal", 3.8, 0.7, decimals=1), "rating",
                      synonyms=("score", "review score")),
               Rule(">=", 4.5, "top-rated {noun}", "top-rated"))
_FOUNDED = year("founded_year", 1850, 2022, "founding year", synonyms=("year founded",),
                implicit=when_phrases("founded"))

ARCHETYPES: dict[str, Archetype] = {
    "person": Archetype((80, 300), (
        Attr(number("age", Number(16, 90, "normal", 41, 15), "age", implicit=age_phrases()),
             Rule(">=", 65, "senior {noun}", "senior")),
        Attr(category("gender", ("F", "M"), "gender", synonyms=("sex",))),
        _CITY, _COUNTRY,
        Attr(_date("joined_date", "joining date", ("sign-up date", "registration date"), "2012-01-01", "2024-12-31"),
             name="joined_date"),
        Attr(year("birth_year", 1940, 2008, "birth year", synonyms=("year of birth",), implicit=when_phrases("born"))),
        Attr(attr("phone", Code("555-####"), "phone number", synonyms=("telephone number",))),
        Attr(number("loyalty_points", Number(0, 20_000, "lognormal", 900, 1.2), "loyalty points",
                    synonyms=("reward points",), additive=True),
             Rule(">=", 10_000, "{noun} with elite status", "elite status")),
    ), verb="joined"),
    "staff": Archetype((20, 120), (
        Attr(number("salary", Number(22_000, 190_000, "normal", 58_000, 24_000, step=500), "salary",
                    synonyms=("pay", "wage"), additive=True,
                    implicit={">": "{noun} earning more than {v}", "<": "{noun} earning less than {v}"}),
             Rule(">=", 100_000, "six-figure {noun}", "six-figure")),
        Attr(year("hire_year", 1990, 2024, "hiring year", synonyms=("year hired", "start year"),
                  implicit=when_phrases("hired")),
             Rule(">=", 2023, "newly hired {noun}", "newly hired")),
        Attr(number("years_experience", Number(0, 40, "lognormal", 8, 0.7), "years of experience",
                    synonyms=("experience",)),
             Rule("<", 2, "junior {noun}", "junior")),
        Attr(number("age", Number(19, 70, "normal", 40, 11), "age", implicit=age_phrases())),
        _CITY,
        Attr(category("contract", ("Full-time", "Part-time", "Contractor"), "contract type", (6, 3, 1),
                      synonyms=("employment type",))),
    ), verb="hired"),
    "organisation": Archetype((8, 30), (
        _CITY, _COUNTRY,
        Attr(_FOUNDED, Rule("<", 1950, "long-established {noun}", "long-established")),
        Attr(number("employees", Number(3, 8_000, "lognormal", 120, 1.3), "number of employees",
                    synonyms=("headcount", "staff count"), additive=True),
             Rule(">=", 1_000, "large {noun}", "large")),
        Attr(number("annual_revenue", Number(50_000, 900_000_000, "lognormal", 4_000_000, 1.5, step=1_000),
                    "annual revenue", synonyms=("turnover",), additive=True)),
        _RATING,
    ), verb="founded"),
    "group": Archetype((6, 30), (
        _CITY,
        Attr(_FOUNDED, Rule("<", 1980, "long-standing {noun}", "long-standing")),
        Attr(number("members", Number(3, 400, "lognormal", 25, 0.9), "number of members",
                    synonyms=("membership", "size"), additive=True),
             Rule(">=", 100, "large {noun}", "large")),
        Attr(number("budget", Number(500, 2_000_000, "lognormal", 40_000, 1.2, step=100), "budget",
                    synonyms=("funding",), additive=True)),
        _RATING,
    ), verb="founded"),
    "area": Archetype((5, 12), (
        Attr(number("population", Number(2_000, 3_000_000, "lognormal", 90_000, 1.2, step=100), "population",
                    synonyms=("number of residents",), additive=True),
             Rule(">=", 500_000, "densely populated {noun}", "densely populated")),
        Attr(number("area_km2", Number(5, 40_000, "lognormal", 600, 1.3, decimals=1), "area",
                    synonyms=("size in square kilometres", "land area"))),
        Attr(number("avg_income", Number(12_000, 90_000, "normal", 38_000, 11_000, step=100), "average income",
                    synonyms=("mean income",))),
    )),
    "site": Archetype((8, 40), (
        _CITY,
        Attr(number("capacity", Number(10, 6_000, "lognormal", 250, 1.1), "capacity",
                    synonyms=("size", "maximum occupancy"), additive=True),
             Rule(">=", 1_000, "large-capacity {noun}", "large-capacity")),
        Attr(year("opened_year", 1880, 2024, "opening year", synonyms=("year opened",), implicit=when_phrases("opened")),
             Rule("<", 1950, "historic {noun}", "historic")),
        Attr(number("floor_area", Number(50, 20_000, "lognormal", 900, 0.9), "floor area", synonyms=("area",))),
        Attr(attr("postcode", Code("@@# #@@"), "postcode", synonyms=("postal code", "zip code"))),
    ), verb="opened"),
    "product": Archetype((40, 200), (
        Attr(_price("price", "price", ("cost",), _PRICE), _above_median(4, "premium {noun}", "premium", _PRICE),
             name="price"),
        Attr(number("stock", Number(0, 500, "lognormal", 40, 1.2), "stock level",
                    synonyms=("quantity in stock", "units in stock"), additive=True),
             Rule("=", 0, "{noun} that are out of stock", "out of stock")),
        Attr(number("weight_kg", Number(0.1, 80, "lognormal", 2.5, 1.0, decimals=1), "weight", synonyms=("mass",))),
        _RATING,
        Attr(year("release_year", 1995, 2024, "release year", synonyms=("year of release", "launch year"),
                  implicit=when_phrases("released"))),
        Attr(category("colour", ("Black", "White", "Red", "Blue", "Green", "Grey", "Silver"), "colour",
                      synonyms=("color",), implicit={"=": "{v} {noun}"})),
    ), verb="released"),
    "work": Archetype((60, 300), (
        Attr(year("release_year", 1950, 2024, "release year", synonyms=("year of release",),
                  implicit=when_phrases("released")),
             Rule("<", 1980, "classic {noun}", "classic")),
        Attr(number("length_min", Number(5, 240, "normal", 70, 35), "length in minutes", synonyms=("running time",)),
             Rule(">", 150, "epic {noun}", "epic")),
        _RATING,
        Attr(category("language", ("English", "Spanish", "French", "German", "Japanese", "Korean", "Italian"),
                      "language", (8, 3, 2, 2, 1, 1, 1), synonyms=("original language",),
                      implicit={"=": "{v}-language {noun}"})),
        Attr(number("copies_sold", Number(100, 5_000_000, "lognormal", 20_000, 1.6, step=100), "copies sold",
                    synonyms=("sales",), additive=True),
             Rule(">=", 1_000_000, "million-selling {noun}", "million-selling")),
    ), verb="released"),
    "event": Archetype((200, 900), (
        Attr(_date("event_date", "date", ("day",), "2019-01-01", "2024-12-31"), name="event_date"),
        Attr(number("duration_min", Number(10, 300, "normal", 75, 40), "duration in minutes", synonyms=("length",),
                    implicit={">": "{noun} lasting more than {v} minutes", "<": "{noun} lasting less than {v} minutes"}),
             Rule(">", 180, "marathon {noun}", "marathon")),
        Attr(number("attendance", Number(1, 5_000, "lognormal", 60, 1.2), "attendance",
                    synonyms=("turnout", "number of attendees"), additive=True),
             Rule(">=", 1_000, "packed {noun}", "packed")),
        Attr(category("status", ("Scheduled", "Completed", "Cancelled", "Postponed"), "status", (3, 8, 1, 1),
                      synonyms=("state",)),
             Rule("=", "Cancelled", "{noun} that were called off", "called off")),
        Attr(_price("fee", "fee", ("charge", "cost"), Money(0, 400, 35)), name="fee"),
        Attr(number("score", Number(0, 100, "normal", 68, 15), "score", synonyms=("result", "mark"))),
    ), named=False, verb="held"),
    "transaction": Archetype((300, 1200), (
        Attr(_date("txn_date", "date", ("transaction date",), "2020-01-01", "2024-12-31"), name="txn_date"),
        Attr(_amount, _above_median(10, "large {noun}", "large", _AMOUNT), name="amount"),
        Attr(number("quantity", Number(1, 25, "lognormal", 2, 0.8), "quantity", synonyms=("number of units",),
                    additive=True),
             Rule(">=", 10, "bulk {noun}", "bulk")),
        Attr(category("status", ("Paid", "Pending", "Refunded", "Cancelled"), "status", (10, 3, 1, 1),
                      synonyms=("state",))),
        Attr(category("payment_method", ("Card", "Cash", "Bank Transfer", "Voucher", "Mobile"), "payment method",
                      (6, 2, 2, 1, 3), synonyms=("payment type",))),
        Attr(number("discount_pct", Number(0, 40, "lognormal", 8, 0.8), "discount percentage", synonyms=("discount",),
                    nulls=0.3)),
    ), named=False, verb="made"),
    "assignment": Archetype((100, 500), (
        Attr(_date("start_date", "start date", ("starting date",), "2015-01-01", "2024-12-31"), name="start_date"),
        Attr(number("weekly_hours", Number(1, 45, "normal", 18, 10), "weekly hours", synonyms=("hours per week",)),
             Rule(">=", 35, "full-time {noun}", "full-time")),
        Attr(number("share_pct", Number(1, 100), "share percentage", synonyms=("share",))),
    ), named=False, verb="started"),
}


def label_column(role: Role) -> Column | None:
    """The name column of a role: its own names, a person's name, or none (events)."""
    if role.names is not None:
        quote = role.archetype == "work"
        return label("title" if quote else "name", role.names, "title" if quote else "name", quote=quote)
    if role.archetype in ("person", "staff"):
        return label("name", Person(), synonyms=("full name",))
    return None


__all__ = ["ARCHETYPES", "Archetype", "Attr", "Link", "Money", "Role", "Rule", "label_column"]
