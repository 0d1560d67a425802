"""Values as real databases hold them: text in one case, dates in a local format, stray spaces,
missing values (``data.messy_share`` of the databases).

A messy database gets, per column (``mess_up``): a text case kept by every row of a category
column (``fmt`` "upper" / "lower": ``ROCK``, ``rock``), a date format kept by every row of a date
column (``fmt`` "date:<name>": ``15/03/2021``, ``20210315``, ``Mar 15, 2021``), stray spaces or
another case on a share of a name column's rows (``noise``: `` John Smith``, ``JOHN SMITH``),
and NULLs in some value columns.

What stays answerable (the question names the values it filters on, and they are found):

- a format kept by a whole column is what the questions quote: "whose genre is ROCK", "on
  15/03/2021"; the gold compares with that stored text;
- a column with row noise is only filtered with ``LIKE '%word%'``, which ignores ASCII case and
  stray spaces in SQLite; never with ``=``, ``IN`` or a ``LIKE 'word%'`` prefix;
- a date format that does not sort as text (day or month first, month names) is only compared
  with ``=``; the sortable ones (ISO, ``2021/03/15``, ``20210315``, timestamps) with ranges too.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import date, datetime, timedelta

from progress_sql.data.domains.spec import Column, Domain, Table

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
# Date formats: name → (strftime pattern, whether the text sorts as the dates do). "long" is
# "Mar 15, 2021", written by hand below (strftime's month names follow the C locale).
DATE_FORMATS = {
    "iso": ("%Y-%m-%d", True),
    "slash": ("%Y/%m/%d", True),
    "compact": ("%Y%m%d", True),
    "stamp": ("%Y-%m-%d %H:%M:%S", True),
    "dmy": ("%d/%m/%Y", False),
    "mdy": ("%m/%d/%Y", False),
    "long": ("", False),
}
CASES = ("upper", "lower")
_SORTED_OPS = ("=", "!=", "IS NULL", "IS NOT NULL")  # what a date format that does not sort allows
_NOISY_OPS = ("LIKE", "IS NULL", "IS NOT NULL")  # what a column with row noise allows

# How a messy database is messed up (implementation constants, like generate_db's skew).
_CASE_SHARE = 0.5  # category columns stored in one case
_DATE_SHARE = 0.6  # date columns stored in a format other than ISO
_LABEL_NOISE = 0.15  # name rows with stray spaces or another case
_EXTRA_NOISE = 0.3  # distractor text rows likewise
_NULL_SHARE = 0.3  # value columns that get NULLs ...
_NULLS = 0.08  # ... in this share of their rows


# ----------------------------------------------------------------------------- storing values
def store(col: Column, value: object, rng: random.Random) -> object:
    """``value`` as the database holds it: the column's format, then its row noise."""
    if value is None or not isinstance(value, str):
        return value
    if col.fmt in CASES:
        value = value.upper() if col.fmt == "upper" else value.lower()
    elif col.fmt.startswith("date:"):
        value = format_date(date.fromisoformat(value), col.fmt, rng.randrange(86_400))
    if col.noise and rng.random() < col.noise:
        value = _noisy(value, rng)
    return value


def _noisy(text: str, rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return " " + text
    if kind == 1:
        return text + " "
    if kind == 2:
        return f" {text}  "
    return text.lower() if kind == 3 else text.upper()


def format_date(day: date, fmt: str, seconds: int = 0) -> str:
    """``day`` in the date format ``fmt`` ("date:<name>"); a timestamp's time is ``seconds``
    after midnight."""
    name = fmt.split(":", 1)[1]
    if name == "long":
        return f"{_MONTHS[day.month - 1]} {day.day:02d}, {day.year}"
    moment = datetime(day.year, day.month, day.day) + timedelta(seconds=seconds)
    return moment.strftime(DATE_FORMATS[name][0])


def parse_date(text: str, fmt: str) -> datetime:
    """The moment a date text of format ``fmt`` ("" or "date:<name>") holds."""
    name = fmt.split(":", 1)[1] if fmt.startswith("date:") else "iso"
    if name == "long":
        month, day, year = text.replace(",", "").split()
        return datetime(int(year), _MONTHS.index(month) + 1, int(day))
    return datetime.strptime(text, DATE_FORMATS[name][0])


def shift_date(col: Column, text: str, days: int) -> str:
    """A date text of ``col`` moved by ``days``, in the column's format (its time kept)."""
    moment = parse_date(text.strip(), col.fmt) + timedelta(days=days)
    if not col.fmt.startswith("date:"):
        return moment.date().isoformat()
    midnight = datetime(moment.year, moment.month, moment.day)
    return format_date(moment.date(), col.fmt, int((moment - midnight).total_seconds()))


# ----------------------------------------------------------------------------- what a query may ask
def sorts(col: Column) -> bool:
    """Whether the column's stored text orders as its values do (ranges make sense)."""
    return not col.fmt.startswith("date:") or DATE_FORMATS[col.fmt.split(":", 1)[1]][1]


def allows(col: Column, op: str) -> bool:
    """Whether a gold query may filter ``col`` with ``op`` and stay answerable (module notes)."""
    if col.noise:
        return op in _NOISY_OPS
    if not sorts(col):
        return op in _SORTED_OPS
    return True


# ----------------------------------------------------------------------------- which columns
def mess_up(domain: Domain, rng: random.Random) -> Domain:
    """``domain`` with the mess of a messy database drawn per column (module notes)."""
    tables = tuple(replace(t, columns=tuple(_messy(domain, t, c, rng) for c in t.columns)) for t in domain.tables)
    return replace(domain, tables=tables)


def _messy(domain: Domain, table: Table, col: Column, rng: random.Random) -> Column:
    if col.kind == "label":
        return replace(col, noise=_LABEL_NOISE)
    if col.kind == "extra":
        return replace(col, noise=_EXTRA_NOISE) if col.sqltype == "TEXT" and col.fmt == "" else col
    if col.kind not in ("category", "number", "year", "date") or col.name in table.primary_key:
        return col
    changes: dict[str, object] = {}
    if not col.nulls and rng.random() < _NULL_SHARE:
        changes["nulls"] = _NULLS
    ruled = domain.dk_rule(table.name, col.name) is not None
    texts = col.kind == "category" and all(isinstance(v, str) for v in getattr(col.gen, "values", (1,)))
    if texts and not ruled and rng.random() < _CASE_SHARE:
        changes["fmt"] = rng.choice(CASES)
    if col.kind == "date" and rng.random() < _DATE_SHARE:
        changes["fmt"] = "date:" + rng.choice([f for f in DATE_FORMATS if f != "iso"])
    return replace(col, **changes) if changes else col


__all__ = ["CASES", "DATE_FORMATS", "allows", "format_date", "mess_up", "parse_date", "shift_date", "sorts",
           "store"]
