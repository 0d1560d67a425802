"""Adapters that let other RL frameworks train with this project's rewards and environments.

>>> from progress_sql.integrations import trl, verl, skyrl_gym   # doctest: +SKIP

- ``trl``: reward functions with TRL's signature for the single-turn recipes, and the
  ODT-feedback and SQL-tool protocols as TRL environments (``environment_factory``), whose
  feedback TRL masks as tool output (docs/integrations/trl.md).
- ``verl``: ``compute_score`` for verl's custom reward function hook, the ODT feedback as a
  verl interaction (Algorithm 1 in verl's agent loop), and the corpus as verl's parquet files
  (docs/integrations/verl.md).
- ``skyrl_gym``: the two protocols as SkyRL-gym text environments, registered as
  ``progress-sql-odt`` and ``progress-sql-sql-tool`` (docs/integrations/skyrl.md).

What every adapter shares lives in ``scoring`` (one completion, one reward; a batch through the
SQL process pool), ``sessions`` (one multi-turn episode of an environment) and ``tasks`` (the
dataset rows: prompt, database, gold). Bad input (a completion without SQL, a missing database,
a gold query that fails, anything that raises) gets the recipe's floor reward with the reason in
its metadata, never an exception into the framework's loop. SQL runs only in the read-only
sandbox, each query stopped at ``sandbox.timeout_s``.

Each adapter imports its framework inside the functions and classes that need it, so importing
this package or any adapter module imports no torch, MLflow or trainer.
"""
