"""Progress-SQL: multi-turn RL post-training for Text-to-SQL with progressive rewards.

The task module (``progress_sql.sql``, ``.corpus``, ``.odt``, ``.formats``, ``.rewards``,
``.envs``) is pure Python over sqlglot and SQLite: importable without torch or MLflow. The
layers and what each holds: docs/architecture.md.
"""

__version__ = "0.1.0"
