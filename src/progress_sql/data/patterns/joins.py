"""Families that follow foreign keys: joins of one to three hops, aggregation and grouping
over a join, nested IN / NOT IN subqueries, set operations and EXCEPT over joins."""

from __future__ import annotations

import random
from collections import Counter
from typing import Callable

from progress_sql.data.patterns.base import (
    agg_word, be_rel, column_of, family, most_words, path_np, path_of, superlative, tpl, where_np,
)
from progress_sql.data.patterns.context import (
    DbContext, JoinPath, label_of, make_cond, measure_or_count, paths_of, pick_filter, pick_filters, pick_measure,
    pick_path, quantile,
)
from progress_sql.data.patterns.single import ask_set_op, ask_vs_average
from progress_sql.data.phrasing import Phraser
from progress_sql.data.query import Agg, Col, Cond, Select


def _ask_join_filter(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    p = path_np(ph, sel)
    head = ph.head(t, [i.name for i in sel.items], p)
    forward, rels = path_of(ph, sel)
    last = len(sel.tables) - 1
    conds = [c for c in sel.where if isinstance(c.left, Col) and c.left.t == last]
    target = ph.np(sel.tables[1], conds, sel.conj, key="path") if last == 1 else None
    options = [("{verb} {head}", False), ("What are {head}", True)]
    if target is not None:
        which = f"{be_rel(rels[0])} {target}" if forward[0] else f"have {target}"
        options.append(("Which {plural} " + which, True))
    return tpl(ph, options, head=head, plural=ph.noun(t))


def _join_select(path: JoinPath, items: tuple, where: tuple[Cond, ...], **kw) -> Select:
    return Select(path.tables, items, joins=path.joins(), where=where,
                  distinct=kw.pop("distinct", not path.forward), **kw)


def _join_filter(hops: int):
    def sample(ctx: DbContext, rng: random.Random) -> Select | None:
        path = pick_path(ctx, rng, hops)
        if path is None:
            return None
        end = len(path.tables) - 1
        conds = pick_filters(ctx, rng, end, path.tables[-1], 1 if rng.random() < 0.8 else 2)
        if conds is None:
            return None
        return _join_select(path, (Col(0, label_of(ctx, path.tables[0])),), conds)
    return sample


family("join_filter", "medium", _ask_join_filter)(_join_filter(1))
family("join2_filter", "hard", _ask_join_filter)(_join_filter(2))
family("join3_filter", "extra", _ask_join_filter)(_join_filter(3))


def _ask_join_count(ph: Phraser, sel: Select) -> str:
    p = path_np(ph, sel)
    item = sel.items[0]
    assert isinstance(item, Agg)
    if item.fn == "COUNT":
        return tpl(ph, [("How many {p} are there", True), ("Count the {p}", False),
                        ("What is the number of {p}", True)], p=p)
    m = ph.col(sel.tables[0], item.col.name)  # type: ignore[union-attr]
    return tpl(ph, [("What is the {agg} {m} of {p}", True), ("{verb} the {agg} {m} of {p}", False)],
               agg=agg_word(ph, item.fn), m=m, p=p)


@family("join_aggregate", "medium", _ask_join_count)
def _join_aggregate(ctx: DbContext, rng: random.Random) -> Select | None:
    path = pick_path(ctx, rng, rng.choice((1, 1, 2)), forward=True, start_label=False)
    if path is None:
        return None
    end = len(path.tables) - 1
    conds = pick_filters(ctx, rng, end, path.tables[-1], 1)
    if conds is None:
        return None
    item = measure_or_count(rng, pick_measure(ctx, rng, path.tables[0]), 0.5)
    return _join_select(path, (item,), conds, distinct=False)


def _ask_join_project(ph: Phraser, sel: Select) -> str:
    child, parent = sel.tables
    a = ph.col(child, sel.items[0].name, plural=True)
    b = ph.col(parent, sel.items[1].name, plural=True)
    np = where_np(ph, sel, det_all=False)
    return tpl(ph, [("{verb} the {a} of {np} and the {b} of their {parents}", False),
                    ("What are the {a} of {np}, together with the {b} of their {parents}", True),
                    ("For {np}, {verb_l} their {a} and the {b} of their {parents}", False)],
               a=a, b=b, np=np, parents=ph.noun(parent), verb_l=ph.verb("verb2").lower())


@family("join_project", "medium", _ask_join_project)
def _join_project(ctx: DbContext, rng: random.Random) -> Select | None:
    path = pick_path(ctx, rng, 1, forward=True, end_label=True)
    if path is None:
        return None
    child, parent = path.tables
    conds = pick_filters(ctx, rng, 0, child, rng.choice((0, 1, 1)), label_eq=False)
    if conds is None:
        return None
    return _join_select(path, (Col(0, label_of(ctx, child)), Col(1, label_of(ctx, parent))), conds)


def _by_parent(build: Callable[..., Select | None]) -> Callable[[DbContext, random.Random], Select | None]:
    """A family grouping children by their parent: the decorated ``build(ctx, rng, path, fk,
    label)`` gets a child → parent join whose parent has a label, the child's foreign key and
    the parent's label column (the sampler is None when the database has no such join)."""

    def sample(ctx: DbContext, rng: random.Random) -> Select | None:
        path = pick_path(ctx, rng, 1, forward=True, start_label=False, end_label=True)
        if path is None:
            return None
        return build(ctx, rng, path, path.steps[0].src_col, label_of(ctx, path.tables[1]))
    return sample


def _ask_join_group(ph: Phraser, sel: Select) -> str:
    child, parent = sel.tables
    forward, rels = path_of(ph, sel)
    one = ph.noun(parent, plural=False)
    head = ph.head(parent, [sel.items[0].name], f"{one}", det="every ", plural=False)
    children = where_np(ph, sel, det_all=False)
    agg = sel.items[1]
    assert isinstance(agg, Agg)
    if agg.fn == "COUNT":
        options = [("For each {one}, how many {children} are there", True),
                   ("{verb} {head} along with the number of their {children}", False)]
        if rels[0] not in ("of", "for", "to"):
            options.append(("How many {children} are {rel} each {one}", True))
        return tpl(ph, options, one=one, head=head, children=children, rel=rels[0])
    m = ph.col(child, agg.col.name)  # type: ignore[union-attr]
    return tpl(ph, [("{verb} {head} and the {agg} {m} of their {children}", False),
                    ("For each {one}, what is the {agg} {m} of its {children}", True)],
               head=head, one=one, agg=agg_word(ph, agg.fn), m=m, children=children)


@family("join_group", "medium", _ask_join_group)
@_by_parent
def _join_group(ctx: DbContext, rng: random.Random, path: JoinPath, fk: str, label: str) -> Select | None:
    agg = measure_or_count(rng, pick_measure(ctx, rng, path.tables[0]), 0.35, ("AVG", "MAX"))
    conds = pick_filters(ctx, rng, 0, path.tables[0], rng.choice((0, 0, 1)))
    if conds is None:
        return None
    return _join_select(path, (Col(1, label), agg), conds, group_by=(Col(0, fk),))


def _ask_join_having(ph: Phraser, sel: Select) -> str:
    child, parent = sel.tables
    n = sel.having[0].value
    amount = f"at least {n}" if sel.having[0].op == ">=" else f"more than {n}"
    head = ph.head(parent, [sel.items[0].name], ph.noun(parent))
    return tpl(ph, [("Which {parents} have {amount} {children}", True),
                    ("{verb} {head} with {amount} {children}", False)],
               parents=ph.noun(parent), amount=amount, children=ph.noun(child), head=head)


@family("join_having", "medium", _ask_join_having)
@_by_parent
def _join_having(ctx: DbContext, rng: random.Random, path: JoinPath, fk: str, label: str) -> Select | None:
    sizes = sorted(Counter(ctx.values(path.tables[0], fk)).values())
    n = max(2, quantile(sizes, rng, 0.4, 0.8))
    return _join_select(path, (Col(1, label),), (), group_by=(Col(0, fk),),
                        having=(Cond(Agg("COUNT"), rng.choice((">=", ">")), n),))


def _ask_nested(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    cond = sel.where[0]
    inner: Select = cond.value
    inner_t = inner.tables[0]
    target = ph.np(inner_t, inner.where, inner.conj, key="inner")
    col = ph.domain.table(t).column(cond.left.name)  # type: ignore[union-attr]
    forward = col.kind == "ref"
    if cond.op == "NOT IN":
        np = f"{ph.noun(t)} without any {target}"
        head = ph.head(t, [sel.items[0].name], np)
        return tpl(ph, [("{verb} {head}", False), ("Which {plural} have no {target}", True),
                        ("What are {head}", True)], head=head, plural=ph.noun(t), target=target)
    rel = col.rel if forward else ph.domain.table(inner_t).column(inner.items[0].name).rel
    link = f"{rel} {target}" if forward else f"with {target}"
    which = f"{be_rel(rel)} {target}" if forward else f"have {target}"
    head = ph.head(t, [sel.items[0].name], f"{ph.noun(t)} {link}")
    return tpl(ph, [("{verb} {head}", False), ("What are {head}", True), ("Which {plural} {which}", True)],
               head=head, plural=ph.noun(t), which=which)


def _nested(op: str, forward: bool | None, filters: int | tuple[int, ...]):
    """``outer.fk [NOT] IN (SELECT inner.key FROM inner WHERE ...)`` over one join; ``filters``
    conditions on the inner table (a tuple: one of them at random)."""

    def sample(ctx: DbContext, rng: random.Random) -> Select | None:
        path = rng.choice(paths_of(ctx, 1, forward=forward) or [None])  # draws even when none fits (pick_path does not)
        if path is None:
            return None
        step = path.steps[0]
        outer, inner = path.tables
        conds = pick_filters(ctx, rng, 0, inner, filters if isinstance(filters, int) else rng.choice(filters))
        if conds is None:
            return None
        sub = Select((inner,), (Col(0, step.dst_col),), where=conds)
        return Select((outer,), (Col(0, label_of(ctx, outer)),), where=(Cond(Col(0, step.src_col), op, sub),))
    return sample


family("nested_in", "hard", _ask_nested)(_nested("IN", None, 1))
family("not_in", "hard", _ask_nested)(_nested("NOT IN", False, (0, 1, 1)))


def _ask_join_top(ph: Phraser, sel: Select) -> str:
    child, parent = sel.tables
    one = ph.noun(parent, plural=False)
    head = ph.head(parent, [sel.items[0].name], f"{one}", det="the ", plural=False)
    key = sel.order_by[0]
    assert isinstance(key, Agg)
    children = ph.noun(child)
    if key.fn == "COUNT":
        most = most_words(ph, sel.desc)
        return tpl(ph, [("Which {one} has the {most} {children}", True),
                        ("{verb} {head} with the {most} {children}", False)],
                   one=one, most=most, children=children, head=head)
    m = ph.col(child, key.col.name)  # type: ignore[union-attr]
    sup = "highest" if sel.desc else "lowest"
    return tpl(ph, [("Which {one} has the {sup} {agg} {m} of {children}", True),
                    ("{verb} {head} whose {children} have the {sup} {agg} {m}", False)],
               one=one, sup=sup, agg=agg_word(ph, key.fn), m=m, children=children, head=head)


@family("join_group_top", "extra", _ask_join_top)
@_by_parent
def _join_group_top(ctx: DbContext, rng: random.Random, path: JoinPath, fk: str, label: str) -> Select | None:
    key = measure_or_count(rng, pick_measure(ctx, rng, path.tables[0]), 0.4, ("AVG",))
    return _join_select(path, (Col(1, label),), (), group_by=(Col(0, fk),), order_by=(key,),
                        desc=rng.random() < 0.75, limit=1)


@family("join_set_op", "extra", ask_set_op)
def _join_set_op(ctx: DbContext, rng: random.Random) -> Select | None:
    path = pick_path(ctx, rng, 1)
    if path is None:
        return None
    label = label_of(ctx, path.tables[0])
    end = path.tables[1]
    # Spider's classic: two values of one column ("enrolled in course A and in course B").
    cols = ctx.columns(end, ("category", "label", "year"))
    if not cols:
        return None
    col = rng.choice(cols)
    c1, c2 = make_cond(ctx, rng, 1, end, col, "="), make_cond(ctx, rng, 1, end, col, "=")
    if c1 is None or c2 is None or c1 == c2:
        return None
    op = rng.choice(("UNION", "INTERSECT", "EXCEPT"))
    second = _join_select(path, (Col(0, label),), (c2,), distinct=False)
    return _join_select(path, (Col(0, label),), (c1,), distinct=False, set_op=op, other=second)


@family("join_vs_average", "extra", ask_vs_average)
def _join_vs_average(ctx: DbContext, rng: random.Random) -> Select | None:
    paths = [p for p in paths_of(ctx, 1, forward=True) if pick_measure(ctx, rng, p.tables[0])]
    if not paths:
        return None
    path = rng.choice(paths)
    child = path.tables[0]
    m = pick_measure(ctx, rng, child)
    cond = pick_filter(ctx, rng, 1, path.tables[1])
    if cond is None or m is None:
        return None
    scalar = Cond(Col(0, m.name), rng.choice((">", "<")), Select((child,), (Agg("AVG", Col(0, m.name)),)))
    return _join_select(path, (Col(0, label_of(ctx, child)),), (cond, scalar))


def _ask_join_filter_top(ph: Phraser, sel: Select) -> str:
    t = sel.tables[0]
    key = column_of(ph, sel, sel.order_by[0])
    p = path_np(ph, sel)
    sup = superlative(ph, key, sel.desc)
    m = ph.col(t, key.name)
    one = ph.noun(t, plural=False)
    head = ph.head(t, [sel.items[0].name], f"{one} with the {sup} {m}", det="the ", plural=False)
    return tpl(ph, [("Among {p}, which one has the {sup} {m}", True),
                    ("{verb} {head} among {p}", False)], p=p, sup=sup, m=m, head=head)


@family("join_filter_top", "extra", _ask_join_filter_top)
def _join_filter_top(ctx: DbContext, rng: random.Random) -> Select | None:
    path = pick_path(ctx, rng, 1, forward=True)
    if path is None:
        return None
    m = pick_measure(ctx, rng, path.tables[0], not_null=True)
    cond = pick_filter(ctx, rng, 1, path.tables[1])
    if m is None or cond is None:
        return None
    return _join_select(path, (Col(0, label_of(ctx, path.tables[0])),), (cond,), order_by=(Col(0, m.name),),
                        desc=rng.random() < 0.7, limit=1)


def _ask_join_group_multi(ph: Phraser, sel: Select) -> str:
    child, parent = sel.tables
    one = ph.noun(parent, plural=False)
    agg = sel.items[2]
    assert isinstance(agg, Agg) and agg.col is not None
    order = ""
    if sel.order_by:
        order = f", {ph.pick('order', ('starting with', 'beginning with'))} the {one} with the most"
    stats = "the number of {children} and their {agg} {m}{order}"
    return tpl(ph, [("For each {one}, {verb_l} its {label}, " + stats, False),
                    ("{verb} the {label} of every {one} with " + stats, False)],
               one=one, label=ph.col(parent, sel.items[0].name), children=where_np(ph, sel, det_all=False),
               m=ph.col(child, agg.col.name), agg=agg_word(ph, agg.fn), order=order,
               verb_l=ph.verb("verb2").lower())


@family("join_group_multi", "extra", _ask_join_group_multi)
@_by_parent
def _join_group_multi(ctx: DbContext, rng: random.Random, path: JoinPath, fk: str, label: str) -> Select | None:
    m = pick_measure(ctx, rng, path.tables[0])
    if m is None:
        return None
    conds = pick_filters(ctx, rng, 0, path.tables[0], 1, exclude=(m.name,))
    if conds is None:
        return None
    ordered = rng.random() < 0.6
    return _join_select(path, (Col(1, label), Agg("COUNT"), Agg(rng.choice(("AVG", "MAX")), Col(0, m.name))), conds,
                        group_by=(Col(0, fk),), order_by=(Agg("COUNT"),) if ordered else (), desc=ordered)


def _ask_except_join(ph: Phraser, sel: Select) -> str:
    parent = sel.tables[0]
    other = sel.other
    assert other is not None
    child = other.tables[0]
    target = ph.np(child, other.where, key="inner")
    head = ph.head(parent, [sel.items[0].name], f"{ph.noun(parent)} that have no {target}")
    return tpl(ph, [("{verb} {head}", False), ("Which {parents} have no {target}", True)],
               head=head, parents=ph.noun(parent), target=target)


@family("except_join", "hard", _ask_except_join)
@_by_parent
def _except_join(ctx: DbContext, rng: random.Random, path: JoinPath, fk: str, label: str) -> Select | None:
    conds = pick_filters(ctx, rng, 0, path.tables[0], 1)
    if conds is None:
        return None
    joined = _join_select(path, (Col(1, label),), conds, distinct=False)
    return Select((path.tables[1],), (Col(0, label),), set_op="EXCEPT", other=joined)
