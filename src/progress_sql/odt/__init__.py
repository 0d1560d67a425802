"""Oracle-guided Diagnostic Tree (progress-sql.md, Appendix D; project choices in
docs/design.md): structural score F_struct, diagnostic tags and verbalised feedback.

Framework-free (sqlglot only): importable from any trainer or environment.
"""

from progress_sql.odt.cache import gold_profile
from progress_sql.odt.diagnose import Diagnosis, diagnose, structural_score
from progress_sql.odt.feedback import FALLBACK_FEEDBACK, FEEDBACK_TEMPLATE, feedback_text
from progress_sql.odt.profile import Node, SelectProfile, build_tree
from progress_sql.odt.tags import GOLD_UNAVAILABLE, PARSE_ERROR, TAGS, VALUE_MISMATCH

__all__ = [
    "Diagnosis",
    "FALLBACK_FEEDBACK",
    "FEEDBACK_TEMPLATE",
    "GOLD_UNAVAILABLE",
    "Node",
    "PARSE_ERROR",
    "SelectProfile",
    "TAGS",
    "VALUE_MISMATCH",
    "build_tree",
    "diagnose",
    "feedback_text",
    "gold_profile",
    "structural_score",
]
