"""The result comparison of the Spider test-suite semantics: the primitives of EX and TS.

Reference: taoyds/test-suite-sql-eval, ``exec_eval.py`` (``result_eq``, ``eval_exec_match``)
with its defaults (``keep_distinct=False``, ``plug_value=False``). As there:

- both results empty → equal (whatever their columns); different row counts → not equal;
  different column counts → not equal;
- equal when some permutation of the prediction's columns makes its rows equal to the gold's
  as a bag (duplicates count), or as a list when order matters;
- DISTINCT is removed from both queries before they run; a gold query whose output is ordered
  makes order matter;
- values compare with Python ``==`` on what SQLite returns: ``1 == 1.0``, NULL equals NULL,
  floats exactly (no tolerance), text is case-sensitive, ``'1' != 1``, text ``!=`` blob.

These are the primitives of the ``"spider"`` semantics of ``progress_sql.sql.verdict``, the one
decision of "correct" that rewards, rollouts and the evaluation share (it also holds
``execution_match`` and ``test_suite_match``, the evaluator's two functions).

Divergences, on purpose:

- Order: the reference tests ``'order by' in gold.lower()``, a substring test that also fires
  for an ORDER BY inside a WHERE subquery or a string literal and misses ``ORDER\\nBY``.
  ``order_matters`` parses the gold instead: order matters when the outermost query (or the
  set operation at the top) has ORDER BY, or when it selects, without GROUP BY, from a single
  derived table whose rows are ordered. Unparsable gold falls back to the reference's
  substring test, tolerant of any whitespace between ORDER and BY.
- DISTINCT: the reference drops every ``distinct`` token (sqlparse), including the one in
  ``count(DISTINCT x)``. ``strip_distinct`` does the same with sqlglot's tokenizer, so string
  literals and quoted names containing "distinct" are left alone, and so is
  ``IS [NOT] DISTINCT FROM``. Text the tokenizer rejects is returned unchanged.
- Column search: the reference samples 20 rows to prune column permutations (only above three
  columns) and may try every remaining permutation. Here a prediction column is a candidate
  for a gold column only when their value multisets are equal, identical prediction columns
  are tried once, and every partial assignment is checked on the projected rows, so wide
  results (10+ columns) stay fast. Same answers, no randomness.
- Quick rejection sorts each row's values with a type-consistent key (numbers together, then
  text, then blobs), so ``1`` and ``1.0`` are equal here as they are in the final comparison;
  the reference's ``str(x) + str(type(x))`` key can put them in different places.
- Errors: the reference asserts that the gold runs; here a gold error, a prediction error, or a
  truncated result (more than ``sandbox.max_rows`` rows) means "no match".
- ``postprocess`` (``'! ='`` → ``'!='``, likewise ``> =`` and ``< =``, found in Spider's own
  gold) is ``spider_postprocess`` here and accepts any whitespace between the two characters.
- Not reproduced: ``replace_cur_year`` (``YEAR(CURDATE())`` → 2020) and ``plug_value``; the reference's 60 s timeout is
  ``sandbox.timeout_s`` here. TS takes the databases as an explicit list instead of every
  ``*.sqlite`` file in the gold database's folder.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from sqlglot import exp
from sqlglot.dialects.sqlite import SQLite
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from progress_sql.sql.parse import SQLParseError, parse_one
from progress_sql.sql.result import ExecResult

_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
_SPACED_OPERATOR = re.compile(r"([!<>])\s+=")
_SQLITE = SQLite()


# ----------------------------------------------------------------------------- query text
def spider_postprocess(sql: str) -> str:
    """Join operators split by whitespace (``! =`` → ``!=``), as the Spider evaluator does."""
    return _SPACED_OPERATOR.sub(r"\1=", sql) if isinstance(sql, str) else sql


def strip_distinct(sql: str) -> str:
    """``sql`` without its DISTINCT keywords (as the reference's ``remove_distinct``)."""
    if not isinstance(sql, str) or "distinct" not in sql.lower():
        return sql
    try:
        tokens = _SQLITE.tokenize(sql)
    except (SqlglotError, ValueError, IndexError, RecursionError):
        return sql
    cuts = []
    for i, tok in enumerate(tokens):
        if tok.token_type != TokenType.DISTINCT:
            continue
        follows_is = i > 0 and tokens[i - 1].token_type in (TokenType.IS, TokenType.NOT)
        precedes_from = i + 1 < len(tokens) and tokens[i + 1].token_type == TokenType.FROM
        if follows_is and precedes_from:
            continue  # IS [NOT] DISTINCT FROM is a comparison operator
        cuts.append((tok.start, tok.end + 1))
    if not cuts:
        return sql
    pieces, last = [], 0
    for start, end in cuts:
        pieces.append(sql[last:start])
        last = end
    pieces.append(sql[last:])
    return "".join(pieces)


def _ordered_output(node: exp.Expression) -> bool:
    while True:
        while isinstance(node, exp.Subquery):
            node = node.this
        if node.args.get("order"):
            return True
        if not isinstance(node, exp.Select) or node.args.get("group") or node.args.get("joins"):
            return False
        source = node.args.get("from_")
        if source is None or not isinstance(source.this, exp.Subquery):
            return False
        node = source.this  # rows of a single derived table keep its order


def order_matters(gold_sql: str) -> bool:
    """True when the gold query's rows come out in a defined order (see module notes)."""
    try:
        tree = parse_one(gold_sql)
    except SQLParseError:
        return isinstance(gold_sql, str) and bool(_ORDER_BY.search(gold_sql))
    return _ordered_output(tree)


# ----------------------------------------------------------------------------- results
def _value_key(value: object) -> tuple:
    if value is None:
        return (0, 0)
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return (3, bytes(value))
    return (4, repr(value))


def _unordered(row: tuple) -> tuple:
    return tuple(sorted(row, key=_value_key))


def rows_equivalent(pred_rows: Sequence[tuple], gold_rows: Sequence[tuple], order_matters: bool) -> bool:
    """The reference's ``result_eq``: equal up to a column permutation, as bags or as lists."""
    gold, pred = list(gold_rows), list(pred_rows)
    if not gold and not pred:
        return True
    if len(gold) != len(pred):
        return False
    width = len(gold[0])
    if len(pred[0]) != width:
        return False

    # The usual case first: same column order.
    if (pred == gold) if order_matters else (Counter(pred) == Counter(gold)):
        return True
    # A permutation cannot change the values of a row: compare rows as sorted value tuples.
    gold_unordered = [_unordered(r) for r in gold]
    pred_unordered = [_unordered(r) for r in pred]
    if order_matters:
        if gold_unordered != pred_unordered:
            return False
    elif Counter(gold_unordered) != Counter(pred_unordered):
        return False
    return _find_permutation(pred, gold, width, order_matters)


def _find_permutation(pred: list[tuple], gold: list[tuple], width: int, order_matters: bool) -> bool:
    gold_cols = [Counter(r[i] for r in gold) for i in range(width)]
    pred_vectors = [tuple(r[j] for r in pred) for j in range(width)]
    pred_cols = [Counter(v) for v in pred_vectors]
    # Identical prediction columns are interchangeable: try one per class.
    first_seen: dict[tuple, int] = {}
    klass = [first_seen.setdefault(v, j) for j, v in enumerate(pred_vectors)]
    candidates = [[j for j in range(width) if pred_cols[j] == gold_cols[i]] for i in range(width)]
    if any(not c for c in candidates):
        return False
    # Most constrained gold columns first; the same-position candidate first.
    gold_order = sorted(range(width), key=lambda i: len(candidates[i]))
    for i in gold_order:
        candidates[i].sort(key=lambda j, i=i: j != i)

    def project(rows: list[tuple], cols: list[int]) -> list[tuple]:
        return [tuple(r[c] for c in cols) for r in rows]

    gold_levels = [project(gold, gold_order[: k + 1]) for k in range(width)]
    gold_targets = gold_levels if order_matters else [Counter(level) for level in gold_levels]
    used: set[int] = set()

    def search(k: int, partial: list[tuple]) -> bool:
        if k == width:
            return True
        tried: set[int] = set()
        for j in candidates[gold_order[k]]:
            if j in used or klass[j] in tried:
                continue
            tried.add(klass[j])
            extended = [t + (r[j],) for t, r in zip(partial, pred)]
            target = gold_targets[k]
            if (extended == target) if order_matters else (Counter(extended) == target):
                used.add(j)
                if search(k + 1, extended):
                    return True
                used.discard(j)
        return False

    return search(0, [() for _ in pred])


def results_match(pred: ExecResult, gold: ExecResult, order_matters: bool) -> bool:
    """Denotation match of two executions; False when either errored or was truncated."""
    if not pred.ok or not gold.ok or pred.truncated or gold.truncated:
        return False
    return rows_equivalent(pred.rows, gold.rows, order_matters)
