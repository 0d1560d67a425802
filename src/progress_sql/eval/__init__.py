"""Evaluation: greedy / Vote@k / pass@k / multi-turn runs, EX and TS, reports and plots.

>>> from progress_sql.eval import run_eval
>>> result = run_eval(settings, "outputs/rl", "data/corpus", ["dev"], "reports/eval")  # doctest: +SKIP
>>> result.flat["dev/greedy/ex"], result.files["metrics"]                            # doctest: +SKIP

Modules: ``runner`` (``run_eval``), ``policies`` (model and oracle generators), ``scoring``
(batched EX / TS), ``voting`` (Vote@k, pass@k), ``metrics`` (aggregation), ``analysis`` (the
paper's Table 8), ``reports`` (JSON, Markdown, CSV, MLflow), ``plots`` (PNG), ``compare`` (two
runs paired by example: gained, lost, McNemar p). torch is imported only when a model (not the
oracle) is evaluated.
"""

from __future__ import annotations

from progress_sql.eval.policies import ORACLE, OracleGenerator
from progress_sql.eval.runner import SMOLLM2, EvalResult, run_eval
from progress_sql.eval.voting import VoteOutcome, pass_at_k, vote

__all__ = ["ORACLE", "SMOLLM2", "EvalResult", "OracleGenerator", "VoteOutcome", "pass_at_k", "run_eval", "vote"]
