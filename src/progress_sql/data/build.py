"""Build the bundled default corpus from a seed: databases, examples, splits, variants,
test-suite neighbours, ``tables.json`` and ``manifest.json``.

Layout (``records.CorpusLayout``)::

    databases/<db_id>/<db_id>.sqlite   one per chosen domain
    tables.json                        Spider-format schemas
    train.jsonl dev.jsonl test.jsonl   examples; dev/test databases never appear in train
    indomain.jsonl                     unseen questions on the train databases (data.indomain_size):
                                       no gold SQL or question of train on the same database
    variants/{syn,realistic,dk}.jsonl  robustness suite from dev + test
    neighbours/<db_id>/<k>.sqlite      k fuzzed neighbours per dev/test database
    manifest.json                      seed, settings, counts, hardness, coverage, hashes

The build writes into a folder beside ``out_dir`` and swaps it in whole at the end
(``files.written_aside``), so a failed build (a full disk too) leaves the previous corpus (or
nothing) and never half a corpus. The
same seed and settings give byte-identical JSONL, tables.json and manifest, and databases
with identical content (``generate_db.database_fingerprint``).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from progress_sql.params import DataSettings, Settings
from progress_sql.data.domains import CATALOGUE, Domain
from progress_sql.data.domains.renaming import renamed_copies
from progress_sql.data.drafting import Draft, draw_examples
from progress_sql.data.generate_db import database_fingerprint, generate_rows, spider_schema, write_database
from progress_sql.data.naming import names_table
from progress_sql.data.neighbours import query_literals, write_neighbours
from progress_sql.data.realize import realize
from progress_sql.data.patterns import LEVELS, DbContext
from progress_sql.data.query import tables_of
from progress_sql.corpus.integrity import sha256_file  # the manifest's hashes, checked by the same module
from progress_sql.corpus.records import CORPUS_SPLITS, INDOMAIN, SPLITS, CorpusError, CorpusLayout, write_jsonl
from progress_sql.sources import VARIANTS
from progress_sql.data.variants import build_variants
from progress_sql.files import written_aside
from progress_sql.sql.sandbox import clear_connection_cache

MANIFEST_FORMAT = 1
# data.* settings the bundled build does not read (the import's, and where the corpus goes):
# left out of its manifest, so the bundled corpus does not change when they do.
NOT_BUNDLED_SETTINGS = frozenset({"out_dir", "source", "mix", "mix_total", "max_failing_gold_share",
                                  "max_tables_named_share"}
                                 | {name for name in DataSettings.model_fields if name.startswith("import_")})


def split_domains(settings: Settings) -> dict[str, list[Domain]]:
    """The databases of each split, as the build spells them (``realize``): the catalogue's
    families shuffled by the seed, one domain of each of the first ``data.n_dev_databases``
    families for dev, of the next ``data.n_test_databases`` for test; train takes the other
    families' domains a family at a time (one of each, then a second of each, ...), followed by
    ``data.renamed_copies`` renamed copies of each. No train database shares a family (a
    vocabulary) with dev or test. Each split sorted by name."""
    data = settings.data
    families: dict[str, list[Domain]] = {}
    for domain in CATALOGUE:
        families.setdefault(domain.family_name, []).append(domain)
    rng = random.Random(f"{data.seed}:domains")
    order = list(families)
    rng.shuffle(order)
    for name in order:
        rng.shuffle(families[name])
    n_held = data.n_dev_databases + data.n_test_databases
    n_train = data.n_databases - n_held
    pool: list[Domain] = []  # the train candidates: a domain of each family, then a second of each, ...
    for rank in range(max(map(len, families.values()))):
        pool += [families[f][rank] for f in order[n_held:] if rank < len(families[f])]
    if n_held > len(order) or n_train > len(pool):
        raise CorpusError(f"data.n_databases is {data.n_databases} but the bundled catalogue has {len(CATALOGUE)} "
                          f"domains in {len(families)} families, and dev and test take a family per database: "
                          f"at most {n_held + len(pool)} databases with {n_held} held out")
    dev = sorted((families[f][0] for f in order[: data.n_dev_databases]), key=lambda d: d.name)
    test = sorted((families[f][0] for f in order[data.n_dev_databases : n_held]), key=lambda d: d.name)
    train = sorted(pool[:n_train], key=lambda d: d.name)
    train += renamed_copies(train, data.renamed_copies, dev + test, data.seed, data.renamed_column_share)

    def spelled(domains: list[Domain]) -> list[Domain]:
        return [realize(d, data.seed, data.naming_styles, data.messy_share, data.schema_word_share) for d in domains]
    return {"train": spelled(train), "dev": spelled(dev), "test": spelled(test)}


def build_corpus(settings: Settings, out_dir: str | Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Build the corpus into ``out_dir`` (default ``data.out_dir``) atomically; the manifest."""
    out = Path(out_dir if out_dir is not None else settings.data.out_dir)
    return build_atomically(out, lambda layout: _build_into(layout, settings, progress))


def build_atomically(out: Path, build: Callable[[CorpusLayout], dict[str, Any]]) -> dict[str, Any]:
    """``build(layout)`` into a folder beside ``out``, then swapped in whole
    (``files.written_aside``): a failed build leaves ``out`` as it was, and a full disk (SQLite's
    "database or disk is full" too) ends as an OSError naming ``out``. Returns the manifest."""
    try:
        with written_aside(out) as tmp:
            return build(CorpusLayout(tmp))
    finally:
        clear_connection_cache()  # the sandbox's cached connections point into the folder aside


def _build_into(layout: CorpusLayout, settings: Settings, progress: bool) -> dict[str, Any]:
    started = time.perf_counter()
    data = settings.data
    by_split = split_domains(settings)
    sizes = {"train": data.train_size, "dev": data.dev_size, "test": data.test_size, INDOMAIN: data.indomain_size}
    n_neighbours = data.neighbours * (data.n_dev_databases + data.n_test_databases)
    total = sum(map(len, by_split.values())) + sum(sizes.values()) + n_neighbours + 1
    bar = tqdm(total=total, desc="build corpus", unit="step", disable=not progress, leave=False)
    try:
        contexts: dict[str, list[DbContext]] = {}
        bar.set_postfix_str("databases")
        for split, domains in by_split.items():
            contexts[split] = []
            for domain in domains:
                rows = generate_rows(domain, data.seed, data.rows_scale)
                path = layout.database(domain.name)
                write_database(path, domain, rows)
                contexts[split].append(DbContext(domain.name, domain, rows, path))
                bar.update()
        all_domains = sorted((d for ds in by_split.values() for d in ds), key=lambda d: d.name)
        layout.tables_json.write_text(_json([spider_schema(d) for d in all_domains]), encoding="utf-8")

        drafts: dict[str, list[Draft]] = {}
        draw_stats: dict[str, dict] = {}
        for split in SPLITS:
            bar.set_postfix_str(f"{split} examples")
            drafts[split], stats = draw_examples(split, contexts[split], sizes[split], settings, bar.update)
            draw_stats[split] = {"attempts": stats.attempts, "rejected": dict(sorted(stats.rejected.items()))}
            write_jsonl(layout.split(split), (d.example for d in drafts[split]))
        # In-domain: drawn after train with its own seeded stream (train, dev and test stay as
        # they are), on the train databases, repeating no train gold or question there.
        bar.set_postfix_str(f"{INDOMAIN} examples")
        drafts[INDOMAIN], stats = draw_examples(INDOMAIN, contexts["train"], sizes[INDOMAIN], settings, bar.update,
                                                exclude=[d.example for d in drafts["train"]])
        draw_stats[INDOMAIN] = {"attempts": stats.attempts, "rejected": dict(sorted(stats.rejected.items()))}
        write_jsonl(layout.split(INDOMAIN), (d.example for d in drafts[INDOMAIN]))

        bar.set_postfix_str("variants")
        variants, coverage = build_variants(drafts["dev"] + drafts["test"], settings)
        for name in VARIANTS:
            write_jsonl(layout.variant(name), variants[name])
        bar.update()

        bar.set_postfix_str("neighbours")
        neighbours: dict[str, list[str]] = {}
        held_out = drafts["dev"] + drafts["test"]
        for ctx in contexts["dev"] + contexts["test"]:
            literals = query_literals((d.select for d in held_out if d.ctx is ctx), ctx.domain)
            paths = write_neighbours(layout, ctx.db_id, ctx.domain, ctx.rows, data.neighbours, settings, literals)
            neighbours[ctx.db_id] = [database_fingerprint(p) for p in paths]
            bar.update(len(paths))
    finally:
        bar.close()

    manifest = _manifest(layout, settings, by_split, contexts, drafts, draw_stats, variants, coverage, neighbours)
    layout.manifest.write_text(_json(manifest), encoding="utf-8")
    manifest["build_seconds"] = round(time.perf_counter() - started, 3)  # returned, not written
    return manifest


def table_mentions(drafts: list[Draft]) -> dict[str, float]:
    """How often a question names its gold query's tables (``naming.names_table``): per table
    (``tables``: the share of a split's (question, gold table) pairs), and per question, all of
    them (``all``) or at least one (``any``)."""
    named = [[names_table(d.example.question, t) for t in sorted(tables_of(d.select))] for d in drafts]
    pairs = [x for tables in named for x in tables]

    def share(hits: list[bool]) -> float:
        return round(sum(hits) / len(hits), 4) if hits else 0.0
    return {"tables": share(pairs), "all": share([all(x) for x in named]), "any": share([any(x) for x in named])}


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _manifest(layout: CorpusLayout, settings: Settings, by_split: dict[str, list[Domain]],
              contexts: dict[str, list[DbContext]], drafts: dict[str, list[Draft]], draw_stats: dict,
              variants: dict, coverage: dict, neighbours: dict[str, list[str]]) -> dict[str, Any]:
    splits = {}
    for split in CORPUS_SPLITS:
        ds = drafts[split]
        hardness = Counter(d.example.hardness for d in ds)
        domains = by_split["train" if split == INDOMAIN else split]
        splits[split] = {
            "databases": [d.name for d in domains],
            "families": sorted({d.family_name for d in domains}),
            "names_tables": table_mentions(ds),
            "examples": len(ds),
            "hardness": {k: hardness.get(k, 0) for k in LEVELS},
            "empty_gold": sum(d.empty for d in ds),
            "with_evidence": sum(bool(d.example.evidence) for d in ds),
            "patterns": dict(sorted(Counter(d.family for d in ds).items())),
            "draw": draw_stats[split],
        }
    databases = {
        ctx.db_id: {
            "split": split,
            "family": ctx.domain.family_name,
            "style": ctx.domain.style,
            "messy": ctx.domain.messy,
            "rows": {t: len(r) for t, r in ctx.rows.items()},
            "fingerprint": database_fingerprint(ctx.path),
        }
        for split in SPLITS for ctx in contexts[split]
    }
    styles = Counter(info["style"] for info in databases.values())
    files = [layout.tables_json] + [layout.split(s) for s in CORPUS_SPLITS] + [layout.variant(v) for v in VARIANTS]
    return {
        "format": MANIFEST_FORMAT,
        "source": "bundled",
        "seed": settings.data.seed,
        "settings": settings.data.model_dump(exclude=NOT_BUNDLED_SETTINGS),
        "catalogue": {"domains": len(CATALOGUE), "families": len({d.family_name for d in CATALOGUE})},
        "naming": {
            "styles": dict(sorted(styles.items())),
            "cases": dict(sorted(Counter(style.split("+")[0] for style in styles.elements()).items())),
            "messy_databases": sum(info["messy"] for info in databases.values()),
        },
        "splits": splits,
        "variants": {v: {"examples": len(variants[v]), "coverage": round(coverage[v], 4)} for v in VARIANTS},
        "databases": databases,
        "neighbours": neighbours,
        "files": {str(p.relative_to(layout.root)): sha256_file(p) for p in files},
    }


__all__ = ["MANIFEST_FORMAT", "NOT_BUNDLED_SETTINGS", "build_atomically", "build_corpus", "split_domains",
           "table_mentions"]
