"""Words for questions: table and column nouns, conditions, noun phrases along join paths.

One ``Phraser`` renders one question in one style:

- ``plain``: a table's or column's schema word (the noun its name was built from) a
  ``schema_word_share`` of the time, else one of its synonyms or, where the catalogue knows
  one, an implicit wording ("students older than 20"); explicit column mentions otherwise
  ("students whose age is above 20"). The catalogue's own domains have a share of 1: the
  schema's nouns, as Spider's questions are mostly written;
- ``syn``: each table and column noun replaced by another synonym than the plain question's,
  where it has one ("pupils whose age is above 20"); the swaps are recorded in ``swaps``;
- ``realistic``: column mentions left implicit where the catalogue knows how ("students
  older than 20"; "the names of students" becomes "the students"); the nouns dropped are
  recorded in ``implicit``.

Every choice between equivalent wordings goes through ``pick(key, options)``, a hash of the
example's salt and the key, so the three styles of one example choose the same template and
differ only in the words the style changes. A sentence is said in one of a few registers
(``frame``: "Could you list ...?", "Quick question: what ...?"), as OmniSQL's questions come
in several language styles.
"""

from __future__ import annotations

import re
import zlib
from typing import Sequence, TypeVar

from progress_sql.data.domains.spec import Column, Domain
from progress_sql.data.query import Col, Cond

T = TypeVar("T")
STYLES = ("plain", "syn", "realistic")

VERBS = ("List", "Show", "Give", "Find", "Return", "Display", "Tell me", "Get")
# Registers of a sentence: {s} the sentence, {l} it lower-cased at the start without its final
# stop. A command is framed only when it opens with a verb (not "I want ...").
_COMMAND_FRAMES = ("{s}", "{s}", "{s}", "{s}", "Please {l}.", "Could you {l}?", "Can you {l}?",
                   "I need you to {l}.", "I'd like you to {l}.")
_QUESTION_FRAMES = ("{s}", "{s}", "{s}", "{s}", "Quick question: {l}?", "I'd like to know: {l}?",
                    "Tell me, {l}?", "Out of curiosity, {l}?")
_COMMAND_OPENINGS = frozenset(v.split()[0] for v in VERBS) | {"Count"}
AGG_WORDS = {
    "AVG": ("average", "mean"),
    "MAX": ("highest", "maximum", "largest"),
    "MIN": ("lowest", "minimum", "smallest"),
    "SUM": ("total", "combined"),
}
_WHEN_KINDS = ("year", "date")

# Plain wordings of a condition on column noun {c} with value {v} (or {a}, {b}; {w} for LIKE).
_PLAIN = {
    "=": ("whose {c} is {v}", "with {c} {v}", "that have {c} {v}"),
    "!=": ("whose {c} is not {v}", "with a {c} other than {v}"),
    ">": ("whose {c} is greater than {v}", "with {c} above {v}", "whose {c} exceeds {v}",
          "with {c} over {v}", "whose {c} is higher than {v}"),
    "<": ("whose {c} is less than {v}", "with {c} below {v}", "whose {c} is under {v}",
          "whose {c} is lower than {v}"),
    ">=": ("whose {c} is at least {v}", "with {c} of {v} or more", "whose {c} is {v} or higher"),
    "<=": ("whose {c} is at most {v}", "with {c} of {v} or less", "whose {c} is no more than {v}"),
    "BETWEEN": ("whose {c} is between {a} and {b}", "with {c} from {a} to {b}",
                "with {c} in the range {a} to {b}"),
    "IN": ("whose {c} is {v}", "with {c} among {v}", "whose {c} is one of {v}"),
    "NOT IN": ("whose {c} is neither {v}", "whose {c} is not among {v}"),
    "IS NULL": ("whose {c} is missing", "with no {c} recorded", "whose {c} is unknown", "without a {c}"),
    "IS NOT NULL": ("whose {c} is known", "with a recorded {c}", "that have a {c} on record"),
    "LIKE%": ("whose {c} contains '{w}'", "with '{w}' in their {c}", "whose {c} includes '{w}'"),
    "LIKE^": ("whose {c} starts with '{w}'", "whose {c} begins with '{w}'"),
}
_PLAIN_WHEN = {
    ">": ("whose {c} is after {v}", "with {c} later than {v}"),
    "<": ("whose {c} is before {v}", "with {c} earlier than {v}"),
    ">=": ("whose {c} is {v} or later", "with {c} no earlier than {v}"),
    "<=": ("whose {c} is {v} or earlier", "with {c} no later than {v}"),
}
# A row's name compared for equality: "students called Ann Lee", "books titled 'Dune'".
_PLAIN_LABEL_EQ = ("whose {c} is {v}", "with the {c} {v}", "called {v}")


def pluralize(noun: str) -> str:
    """English plural of a column noun ("salary" → "salaries"); phrases ending in s or
    holding "of"/"in" ("years of experience") are left as they are."""
    if noun.endswith("s") or " of " in noun or " in " in noun:
        return noun
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    if noun.endswith(("x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def mentions(text: str, phrase: str) -> int:
    """How often ``phrase`` or its plural occurs in ``text`` as whole words (case-insensitive)."""
    forms = sorted({phrase.lower(), pluralize(phrase).lower()}, key=len, reverse=True)
    pattern = "|".join(re.escape(f) for f in forms)
    return len(re.findall(rf"(?<![\w-])(?:{pattern})(?![\w-])", text.lower()))


def format_value(col: Column, value: object) -> str:
    """A value as a question writes it: numbers without trailing zeros, titles quoted."""
    if isinstance(value, float):
        text = f"{value:.2f}".rstrip("0").rstrip(".")
    else:
        text = str(value)
    return f"'{text}'" if col.quote else text


def join_words(words: Sequence[str], last: str = "or") -> str:
    """"a", "a or b", "a, b or c"."""
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + f" {last} " + words[-1]


class Phraser:
    """Renders the parts of one question in one style (see the module docstring)."""

    def __init__(self, domain: Domain, salt: str, style: str = "plain") -> None:
        if style not in STYLES:
            raise ValueError(f"unknown style {style!r}; expected one of {STYLES}")
        self.domain = domain
        self.salt = salt
        self.style = style
        self.swaps: list[tuple[str, str]] = []  # (schema noun, synonym) used by the syn style
        self.implicit: list[str] = []  # column nouns the realistic style left out

    # -- choices
    def pick(self, key: str, options: Sequence[T]) -> T:
        return options[zlib.crc32(f"{self.salt}|{key}".encode()) % len(options)]

    def _schema_word(self, key: str) -> bool:
        """Whether the plain question uses the schema's word here (``schema_word_share`` of keys)."""
        return zlib.crc32(f"{self.salt}|word|{key}".encode()) / 2**32 < self.domain.schema_word_share

    def verb(self, key: str = "verb") -> str:
        return self.pick(key, VERBS)

    def frame(self, text: str, question: bool) -> str:
        """``text`` (a sentence) in one of the registers (module notes)."""
        if not question and text.split()[0] not in _COMMAND_OPENINGS:
            return text
        fmt = self.pick("frame", _QUESTION_FRAMES if question else _COMMAND_FRAMES)
        return fmt.format(s=text, l=text[0].lower() + text[1:].rstrip(".?"))

    # -- nouns
    def _forms(self, key: str, n: int) -> tuple[int, int]:
        """Which of ``n`` forms of a noun (the schema word first) the plain question uses, and
        which this style uses: the same, or in the syn style another synonym where there is one."""
        chosen = 0
        if n > 1 and not self._schema_word(key):
            chosen = 1 + self.pick(f"alt:{key}", range(n - 1))
        others = [k for k in range(1, n) if k != chosen]
        if self.style == "syn" and others:
            return chosen, self.pick(f"syn:{key}", others)
        return chosen, chosen

    def noun(self, table: str, plural: bool = True) -> str:
        t = self.domain.table(table)
        forms = [(t.plural, t.singular), *((p, s) for s, p in t.synonyms)]
        plain, used = self._forms(f"t:{table}", len(forms))
        word = forms[used][0 if plural else 1]
        if used != plain:
            self._swap(forms[plain][0 if plural else 1], word)
        return word

    def col(self, table: str, column: str, plural: bool = False) -> str:
        c = self.domain.table(table).column(column)
        forms = (c.noun, *c.synonyms)
        plain, used = self._forms(f"c:{table}.{column}", len(forms))
        if used != plain:
            self._swap(forms[plain], forms[used])
        return pluralize(forms[used]) if plural else forms[used]

    def _swap(self, word: str, synonym: str) -> None:
        if (word, synonym) not in self.swaps:
            self.swaps.append((word, synonym))

    def value(self, table: str, column: str, value: object) -> str:
        return format_value(self.domain.table(table).column(column), value)

    # -- conditions
    def cond(self, table: str, cond: Cond, key: str) -> str:
        """The explicit (plain) postfix wording of a condition on a column of ``table``."""
        assert isinstance(cond.left, Col)
        column = self.domain.table(table).column(cond.left.name)
        c = self.col(table, column.name)
        op = cond.op
        if op == "LIKE":
            pattern = str(cond.value)
            options = _PLAIN["LIKE^"] if not pattern.startswith("%") else _PLAIN["LIKE%"]
            return self.pick(key, options).format(c=c, w=pattern.strip("%"))
        options = _PLAIN_WHEN.get(op) if column.kind in _WHEN_KINDS else None
        if column.kind == "label" and op == "=":
            options = _PLAIN_LABEL_EQ
        options = options or _PLAIN[op]
        fmt = self.pick(key, options)
        if op == "BETWEEN":
            a, b = (self.value(table, column.name, v) for v in cond.value)
            return fmt.format(c=c, a=a, b=b)
        if op in ("IN", "NOT IN"):
            words = [self.value(table, column.name, v) for v in cond.value]
            return fmt.format(c=c, v=join_words(words, "nor" if op == "NOT IN" and "neither" in fmt else "or"))
        return fmt.format(c=c, v=self.value(table, column.name, cond.value))

    def _implicit(self, table: str, cond: Cond) -> str | None:
        """The implicit wording of a condition: always in the realistic style, as often as the
        schema word is not used in the others."""
        if not isinstance(cond.left, Col):
            return None
        column = self.domain.table(table).column(cond.left.name)
        if self.style != "realistic" and self._schema_word(f"i:{table}.{column.name}"):
            return None
        return column.implicit.get(cond.op)

    def np(self, table: str, conds: Sequence[Cond] = (), conj: str = "AND", plural: bool = True,
           key: str = "np") -> str:
        """The noun phrase of ``table`` restricted by ``conds``: "students whose age is above 20",
        "elderly patients", (realistic) "students older than 20"."""
        phrase = self.noun(table, plural)
        postfix: list[str] = []
        for i, cond in enumerate(conds):
            if cond.dk is not None and conj == "AND":
                phrase = cond.dk.phrase.format(noun=phrase)
                continue
            template = self._implicit(table, cond) if conj == "AND" else None
            if template is not None:
                column = self.domain.table(table).column(cond.left.name)
                if cond.op == "BETWEEN":
                    a, b = (self.value(table, column.name, v) for v in cond.value)
                    phrase = template.format(noun=phrase, a=a, b=b)
                elif cond.op == "IN":
                    words = [self.value(table, column.name, v) for v in cond.value]
                    phrase = template.format(noun=phrase, v=join_words(words))
                else:
                    phrase = template.format(noun=phrase, v=self.value(table, column.name, cond.value))
                self.implicit.append(column.noun)
                continue
            postfix.append(self.cond(table, cond, f"{key}:{i}"))
        if postfix:
            phrase += " " + f" {conj.lower()} ".join(postfix)
        return phrase

    def head(self, table: str, columns: Sequence[str], np: str, det: str = "", plural: bool = True) -> str:
        """"the names of {det}{np}" (singular column nouns when ``plural`` is False); the
        realistic style drops a lone label column ("the students ..." or "{det}{np}"), the
        others as often as they do not use the schema's word."""
        label = self.domain.table(table).label
        implied = self.style == "realistic" or not self._schema_word(f"h:{table}")
        if implied and label is not None and list(columns) == [label.name]:
            self.implicit.append(label.noun)
            return f"{det}{np}" if det else f"the {np}"
        if len(columns) == 1:
            cols = self.col(table, columns[0], plural=plural)
        else:
            cols = join_words([self.col(table, c) for c in columns], "and")
        return f"the {cols} of {det}{np}"

    def path(self, tables: Sequence[str], forward: Sequence[bool], rels: Sequence[str],
             conds: Sequence[Cond] = (), conj: str = "AND", key: str = "path") -> str:
        """A noun phrase walking a join path from its first table: "songs on albums by artists
        from Sweden". ``forward[i]`` says step i goes child → parent (worded by the foreign
        key's ``rels[i]``); a step parent → child reads "with <children>"."""
        words = [self.noun(tables[0])]
        for i, (fwd, rel) in enumerate(zip(forward, rels), start=1):
            last = i == len(tables) - 1
            target = self.np(tables[i], conds, conj, key=key) if last else self.noun(tables[i])
            words.append(f"{rel} {target}" if fwd else f"with {target}")
        return " ".join(words)


def sentence(text: str, question: bool) -> str:
    """Capitalise the first letter and end with '?' or '.'."""
    text = " ".join(text.split())
    text = text[0].upper() + text[1:]
    return text.rstrip(".?") + ("?" if question else ".")
