"""Import datasets on disk into the corpus layout the trainer and the evaluation read
(``progress-sql data import``, or ``data build`` with ``data.source: import``).

The datasets, in their published layouts, are the registered sources (``progress_sql.sources``),
each read from the folder (or file) ``data.import_<name>`` names ("" when not given): Spider, BIRD
and SynSQL-2.5M give train and dev/test sets; Spider-Syn, -Realistic and -DK give the ``syn``,
``realistic`` and ``dk`` splits (empty when not given: an import generates no variants).
Spider's ``test_suite_database/<db_id>/*.sqlite`` (or ``data.import_test_suite``) become the TS
neighbours of the dev/test databases.

What the corpus gets:

- train: ``data.mix_total`` examples drawn from the union of the given train sets
  (``data.import_train``; a folder with the dev set alone gives none, and without any the
  corpus is evaluation-only: train empty, ``train_draw.evaluation_only``), seeded by ``data.seed``: uniformly over the union
  (``data.import_sampling: random``, progress-sql.md Appendix B) or by the fixed shares
  ``data.mix`` (``shares``). SynSQL is drawn by record position, so only the drawn records are
  converted. A drawn example whose gold fails on its database (an SQLite error, or no result
  within ``data.gold_timeout_s``) is dropped and the next one in the draw order takes its place.
- dev / test: the dev (and Spider test) sets of ``data.import_eval``; golds that fail are kept
  (they count as wrong for every model, as in the official evaluators) and reported.
- indomain: none, written empty (``indomain.jsonl``, like a variant not given). Spider's and
  BIRD's dev sets already measure cross-database accuracy on real data; the bundled corpus's
  in-domain split exists so that the tiny CPU policy shows movement. The evaluation skips an
  empty split with a note.
- every example's ``semantics`` (``sql.verdict``): its source's (``spider`` for Spider and its
  variants, ``bird`` for BIRD and SynSQL). The manifest's ``semantics`` names the corpus's one
  semantics, or ``mixed`` when examples differ (each then carries its own).
- ``databases/<db_id>/<db_id>.sqlite``: the databases the examples use, copied (or linked,
  ``data.import_databases: symlink``); ``tables.json``: their entries from the sources'
  tables files; ``neighbours/``; ``manifest.json``; ``import_report.json``: every failing gold
  by id with its error, every record dropped and why.

The failing golds over all checked (train candidates and dev/test) may be at most
``data.max_failing_gold_share``; above it the import fails. Bad input (a missing file, a record
without its gold, a ``db_id`` without a database, a file that is not SQLite, one ``db_id`` for
two different databases) is a CorpusError naming the file and the record. Sources are only
read; the corpus is written beside ``out_dir`` and renamed into place at the end, so a failed
import leaves the previous corpus (or nothing).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from progress_sql import sources
from progress_sql.params import Settings
from progress_sql.corpus.integrity import SQLITE_HEADER, sha256_file
from progress_sql.corpus.records import INDOMAIN, SPLITS, CorpusError, CorpusLayout, Example, write_jsonl
from progress_sql.corpus.schema import schema_from_spider
from progress_sql.data.build import MANIFEST_FORMAT, build_atomically
from progress_sql.data.mix import plan_mix
from progress_sql.sources import VARIANTS, Loaded, LoadResult, TrainSet
from progress_sql.sql import HARDNESS_LEVELS, SQLPool
from progress_sql.sql.verdict import comparison_sql

log = logging.getLogger(__name__)


def given_sources(settings: Settings) -> dict[str, Path]:
    """The registered sources ``data.import_<name>`` gives a path for, by name, in registry order."""
    data = settings.data
    return {s.name: Path(getattr(data, s.setting)).expanduser() for s in sources.SOURCES if getattr(data, s.setting)}


def import_corpus(settings: Settings, out_dir: str | Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Import the datasets of ``data.import_*`` into ``out_dir`` (default ``data.out_dir``)
    atomically; the manifest (plus ``build_seconds``, not written)."""
    out = Path(out_dir if out_dir is not None else settings.data.out_dir)
    given = given_sources(settings)
    if not any(s.name in given for s in sources.datasets()):
        raise CorpusError(f"no dataset to import: set {sources.dataset_settings()}")
    for path in given.values():
        root = (path if path.is_dir() else path.parent).resolve()
        if out.resolve().is_relative_to(root) or root.is_relative_to(out.resolve()):
            raise CorpusError(f"{out}: the corpus folder and the dataset folder {root} overlap; sources are "
                              "read-only and the corpus folder is replaced: choose another --out")
    started = time.perf_counter()

    def build(layout: CorpusLayout) -> dict[str, Any]:
        with SQLPool(settings.sandbox.workers, settings=settings.sandbox) as pool:
            return _Importer(settings, layout, given, pool, progress).run()

    manifest = build_atomically(out, build)
    manifest["build_seconds"] = round(time.perf_counter() - started, 3)
    return manifest


# ----------------------------------------------------------------------------- the train draw
class _Order:
    """A seeded draw order over ``(dataset, position)`` pairs, decoded lazily (a permutation of
    2.5M positions is a list of ints, not of tuples)."""

    def __init__(self, names: Sequence[str], sizes: Sequence[int], seed: str) -> None:
        self.names = list(names)
        self.starts = [sum(sizes[:i]) for i in range(len(sizes))]
        total = sum(sizes)
        self.perm = random.Random(seed).sample(range(total), total)

    def __len__(self) -> int:
        return len(self.perm)

    def decode(self, start: int, stop: int) -> list[tuple[str, int]]:
        out = []
        for flat in self.perm[start:stop]:
            i = bisect.bisect_right(self.starts, flat) - 1
            out.append((self.names[i], flat - self.starts[i]))
        return out


def _hash_copy(src: Path, dest: Path) -> str:
    """Copy ``src`` to ``dest`` (reading the source once); the sha256 of the bytes."""
    digest = hashlib.sha256()
    with src.open("rb") as fin, dest.open("wb") as fout:
        for block in iter(lambda: fin.read(1 << 20), b""):
            digest.update(block)
            fout.write(block)
    return digest.hexdigest()


def _describe(record: Loaded) -> str:
    return f"{record.example.id} ({record.where})"


def _examples(records: Sequence[Loaded]) -> list[Example]:
    return [record.example for record in records]


class _Importer:
    def __init__(self, settings: Settings, layout: CorpusLayout, given: dict[str, Path], pool: SQLPool,
                 progress: bool) -> None:
        self.data = settings.data
        self.layout, self.given, self.pool = layout, given, pool
        self.datasets = {s.name: given[s.name] for s in sources.datasets() if s.name in given}
        self.progress = progress
        self.db_sources: dict[str, Path] = {}  # db_id → the source file it was taken from
        self.db_info: dict[str, dict[str, Any]] = {}
        self.failing: list[dict[str, Any]] = []  # golds that do not execute, by id
        self.dropped: list[dict[str, Any]] = []  # records left out by a reader (gold does not parse)
        self.checked = 0
        self.draw: dict[str, Any] = {}

    # -- reading the sources
    def _accept(self, loaded: LoadResult, source: str) -> list[Loaded]:
        """The loaded records; a record without its database is an error, one whose gold
        does not parse is dropped and reported (its dataset named as the option of ``data import``)."""
        for skip in loaded.skipped:
            if skip.reason.startswith("database missing"):
                path = skip.reason.split(": ", 1)[1]
                raise CorpusError(f"{skip.where or skip.id}: db_id has no database ({path} not found)")
            self.dropped.append({"id": skip.id, "dataset": sources.get(source).option, "split": loaded.split,
                                 "where": skip.where, "reason": skip.reason})
        return loaded.records

    def _train_sets(self) -> dict[str, TrainSet]:
        """The train sets ``data.import_train`` names, of those given whose folder holds one (a
        folder with a dev set alone gives none; one read whole is accepted here, before the draw)."""
        train_sets: dict[str, TrainSet] = {}
        for name in self.data.import_train:
            if name in self.datasets and sources.get(name).train_in(self.datasets[name]):
                train_sets[name] = sources.get(name).train(self.datasets[name])
                if train_sets[name].whole is not None:
                    self._accept(train_sets[name].whole, name)
        return train_sets

    def _eval_sets(self) -> tuple[list[Loaded], list[Loaded]]:
        """The dev and test sets of the sources ``data.import_eval`` names, of those given."""
        held_out: dict[str, list[Loaded]] = {"dev": [], "test": []}
        for name in self.data.import_eval:
            if name in self.datasets:
                for split, loaded in sources.get(name).evaluation(self.datasets[name]).items():
                    held_out[split] += self._accept(loaded, name)
        if not held_out["dev"]:
            raise CorpusError(f"no dev set: data.import_eval is {list(self.data.import_eval)}, and of those only "
                              f"{', '.join(n for n in self.data.import_eval if n in self.datasets) or 'none'} given")
        return held_out["dev"], held_out["test"]

    def _variants(self) -> dict[str, list[Loaded]]:
        """The robustness splits of the variant sources given."""
        out: dict[str, list[Loaded]] = {}
        for source in sources.SOURCES:
            if source.variant and source.name in self.given:
                loaded = source.read_variant(self.given[source.name], self.datasets)
                out[source.variant] = self._accept(loaded, source.name)
        return out

    # -- the train draw
    def _draw_train(self, bar: tqdm) -> list[Loaded]:
        """``data.mix_total`` train examples drawn by ``data.import_sampling``, seeded; a drawn
        one whose gold fails is replaced by the next in its stream's order."""
        data = self.data
        train_sets = self._train_sets()
        names = sorted(train_sets)
        sizes = {name: train_sets[name].size for name in names}
        if not train_sets:  # an evaluation-only import
            self.draw = {"sampling": data.import_sampling, "total": 0, "available": {}, "planned": None,
                         "examined": 0, "drawn": {}, "evaluation_only": True}
            log.warning("import: no train set in %s (data.import_train: %s): an evaluation-only corpus, train empty",
                        ", ".join(sorted(self.datasets)), ", ".join(data.import_train))
            return []
        if data.import_sampling == "random":
            plan = None
            streams = [(data.mix_total, _Order(names, [sizes[n] for n in names], f"{data.seed}:import:union"))]
        else:
            plan = plan_mix(sizes, {name: getattr(data.mix, name) for name in names}, data.mix_total)
            streams = [(plan[n], _Order([n], [sizes[n]], f"{data.seed}:import:{n}")) for n in names]
        chosen: list[Loaded] = []
        examined = 0
        for quota, order in streams:
            kept, seen = self._draw_stream(train_sets, quota, order, bar)
            chosen += kept
            examined += seen
        if plan is not None:
            random.Random(f"{data.seed}:import:order").shuffle(chosen)
        if not chosen:
            raise CorpusError(f"no usable train example in {', '.join(names)}: every drawn gold failed or did not parse "
                              f"(see the failing golds: {', '.join(f['id'] for f in self.failing[:5]) or 'none'})")
        if len(chosen) < data.mix_total:
            log.warning("import: %d train examples, fewer than data.mix_total %d (the train sets hold no more "
                        "usable ones)", len(chosen), data.mix_total)
        self.draw = {"sampling": data.import_sampling, "total": data.mix_total, "available": sizes, "planned": plan,
                     "examined": examined, "drawn": dict(sorted(Counter(r.example.source for r in chosen).items()))}
        return chosen

    def _draw_stream(self, train_sets: dict[str, TrainSet], quota: int, order: _Order,
                     bar: tqdm) -> tuple[list[Loaded], int]:
        """Up to ``quota`` records whose gold executes, in ``order``; and how many were examined."""
        kept: list[Loaded] = []
        cursor = examined = 0
        while len(kept) < quota and cursor < len(order):
            batch = order.decode(cursor, cursor + quota - len(kept))
            cursor += len(batch)
            by_name: dict[str, list[int]] = {}
            for name, position in batch:
                by_name.setdefault(name, []).append(position)
            taken = {}
            for name, positions in by_name.items():
                taken[name], loaded = train_sets[name].take(positions)
                if loaded is not None:
                    self._accept(loaded, name)
            candidates = [taken[name][pos] for name, pos in batch if pos in taken[name]]
            examined += len(candidates)
            self._place(candidates)
            kept += [r for r, ok in zip(candidates, self._check(_examples(candidates), "train")) if ok]
            bar.set_postfix_str(f"train {len(kept)}/{quota}")
        return kept, examined

    # -- databases
    def _install(self, src: Path, dest: Path) -> str:
        """Copy (or link, ``data.import_databases``) the database ``src`` to ``dest``; its sha256."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        if self.data.import_databases == "symlink":
            dest.symlink_to(src.resolve())
            return sha256_file(src)
        return _hash_copy(src, dest)

    def _place(self, records: Sequence[Loaded]) -> None:
        """Copy (or link) the databases of ``records`` into the corpus, once each."""
        for record in records:
            src, db_id = record.db_path, record.example.db_id
            known = self.db_sources.get(db_id)
            if known is not None:
                if known != src and not _same_file(known, src):
                    raise CorpusError(f"{_describe(record)}: db_id {db_id!r} names two different databases, "
                                      f"{known} and {src}")
                continue
            _require_sqlite(src, _describe(record))
            digest = self._install(src, self.layout.database(db_id))
            self.db_sources[db_id] = src
            self.db_info[db_id] = {"source": str(src), "bytes": src.stat().st_size, "sha256": digest}

    def _check(self, examples: Sequence[Example], split: str) -> list[bool]:
        """Run each gold on its corpus database within ``data.gold_timeout_s`` as evaluation
        runs it (its comparison view under its semantics: Spider's gold ``! =`` is joined, as
        the test-suite evaluator does); failures are recorded (with the SQLite error) and False."""
        jobs = [(str(self.layout.database(ex.db_id)), comparison_sql(ex.gold_sql, ex.semantics)) for ex in examples]
        unique = list(dict.fromkeys(jobs))
        results = dict(zip(unique, self.pool.map(unique, timeout_s=self.data.gold_timeout_s)))
        oks = []
        for ex, job in zip(examples, jobs):
            result = results[job]
            self.checked += 1
            if not result.ok:
                self.failing.append({"id": ex.id, "db_id": ex.db_id, "split": split, "error": result.error,
                                     "message": result.message,
                                     "action": "dropped from train" if split == "train" else "kept"})
            oks.append(result.ok)
        return oks

    def _test_suite_folder(self) -> Path | None:
        """``data.import_test_suite``, or the test-suite folder of a dataset given (Spider's)."""
        if self.data.import_test_suite:
            folder = Path(self.data.import_test_suite).expanduser()
            if not folder.is_dir():
                raise CorpusError(f"{folder}: test-suite folder not found")
            return folder
        folders = [root / sources.get(name).test_suite for name, root in self.datasets.items()
                   if sources.get(name).test_suite]
        return next((folder for folder in folders if folder.is_dir()), None)

    def _neighbours(self, examples: Sequence[Example]) -> dict[str, list[str]]:
        """Test-suite databases of the Spider-semantics eval databases, as neighbours."""
        folder = self._test_suite_folder()
        if folder is None:
            return {}
        out: dict[str, list[str]] = {}
        for db_id in sorted({ex.db_id for ex in examples if ex.semantics == "spider"}):
            files = sorted(p for p in (folder / db_id).glob("*.sqlite") if p.name != f"{db_id}.sqlite")
            digests = []
            for k, src in enumerate(files, 1):
                _require_sqlite(src, f"test-suite database of {db_id}")
                digests.append(self._install(src, self.layout.root / "neighbours" / db_id / f"{k}.sqlite"))
            if digests:
                out[db_id] = digests
        return out

    def _tables(self, records: Sequence[Loaded]) -> list[dict]:
        """The tables.json entries of the used databases, from each record's source file."""
        files: dict[Path, dict[str, tuple[dict, str]]] = {}
        entries: dict[str, dict] = {}
        for record in records:
            path, db_id = record.tables_json, record.example.db_id
            if db_id in entries or path is None or not path.is_file():
                continue
            if path not in files:
                files[path] = _tables_file(path)
            found = files[path].get(db_id)
            if found is not None:
                schema_from_spider(*found)  # a malformed entry is named here, not at training time
                entries[db_id] = found[0]
        return [entries[db_id] for db_id in sorted(entries)]

    # -- the whole import
    def run(self) -> dict[str, Any]:
        bar = tqdm(desc="import", unit="step", disable=not self.progress, leave=False)
        try:
            bar.set_postfix_str("dev/test")
            dev, test = self._eval_sets()
            variants = self._variants()
            held_out = dev + test + [r for v in variants.values() for r in v]
            self._place(held_out)
            bar.set_postfix_str("dev/test golds")
            for split, records in (("dev", dev), ("test", test), *sorted(variants.items())):
                self._check(_examples(records), split)
            train = self._draw_train(bar)
            bar.set_postfix_str("neighbours")
            neighbours = self._neighbours(_examples(held_out))
        finally:
            bar.close()
        self._enforce_failing_share()
        splits = {"train": _examples(train), "dev": _examples(dev), "test": _examples(test)}
        self._write(splits, {name: _examples(records) for name, records in variants.items()}, train + held_out)
        manifest = self._manifest(splits, {name: _examples(v) for name, v in variants.items()}, neighbours)
        self.layout.manifest.write_text(_json(manifest), encoding="utf-8")
        return manifest

    def _write(self, splits: dict[str, list[Example]], variants: dict[str, list[Example]],
               everything: Sequence[Loaded]) -> None:
        """The split files, the variants, tables.json and the import report."""
        layout = self.layout
        for name, examples in splits.items():
            write_jsonl(layout.split(name), examples)
        write_jsonl(layout.split(INDOMAIN), ())  # none: see the module notes
        for name in VARIANTS:
            write_jsonl(layout.variant(name), variants.get(name, []))
        layout.tables_json.write_text(_json(self._tables(everything)), encoding="utf-8")
        report = {"gold_check": self._gold_check(), "failing": self.failing, "dropped": self.dropped,
                  "train_draw": self.draw}
        layout.import_report.write_text(_json(report), encoding="utf-8")

    def _gold_check(self) -> dict[str, Any]:
        failing = len(self.failing)
        return {
            "checked": self.checked,
            "failing": failing,
            "share": round(failing / self.checked, 6) if self.checked else 0.0,
            "max_share": self.data.max_failing_gold_share,
            "timeout_s": self.data.gold_timeout_s,
            "dropped_from_train": sum(f["split"] == "train" for f in self.failing),
            "kept_in_eval": sum(f["split"] != "train" for f in self.failing),
            "by_error": dict(sorted(Counter(str(f["error"]) for f in self.failing).items())),
            "unparsed_dropped": len(self.dropped),
        }

    def _enforce_failing_share(self) -> None:
        check = self._gold_check()
        if check["share"] > self.data.max_failing_gold_share:
            shown = ", ".join(f"{f['id']} ({f['error']}: {f['message'][:80]})" for f in self.failing[:5])
            raise CorpusError(f"{check['failing']} of {check['checked']} gold queries ({check['share']:.1%}) fail on "
                              f"their databases, above data.max_failing_gold_share "
                              f"{self.data.max_failing_gold_share:.1%}: {shown}")

    def _manifest(self, splits: dict[str, list[Example]], variants: dict[str, list[Example]],
                  neighbours: dict[str, list[str]]) -> dict[str, Any]:
        data = self.data
        layout = self.layout
        split_of = {ex.db_id: name for name, exs in splits.items() for ex in exs}
        variant_files = {s.variant: getattr(data, s.setting) or None for s in sources.SOURCES if s.variant}
        all_examples = [ex for exs in (*splits.values(), *variants.values()) for ex in exs]
        kinds = sorted({ex.semantics for ex in all_examples})
        files = [layout.tables_json, layout.import_report, *(layout.split(s) for s in (*SPLITS, INDOMAIN)),
                 *(layout.variant(v) for v in VARIANTS)]
        settings = {k: v for k, v in data.model_dump().items()
                    if k.startswith("import_") or k in ("source", "seed", "mix_total", "mix", "max_failing_gold_share",
                                                        "gold_timeout_s")}
        return {
            "format": MANIFEST_FORMAT,
            "source": "import",
            "semantics": kinds[0] if len(kinds) == 1 else "mixed",
            "datasets": {name: str(path) for name, path in sorted(self.datasets.items())},
            "seed": data.seed,
            "settings": settings,
            "splits": {name: _split_info(examples) for name, examples in splits.items()},
            "train_draw": self.draw,
            "variants": {v: {"examples": len(variants.get(v, [])), "file": variant_files.get(v)} for v in VARIANTS},
            "databases": {db: {"split": split_of.get(db, "variant"), **self.db_info[db]} for db in sorted(self.db_info)},
            "neighbours": neighbours,
            "gold_check": self._gold_check(),
            "files": {str(p.relative_to(layout.root)): sha256_file(p) for p in files},
        }


def _split_info(examples: Sequence[Example]) -> dict[str, Any]:
    """What the manifest says of one split."""
    levels = Counter(ex.hardness for ex in examples)
    return {
        "databases": sorted({ex.db_id for ex in examples}),
        "examples": len(examples),
        "hardness": {k: levels.get(k, 0) for k in HARDNESS_LEVELS},
        "semantics": dict(sorted(Counter(ex.semantics for ex in examples).items())),
        "sources": dict(sorted(Counter(ex.source for ex in examples).items())),
        "difficulty": dict(sorted(Counter(ex.difficulty for ex in examples if ex.difficulty).items())),
        "with_evidence": sum(bool(ex.evidence) for ex in examples),
    }


def _tables_file(path: Path) -> dict[str, tuple[dict, str]]:
    """A tables.json file's entries by ``db_id``, each with where it stands (for messages)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorpusError(f"{path}: cannot read ({err})") from None
    if not isinstance(raw, list):
        raise CorpusError(f"{path}: expected a JSON list of databases, got {type(raw).__name__}")
    return {e["db_id"]: (e, f"{path}: record {i}") for i, e in enumerate(raw)
            if isinstance(e, dict) and isinstance(e.get("db_id"), str)}


def _require_sqlite(path: Path, used_by: str) -> None:
    try:
        with path.open("rb") as fh:
            header = fh.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        raise CorpusError(f"{path}: database not found (used by {used_by})") from None
    except OSError as err:
        raise CorpusError(f"{path}: cannot read ({err}; used by {used_by})") from None
    if header != SQLITE_HEADER:
        raise CorpusError(f"{path}: not a SQLite database (used by {used_by})")


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
        return a.stat().st_size == b.stat().st_size and sha256_file(a) == sha256_file(b)
    except OSError:
        return False


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def summary_lines(manifest: dict[str, Any], out: str | Path) -> list[str]:
    """What ``progress-sql data import`` prints about an imported corpus."""
    draw = manifest["train_draw"]
    gold = manifest["gold_check"]
    lines = [f"imported {out} in {manifest.get('build_seconds', 0.0):.1f} s from "
             f"{', '.join(manifest['datasets'])} (seed {manifest['seed']}; semantics {manifest['semantics']})"]
    for split, info in manifest["splits"].items():
        levels = ", ".join(f"{k} {v}" for k, v in info["hardness"].items())
        sems = ", ".join(f"{k} {v}" for k, v in info["semantics"].items()) or "-"
        lines.append(f"  {split:5s} {info['examples']:6d} examples on {len(info['databases'])} databases "
                     f"({levels}; semantics {sems})")
    available = ", ".join(f"{k} {v}" for k, v in draw["available"].items())
    drawn = ", ".join(f"{k} {v}" for k, v in draw["drawn"].items())
    if draw.get("evaluation_only"):
        lines.append(f"  train: none, evaluation only (no train set in {', '.join(manifest['datasets'])}; "
                     "dev and test for `eval --corpus`)")
    else:
        lines.append(f"  train drawn ({draw['sampling']}, {draw['total']} asked) from {available}: {drawn}")
    lines.append("  variants: " + ", ".join(f"{k} {v['examples']}" for k, v in manifest["variants"].items()))
    lines.append(f"  test-suite neighbours: {sum(len(v) for v in manifest['neighbours'].values())} databases "
                 f"for {len(manifest['neighbours'])} databases")
    lines.append(f"  gold queries: {gold['checked']} checked, {gold['failing']} fail ({gold['share']:.2%}, at most "
                 f"{gold['max_share']:.0%}): {gold['dropped_from_train']} dropped from train, {gold['kept_in_eval']} "
                 f"kept in dev/test; {gold['unparsed_dropped']} records dropped (gold does not parse); "
                 "by id in import_report.json")
    return lines


__all__ = ["SQLITE_HEADER", "given_sources", "import_corpus", "summary_lines"]
