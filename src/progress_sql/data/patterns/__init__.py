"""The grammar of SQL patterns: families of query shapes, each with its questions.

A ``Family`` samples a ``Select`` on one database (tables, columns and values drawn from the
data, so filters hit rows) and words it (``ask``) through a ``Phraser``; several templates
and verbs per family, chosen per example, keep one SQL shape from having one question.
Families are grouped by the Spider hardness they aim at; the build records the hardness
``sql.hardness`` computes, not this aim.

Coverage: projections, filters (comparison, LIKE, IN, BETWEEN, IS [NOT] NULL, AND/OR), joins
along foreign keys (one to three hops), aggregation, GROUP BY / HAVING, ORDER BY / LIMIT,
nested subqueries (IN, NOT IN, scalar comparison), UNION / INTERSECT / EXCEPT, DISTINCT.
"""

from progress_sql.data.patterns import joins, single  # noqa: F401  (registers the families)
from progress_sql.data.patterns.base import FAMILIES, LEVELS, Family, ask, families_for
from progress_sql.data.patterns.context import DbContext, JoinPath, join_paths, make_cond, pick_filter

FAMILY_BY_NAME = {f.name: f for f in FAMILIES}

__all__ = ["DbContext", "FAMILIES", "FAMILY_BY_NAME", "Family", "JoinPath", "LEVELS", "ask", "families_for",
           "join_paths", "make_cond", "pick_filter"]
