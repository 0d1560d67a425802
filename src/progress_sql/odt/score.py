"""Structural scoring of two ODTs (progress-sql.md, Appendix D, "Structural Scoring").

SELECT node: s = α·s_local + (1−α)·s_child, s_local the weighted mean of the feature
similarities (Jaccard for sets: both empty → 1, one empty → 0; NumSim for counts;
equality for booleans; ``weights.booleans`` is shared equally by the seven booleans and
``weights.counts`` by the two counts). Other nodes: s = s_child.

s_child: for each gold child in order, the highest-scoring unmatched predicted child of a
compatible type is matched (SUBQUERY with SUBQUERY, CTE with the CTE of the same name,
query nodes SELECT / SET_OP with each other); the sum of matched scores is divided by
max(#pred children, #gold children). A SELECT with no nested query on either side scores
s_local alone (``odt.leaf_score: local``, the default; ``one`` takes s_child = 1 there, which
puts a 1 − α floor under every flat pair: ``SELECT x FROM t`` vs ``SELECT y FROM u`` scored
0.755, now 0.650); when only one side has children s_child is 0. Unmatched children
become SUBQUERY_ / CTE_ MISSING or REDUNDANT, or SET_OP_MISMATCH. Tags of matched pairs
are merged up the tree.

SET_OP (ours, where the paper gives no rule for operators): its operands are matched as
children and the operator counts as one more child, 1 when both use the same operator
(UNION, UNION ALL, INTERSECT, EXCEPT), else 0 and SET_OP_MISMATCH; a plain SELECT facing a
set operation is compared as a set operation of one operand without operator. So UNION vs
INTERSECT of the same operands scores 2/3, and a SELECT that is the first operand of a gold
``A EXCEPT B`` scores 1/3, instead of 0.
"""

from __future__ import annotations

from progress_sql.odt.settings import ODTSettings
from progress_sql.odt.profile import CTE, SELECT, SET_OP, SUBQUERY, Node, SelectProfile
from progress_sql.odt.tags import select_tags
from progress_sql.sql.parse import jaccard

_SETS = ("select", "tables", "joins", "where", "group_by", "having", "order_by")
_MISSING = {SUBQUERY: "SUBQUERY_MISSING", CTE: "CTE_MISSING"}
_REDUNDANT = {SUBQUERY: "SUBQUERY_REDUNDANT", CTE: "CTE_REDUNDANT"}
_QUERIES = (SELECT, SET_OP)


def num_sim(a: int, b: int) -> float:
    """NumSim(a, b) = 1 − min(1, |a − b| / max(1, b)), b the gold count."""
    return 1.0 - min(1.0, abs(a - b) / max(1, b))


def feature_sims(p: SelectProfile, g: SelectProfile) -> dict[str, float]:
    """Feature-level similarities of two SELECT profiles, keyed like ``ODTThresholds``
    (plus the four clause booleans ``has_where``, ``has_group_by``, ``has_having``,
    ``has_order_by``)."""
    sims = {name: jaccard(getattr(p, name), getattr(g, name)) for name in _SETS}
    sims["select_count"] = num_sim(p.select_count, g.select_count)
    sims["join_count"] = num_sim(p.join_count, g.join_count)
    for name in ("where", "group_by", "having", "order_by"):
        sims["has_" + name] = float(bool(getattr(p, name)) == bool(getattr(g, name)))
    sims["limit"] = float(p.limit == g.limit)
    sims["distinct"] = float(p.distinct == g.distinct)
    sims["aggregation"] = float(p.aggregation == g.aggregation)
    return sims


_BOOLEANS = ("has_where", "has_group_by", "has_having", "has_order_by", "limit", "aggregation", "distinct")
_COUNTS = ("join_count", "select_count")


class Comparison:
    """The score, tags and outermost SELECT features of one (pred, gold) subtree pair."""

    __slots__ = ("score", "tags", "features")

    def __init__(self, score: float, tags: list[str], features: dict[str, float] | None):
        self.score = score
        self.tags = tags
        self.features = features


class Scorer:
    """Compares ODTs under one ODTSettings (weights and thresholds read once)."""

    def __init__(self, settings: ODTSettings):
        w = settings.weights
        self.alpha = settings.alpha
        self.leaf_local = settings.leaf_score == "local"
        self.thresholds = settings.thresholds
        self.set_weights = [(name, getattr(w, name)) for name in _SETS]
        self.booleans = w.booleans / len(_BOOLEANS)
        self.counts = w.counts / len(_COUNTS)
        self.total = sum(weight for _, weight in self.set_weights) + w.booleans + w.counts

    def local(self, sims: dict[str, float]) -> float:
        total = sum(weight * sims[name] for name, weight in self.set_weights)
        total += self.booleans * sum(sims[name] for name in _BOOLEANS)
        total += self.counts * sum(sims[name] for name in _COUNTS)
        return total / self.total

    def compare(self, pred: Node, gold: Node) -> Comparison:
        """s_node of two compatible nodes, with the tags of the whole subtree pair."""
        if SET_OP in (pred.kind, gold.kind):
            return self.set_op(pred, gold)
        child_score, tags, features = self.children(pred.children, gold.children)
        if gold.kind != SELECT:
            return Comparison(child_score, tags, features)
        sims = feature_sims(pred.profile, gold.profile)
        local = self.local(sims)
        tags = select_tags(sims, pred.profile, gold.profile, self.thresholds) + tags
        features = {**sims, "s_local": local, "s_child": child_score}
        if self.leaf_local and not pred.children and not gold.children:
            return Comparison(local, tags, features)  # nothing nested on either side: no child term
        return Comparison(self.alpha * local + (1.0 - self.alpha) * child_score, tags, features)

    def set_op(self, pred: Node, gold: Node) -> Comparison:
        """Child matching over the operands, the operator counted as one more child; a plain
        SELECT facing a set operation is a one-operand set operation without operator."""
        p_ops = pred.children if pred.kind == SET_OP else (pred,)
        g_ops = gold.children if gold.kind == SET_OP else (gold,)
        total, tags, features = self.match(p_ops, g_ops)
        same_operator = pred.kind == gold.kind and pred.name == gold.name
        if not same_operator:
            tags.append("SET_OP_MISMATCH")
        score = (total + same_operator) / (max(len(p_ops), len(g_ops)) + 1)
        return Comparison(score, tags, features)

    def children(self, preds: tuple[Node, ...], golds: tuple[Node, ...]):
        """(s_child, tags, features of the first matched pair that has them)."""
        if not preds and not golds:
            return 1.0, [], None
        total, tags, features = self.match(preds, golds)
        return total / max(len(preds), len(golds)), tags, features

    def match(self, preds: tuple[Node, ...], golds: tuple[Node, ...]):
        """Greedy matching: (sum of matched scores, tags, first matched features)."""
        unmatched = list(range(len(preds)))
        total = 0.0
        tags: list[str] = []
        features = None
        for g in golds:
            best = best_i = None
            for i in unmatched:
                p = preds[i]
                if _compatible(p, g):
                    result = self.compare(p, g)
                    if best is None or result.score > best.score:
                        best, best_i = result, i
            if best is None:
                tags.append(_MISSING.get(g.kind, "SET_OP_MISMATCH"))
                continue
            unmatched.remove(best_i)
            total += best.score
            tags.extend(best.tags)
            if features is None:
                features = best.features
        for i in unmatched:
            tags.append(_REDUNDANT.get(preds[i].kind, "SET_OP_MISMATCH"))
        return total, tags, features


def _compatible(p: Node, g: Node) -> bool:
    # Query nodes (SELECT, SET_OP) match each other; CTEs match by name.
    if p.kind in _QUERIES and g.kind in _QUERIES:
        return True
    return p.kind == g.kind and p.name == g.name
