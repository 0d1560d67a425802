"""Families over one table: projections, filters, aggregates, grouping, ordering, a scalar
subquery against the average, and set operations of two filters."""

from __future__ import annotations

import random
from collections import Counter

from progress_sql.data.domains.spec import Column
from progress_sql.data.patterns.base import (
    agg_word, column_of, family, most_words, order_words, path_np, superlative, tpl, where_np,
)
from progress_sql.data.patterns.context import (
    DbContext, agg_fns, any_table, filtered_by, label_of, measure_or_count, over_one_table, pick_category, pick_filter,
    pick_filters, pick_measure, quantile,
)
from progress_sql.data.phrasing import Phraser
from progress_sql.data.query import Agg, Col, Cond, Select


def ask_list(ph: Phraser, sel: Select) -> str:
    """"List the names of students whose ...": projections of one table, filtered or not."""
    t = sel.tables[0]
    np = where_np(ph, sel, det_all=False)
    head = ph.head(t, [i.name for i in sel.items], np, det="" if sel.where else "all ")
    return tpl(ph, [("{verb} {head}", False), ("What are {head}", True), ("I want {head}", False)], head=head)


@family("list", "easy", ask_list)
def _list(ctx: DbContext, rng: random.Random) -> Select | None:
    t = rng.choice(ctx.labelled())
    col = label_of(ctx, t)
    if rng.random() < 0.3:
        other = ctx.columns(t, ("category", "number", "year", "date"))
        col = rng.choice(other).name if other else col
    return Select((t,), (Col(0, col),))


@family("filter", "easy", ask_list)
def _filter(ctx: DbContext, rng: random.Random) -> Select | None:
    t = rng.choice(ctx.labelled())
    label = label_of(ctx, t)
    n = 1 if rng.random() < 0.7 else 2
    conds = pick_filters(ctx, rng, 0, t, n, label_eq=False)
    if conds is None:
        return None
    conj = "OR" if n == 2 and rng.random() < 0.3 else "AND"
    return Select((t,), (Col(0, label),), where=conds, conj=conj)


def _ask_count(ph: Phraser, sel: Select) -> str:
    np = where_np(ph, sel, det_all=False)
    return tpl(ph, [("How many {np} are there", True), ("Count the {np}", False),
                    ("What is the number of {np}", True), ("Find the total number of {np}", False)], np=np)


@family("count", "easy", _ask_count)
def _count(ctx: DbContext, rng: random.Random) -> Select | None:
    t = any_table(ctx, rng)
    n = rng.choice((0, 1, 1, 1, 2))
    conds = pick_filters(ctx, rng, 0, t, n)
    if conds is None:
        return None
    return Select((t,), (Agg("COUNT"),), where=conds)


def _ask_agg(ph: Phraser, sel: Select) -> str:
    agg = sel.items[0]
    assert isinstance(agg, Agg) and agg.col is not None
    m = ph.col(sel.tables[0], agg.col.name)
    return tpl(ph, [("What is the {agg} {m} of {np}", True), ("Find the {agg} {m} among {np}", False),
                    ("{verb} the {agg} {m} of {np}", False)],
               agg=agg_word(ph, agg.fn), m=m, np=where_np(ph, sel))


@family("aggregate", "easy", _ask_agg)
@over_one_table(pick_measure, (0, 1, 1))
def _aggregate(ctx: DbContext, rng: random.Random, t: str, m: Column, conds: tuple[Cond, ...]) -> Select:
    return Select((t,), (Agg(rng.choice(agg_fns(m)), Col(0, m.name)),), where=conds)


def _ask_distinct(ph: Phraser, sel: Select) -> str:
    item = sel.items[0]
    t = sel.tables[0]
    if isinstance(item, Agg):
        cs = ph.col(t, item.col.name, plural=True)  # type: ignore[union-attr]
        return tpl(ph, [("How many different {cs} do {np} have", True), ("Count the distinct {cs} among {np}", False),
                        ("What is the number of distinct {cs} of {np}", True)], cs=cs, np=where_np(ph, sel))
    cs = ph.col(t, item.name, plural=True)
    return tpl(ph, [("What are the distinct {cs} of {np}", True), ("{verb} the different {cs} of {np}", False),
                    ("Which {cs} appear among {np}", True)], cs=cs, np=where_np(ph, sel))


@family("distinct", "easy", _ask_distinct)
@over_one_table(pick_category, (0, 0, 1))
def _distinct(ctx: DbContext, rng: random.Random, t: str, c: Column, conds: tuple[Cond, ...]) -> Select:
    if rng.random() < 0.4:
        return Select((t,), (Agg("COUNT", Col(0, c.name), distinct=True),), where=conds)
    return Select((t,), (Col(0, c.name),), where=conds, distinct=True)


def _ask_sorted(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    key = column_of(ph, sel, sel.order_by[0])
    cols = [i.name for i in sel.items]
    head = ph.head(t, cols, where_np(ph, sel, det_all=False), det="" if sel.where else "all ")
    return tpl(ph, [("{verb} {head}, sorted by {m} {order}", False), ("{verb} {head} ordered by {m} {order}", False),
                    ("What are {head}, ordered by {m} {order}", True)],
               head=head, m=ph.col(t, key.name), order=order_words(ph, key, sel.desc))


def _ordered(measure_share: float, desc_share: float, limits: tuple[int, ...] = ()):
    """The names of a labelled table (its measure too, at ``measure_share``) ordered by a
    measure, descending at ``desc_share``; only the first ``rng.choice(limits)`` when given."""

    def sample(ctx: DbContext, rng: random.Random) -> Select | None:
        t = rng.choice(ctx.labelled())
        m = pick_measure(ctx, rng, t, not_null=True)
        if m is None:
            return None
        items = (Col(0, label_of(ctx, t)),) + ((Col(0, m.name),) if rng.random() < measure_share else ())
        desc = rng.random() < desc_share
        return Select((t,), items, order_by=(Col(0, m.name),), desc=desc, limit=rng.choice(limits) if limits else None)
    return sample


family("sorted", "easy", _ask_sorted)(_ordered(0.5, 0.5))


@family("project", "medium", ask_list)
def _project(ctx: DbContext, rng: random.Random) -> Select | None:
    t = rng.choice(ctx.labelled())
    label = label_of(ctx, t)
    others = ctx.columns(t, ("category", "number", "year", "date"))
    if not others:
        return None
    extra = rng.choice(others)
    conds = pick_filters(ctx, rng, 0, t, rng.choice((0, 1, 1)), exclude=(extra.name,), label_eq=False)
    if conds is None:
        return None
    return Select((t,), (Col(0, label), Col(0, extra.name)), where=conds)


def _ask_top(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    key = column_of(ph, sel, sel.order_by[0])
    sup = superlative(ph, key, sel.desc)
    m = ph.col(t, key.name)
    cols = [i.name for i in sel.items]
    if sel.limit == 1:
        np = f"{ph.noun(t, plural=False)} with the {sup} {m}"
        head = ph.head(t, cols, np, det="the ", plural=False)
        return tpl(ph, [("{verb} {head}", False), ("What is {head}", True),
                        ("Which {one} has the {sup} {m}", True)],
                   head=head, one=ph.noun(t, plural=False), sup=sup, m=m)
    np = f"{ph.noun(t)} with the {sup} {m}"
    head = ph.head(t, cols, np, det=f"the {sel.limit} ")
    return tpl(ph, [("{verb} {head}", False), ("What are {head}", True)], head=head)


family("top", "medium", _ask_top)(_ordered(0.3, 0.7, (1, 1, 1, 3, 5)))


def _ask_group(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    c = ph.col(t, sel.group_by[0].name)
    np = where_np(ph, sel, det_all=False)
    agg = sel.items[1]
    assert isinstance(agg, Agg)
    if agg.fn == "COUNT":
        return tpl(ph, [("How many {np} are there for each {c}", True), ("For each {c}, count the {np}", False),
                        ("{verb} each {c} and the number of {np} with it", False),
                        ("What is the number of {np} per {c}", True)], np=np, c=c)
    m = ph.col(t, agg.col.name)  # type: ignore[union-attr]
    return tpl(ph, [("What is the {agg} {m} of {np} for each {c}", True),
                    ("For every {c}, {verb_l} the {agg} {m} of the {np}", False),
                    ("{verb} each {c} together with the {agg} {m} of its {np}", False)],
               np=np, c=c, m=m, agg=agg_word(ph, agg.fn), verb_l=ph.verb("verb2").lower())


@family("group", "medium", _ask_group)
@over_one_table(pick_category, (0, 0, 1))
def _group(ctx: DbContext, rng: random.Random, t: str, c: Column, conds: tuple[Cond, ...]) -> Select:
    agg = measure_or_count(rng, pick_measure(ctx, rng, t), 0.5)
    return Select((t,), (Col(0, c.name), agg), where=conds, group_by=(Col(0, c.name),))


def _ask_stats(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    m = ph.col(t, sel.items[0].col.name)  # type: ignore[union-attr]
    words = [agg_word(ph, i.fn) for i in sel.items]  # type: ignore[union-attr]
    aggs = ", ".join(words[:-1]) + " and " + words[-1]
    return tpl(ph, [("What are the {aggs} {m} of {np}", True), ("{verb} the {aggs} {m} among {np}", False)],
               aggs=aggs, m=m, np=where_np(ph, sel))


@family("stats", "medium", _ask_stats)
@over_one_table(pick_measure)
def _stats(ctx: DbContext, rng: random.Random, t: str, m: Column, _: tuple[Cond, ...]) -> Select | None:
    fns = rng.choice((("AVG", "MIN", "MAX"), ("MIN", "MAX"), ("AVG", "MAX")))
    conds = filtered_by(ctx, rng, t, m, (0, 1))
    if conds is None:
        return None
    return Select((t,), tuple(Agg(f, Col(0, m.name)) for f in fns), where=conds)


def _ask_having(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    cs = ph.col(t, sel.group_by[0].name, plural=True)
    h = sel.having[0]
    assert isinstance(h.left, Agg)
    if h.left.fn == "COUNT":
        amount = f"at least {h.value}" if h.op == ">=" else f"more than {h.value}"
        return tpl(ph, [("Which {cs} have {amount} {np}", True), ("{verb} the {cs} shared by {amount} {np}", False),
                        ("Find every {c} with {amount} {np}", False)],
                   cs=cs, c=ph.col(t, sel.group_by[0].name), amount=amount, np=ph.noun(t))
    m = ph.col(t, h.left.col.name)  # type: ignore[union-attr]
    cmp = "above" if h.op == ">" else "below"
    v = ph.value(t, h.left.col.name, h.value)  # type: ignore[union-attr]
    return tpl(ph, [("Which {cs} have an average {m} {cmp} {v}", True),
                    ("{verb} the {cs} whose {np} have an average {m} {cmp} {v}", False)],
               cs=cs, m=m, cmp=cmp, v=v, np=ph.noun(t))


@family("having", "medium", _ask_having)
@over_one_table(pick_category)
def _having(ctx: DbContext, rng: random.Random, t: str, c: Column, _: tuple[Cond, ...]) -> Select:
    m = pick_measure(ctx, rng, t)
    if m is not None and rng.random() < 0.4:
        value = quantile(ctx.sorted_values(t, m.name), rng, 0.35, 0.65)
        having = Cond(Agg("AVG", Col(0, m.name)), rng.choice((">", "<")), value)
    else:
        sizes = sorted(Counter(ctx.values(t, c.name)).values())
        having = Cond(Agg("COUNT"), rng.choice((">=", ">")), max(2, quantile(sizes, rng, 0.3, 0.7)))
    items = (Col(0, c.name),) + ((Agg("COUNT"),) if rng.random() < 0.3 else ())
    return Select((t,), items, group_by=(Col(0, c.name),), having=(having,))


def ask_vs_average(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    scalar = next(c for c in sel.where if isinstance(c.value, Select))
    m = ph.col(t, scalar.left.name)  # type: ignore[union-attr]
    cmp = ph.pick("cmp", ("above", "higher than") if scalar.op == ">" else ("below", "lower than"))
    base = where_np(ph, sel, t=0, det_all=False) if len(sel.tables) == 1 else path_np(ph, sel)
    np = f"{base} whose {m} is {cmp} the average"
    head = ph.head(t, [i.name for i in sel.items], np)
    return tpl(ph, [("{verb} {head}", False), ("What are {head}", True)], head=head)


@family("vs_average", "hard", ask_vs_average)
def _vs_average(ctx: DbContext, rng: random.Random) -> Select | None:
    t = rng.choice(ctx.labelled())
    m = pick_measure(ctx, rng, t)
    if m is None:
        return None
    sub = Select((t,), (Agg("AVG", Col(0, m.name)),))
    scalar = Cond(Col(0, m.name), rng.choice((">", "<")), sub)
    conds = pick_filters(ctx, rng, 0, t, rng.choice((0, 0, 1)), exclude=(m.name,), label_eq=False) or ()
    return Select((t,), (Col(0, label_of(ctx, t)),), where=(*conds, scalar))


def ask_set_op(ph: Phraser, sel: Select) -> str:
    other = sel.other
    assert other is not None
    t = sel.tables[0]
    ls = ph.col(t, sel.items[0].name, plural=True)
    if len(sel.tables) == 1:
        a = ph.np(t, sel.where, key="a")
        b = ph.np(t, other.where, key="b")
    else:
        a, b = path_np(ph, sel, key="a"), path_np(ph, other, key="b")
    options = {
        "INTERSECT": [("{verb} the {ls} shared by {a} and {b}", False),
                      ("What {ls} do {a} and {b} have in common", True)],
        "UNION": [("{verb} the {ls} of {a} or {b}", False),
                  ("What are the {ls} of {a}, together with those of {b}", True)],
        "EXCEPT": [("{verb} the {ls} of {a}, excluding those of {b}", False),
                   ("Which {ls} belong to {a} but not to {b}", True)],
    }[sel.set_op]
    return tpl(ph, options, ls=ls, a=a, b=b)


@family("set_op", "hard", ask_set_op)
def _set_op(ctx: DbContext, rng: random.Random) -> Select | None:
    t = rng.choice(ctx.labelled())
    label = label_of(ctx, t)
    op = rng.choice(("UNION", "INTERSECT", "EXCEPT"))
    c1 = pick_filter(ctx, rng, 0, t, exclude=(label,))
    if c1 is None:
        return None
    c2 = pick_filter(ctx, rng, 0, t, exclude=(label, c1.left.name))
    if c2 is None:
        return None
    second = Select((t,), (Col(0, label),), where=(c2,))
    return Select((t,), (Col(0, label),), where=(c1,), set_op=op, other=second)


def _ask_group_top(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    c = ph.col(t, sel.group_by[0].name)
    most = most_words(ph, sel.desc)
    common = "most common" if sel.desc else "least common"
    return tpl(ph, [("Which {c} has the {most} {plural}", True), ("What is the {common} {c} among {plural}", True),
                    ("Find the {c} shared by the {most} {plural}", False)],
               c=c, most=most, common=common, plural=where_np(ph, sel, det_all=False))


@family("group_top", "hard", _ask_group_top)
@over_one_table(pick_category, (0, 0, 1))
def _group_top(ctx: DbContext, rng: random.Random, t: str, c: Column, conds: tuple[Cond, ...]) -> Select:
    return Select((t,), (Col(0, c.name),), where=conds, group_by=(Col(0, c.name),),
                  order_by=(Agg("COUNT"),), desc=rng.random() < 0.75, limit=1)


def _ask_group_multi(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    c = ph.col(t, sel.group_by[0].name)
    words = [agg_word(ph, i.fn) if i.col is not None else "number" for i in sel.items[1:]]  # type: ignore[union-attr]
    m = ph.col(t, next(i.col.name for i in sel.items[1:] if i.col is not None))  # type: ignore[union-attr]
    return tpl(ph, [("For each {c}, what are the {aggs} {m} of {np}", True),
                    ("{verb} every {c} with the {aggs} {m} among {np}", False)],
               c=c, aggs=" and ".join(words), m=m, np=where_np(ph, sel, det_all=False))


@family("group_multi", "hard", _ask_group_multi)
def _group_multi(ctx: DbContext, rng: random.Random) -> Select | None:
    t = any_table(ctx, rng)
    c = pick_category(ctx, rng, t)
    m = pick_measure(ctx, rng, t)
    if c is None or m is None:
        return None
    conds = pick_filters(ctx, rng, 0, t, 2, exclude=(c.name, m.name))
    if conds is None:
        return None
    fns = rng.choice((("AVG", "MAX"), ("MIN", "MAX"), ("AVG", "MIN")))
    return Select((t,), (Col(0, c.name), *(Agg(f, Col(0, m.name)) for f in fns)), where=conds,
                  group_by=(Col(0, c.name),))
