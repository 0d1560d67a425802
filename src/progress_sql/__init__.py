"""Progress-SQL: multi-turn RL post-training for Text-to-SQL with progressive rewards.

The task module (``progress_sql.sql``, ``progress_sql.odt``, ``progress_sql.rewards``) is
pure Python over sqlglot and SQLite: importable without torch or MLflow.
"""

__version__ = "0.1.0"
