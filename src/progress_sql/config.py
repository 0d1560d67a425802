"""The old name of ``progress_sql.params`` (the typed settings of params.yaml), kept for the
scripts and notebooks that import it from here: ``from progress_sql.config import Settings``."""

from progress_sql.params import *  # noqa: F401,F403
from progress_sql.params import __all__  # noqa: F401
