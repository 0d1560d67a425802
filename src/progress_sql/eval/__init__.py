"""Evaluation: greedy / Vote@k / pass@k / multi-turn runs, EX and TS, reports and plots.

>>> from progress_sql.eval import run_eval
>>> result = run_eval(settings, "outputs/rl", "data/corpus", ["dev"], "reports/eval")  # doctest: +SKIP
>>> result.flat["dev/greedy/ex"], result.files["metrics"]                            # doctest: +SKIP

Modules: ``runner`` (``run_eval``), ``generators`` (what is evaluated: a model or the
oracle), ``voting`` (Vote@k, pass@k), ``metrics`` (the registry of
reported metrics), ``analysis`` (the paper's Table 8), ``reports`` (Markdown and CSV tables),
``plots`` (PNG), ``paired`` (two runs paired by example: gained, lost, McNemar p). torch is
imported only when a model (not the oracle) is evaluated; nothing here logs to MLflow
(``tracking.log_eval`` does, above this package).
"""

from __future__ import annotations

from progress_sql.eval.generators import ORACLE, OracleGenerator
from progress_sql.eval.runner import EvalResult, run_eval
from progress_sql.eval.voting import VoteOutcome, pass_at_k, vote

__all__ = ["ORACLE", "EvalResult", "OracleGenerator", "VoteOutcome", "pass_at_k", "run_eval", "vote"]
