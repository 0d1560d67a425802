"""Loaders for datasets a user has downloaded (Spider, BIRD, SynSQL-2.5M, Spider-Syn /
-Realistic / -DK) and the mixed training set; ``data.importing`` turns them into a corpus.

Every loader returns a ``LoadResult``: the split's ``Example`` records (hardness by the Spider
rules from the gold SQL, ``meta["db_path"]`` the SQLite file to run it on) and the records it
skipped, with reasons.
"""

from progress_sql.data.loaders.bird import BIRD_DIFFICULTIES, bird_database_path, load_bird
from progress_sql.data.loaders.mix import plan_mix
from progress_sql.data.loaders.reading import LoadResult, Skipped, iter_json_array
from progress_sql.data.loaders.spider import load_spider, spider_database_path, spider_tables_path
from progress_sql.data.loaders.spider_variants import load_spider_variant, spider_variant_file
from progress_sql.data.loaders.synsql import count_synsql_records, load_synsql, synsql_database_path

__all__ = [
    "BIRD_DIFFICULTIES",
    "LoadResult",
    "Skipped",
    "bird_database_path",
    "count_synsql_records",
    "iter_json_array",
    "load_bird",
    "load_spider",
    "load_spider_variant",
    "load_synsql",
    "plan_mix",
    "spider_database_path",
    "spider_tables_path",
    "spider_variant_file",
    "synsql_database_path",
]
