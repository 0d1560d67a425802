"""``run_eval``: evaluate a model on corpus splits and write metrics, tables, plots, predictions.

The protocol (progress-sql.md §5.1 and Appendix E.5): single-turn inference with the training
prompt of the recipe's output format (``rl.recipe``; ``think_sql`` for Progress-SQL), no ODT
feedback at test time. For each split:

    greedy        one output at temperature 0
    Vote@k        k samples at eval.temperature, majority over execution-result classes
                  (``eval.voting``); the first k of n = max(vote_k, pass_k) samples
    pass@k        from the same n samples (unbiased estimator when n > k)
    multi-turn    optional: the environment ``eval.multi_turn_env`` (default the SQL-tool
                  protocol of SQL-Trail / SkyRL-SQL, ``exec_feedback``: greedy, up to
                  env.trail_max_turns tool calls): the final <solution> is judged (none:
                  wrong), turns used are reported, and an episode is well-formed when every
                  turn is; ``turn2``: wrong first turns fixed at turn 2 and second turns
                  that repeat the first (``metrics.second_turn_counts``). An environment whose
                  feedback reads the gold (``reads_gold``, the ODT one) is refused by the settings.

EX / TS through ``sql.verdict.BatchVerdicts`` (one SQLPool) under each example's semantics
(``Example.semantics``: Spider test-suite or BIRD rules; metrics.json names it per split as
``semantics``, and report.md's header); the ODT
mismatch analysis (Table 8) on the greedy predictions. Examples are processed in rounds of
``eval.batch_size``: generate, execute the round's SQL in the pool, score, next round.

Files under ``out_dir`` (stable names, declared by the ``evaluate`` DVC stage):

    metrics.json              nested metrics per split (``dvc metrics``)
    report.md                 Tables 1, 2, 8, 9 shaped like the paper's, plus pass@k / multi-turn
    plots/hardness.csv        per split, decoding and hardness: n, EX, TS (``dvc plots`` bars)
    plots/robustness.csv      per split and decoding: EX, TS
    plots/hardness.png        per-hardness EX bars
    plots/robustness.png      EX / TS across the splits and variants
    predictions/<split>.jsonl one line per example: outputs, SQL, verdicts, ODT tags

The caller logs the flat metrics (``dev/greedy/ex``) and the files where it tracks runs
(``stages.evaluate`` through ``tracking.log_eval``): evaluation itself logs nothing.
"""

from __future__ import annotations

import json
import zlib
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from collections import Counter
from typing import Any, Iterable, Sequence

from tqdm import tqdm

from progress_sql import rewards
from progress_sql.params import Settings
from progress_sql.corpus.records import CORPUS_SPLITS, CorpusError, CorpusLayout, Example, read_jsonl
from progress_sql.sources import VARIANTS
from progress_sql import envs
from progress_sql.envs import Request, SchemaTexts, rollout, round1_messages
from progress_sql.envs.base import PROMPT_TOO_LONG
from progress_sql.eval import plots, reports
from progress_sql.eval.analysis import mismatch_rates, prediction_tags
from progress_sql.eval.metrics import Outcome, flat_metrics, mean, mode_metrics, pass_metrics, second_turn_counts
from progress_sql.eval.generators import Generator, RequestPolicy, make_generator
from progress_sql.eval.voting import pass_at_k, vote
from progress_sql.files import write_csv, write_json, write_text, written_aside
from progress_sql.formats import FormatName, parse_output
from progress_sql.sql import BatchVerdicts, Candidate, GoldCache, SQLPool, Verdict
from progress_sql.sql.verdict import too_large_reason

KNOWN_SPLITS = (*CORPUS_SPLITS, *VARIANTS)

# Decoding-mode keys of the metrics ('@' is not allowed in MLflow metric names: vote_at_8).
GREEDY = "greedy"
MULTI_TURN = "multi_turn"


def vote_key(k: int) -> str:
    return f"vote_at_{k}"


def pass_key(k: int) -> str:
    return f"pass_at_{k}"


@dataclass
class EvalResult:
    """What ``run_eval`` produced: ``metrics`` (nested, as in metrics.json), ``flat``
    (``split/mode/metric`` → number, as logged to MLflow), ``files`` (name → path; predictions
    as ``predictions/<split>``) and ``notes`` (things the reader should know)."""

    model: str
    metrics: dict[str, Any]
    flat: dict[str, float]
    files: dict[str, Path]
    notes: list[str] = field(default_factory=list)

    def gate(self, key: str) -> float | None:
        """The flat metric ``key`` (e.g. ``eval.gate_metric``), None when absent."""
        return self.flat.get(key)


# ----------------------------------------------------------------------------- inputs
def eval_format(settings: Settings) -> FormatName:
    """The output format evaluated: the one the recipe trains (``rl.recipe``)."""
    return rewards.get(settings.rl.recipe).fmt


def split_semantics(examples: Iterable[Example]) -> str:
    """The name of the EX/TS semantics a split was judged by (``Example.semantics``):
    ``spider`` or ``bird``, or ``mixed:bird=N,spider=M`` when its examples differ."""
    counts = Counter(ex.semantics for ex in examples)
    if len(counts) <= 1:
        return next(iter(counts), "spider")
    return "mixed:" + ",".join(f"{name}={n}" for name, n in sorted(counts.items()))


def split_path(layout: CorpusLayout, name: str) -> Path:
    """The JSONL file of split or variant ``name``."""
    if name in CORPUS_SPLITS:
        return layout.split(name)
    if name in VARIANTS:
        return layout.variant(name)
    raise ValueError(f"unknown split {name!r}; known: {', '.join(KNOWN_SPLITS)}")


def load_split(layout: CorpusLayout, name: str, max_examples: int = 0) -> list[Example]:
    """The examples of ``name`` (the first ``max_examples`` when positive); CorpusError when
    the file or one of its databases is missing."""
    path = split_path(layout, name)
    if not path.exists():
        raise CorpusError(f"split {name!r}: {path} not found (build the corpus, or drop {name!r} from eval.splits)")
    examples = list(read_jsonl(path))
    if max_examples:
        examples = examples[:max_examples]
    for db_id in sorted({ex.db_id for ex in examples}):
        if not layout.database(db_id).is_file():
            raise CorpusError(f"split {name!r}: database {layout.database(db_id)} not found")
    return examples


# ----------------------------------------------------------------------------- per example
@dataclass
class Answer:
    """The answer of one example under one decoding mode."""

    sql: str | None
    well_formed: bool
    verdict: Verdict
    tokens: float
    ts: bool | None = None
    text: str | None = None  # kept for greedy only (predictions file size)

    def outcome(self, example: Example) -> Outcome:
        return Outcome(example, self.verdict, self.ts, self.well_formed, self.tokens, self.sql)

    def record(self) -> dict[str, Any]:
        result = self.verdict.result
        failed = result is not None and not result.ok
        out = {"sql": self.sql, "well_formed": self.well_formed, "executed": self.verdict.executed,
               "ex": self.verdict.correct, "ts": self.ts, "tokens": self.tokens,
               "error": result.error if failed else None,
               "error_message": result.message[:ERROR_MESSAGE_CHARS] if failed else None}
        if self.text is not None:
            out = {"text": self.text, **out}
        return out


@dataclass
class ExampleEval:
    example: Example
    greedy: Answer | None = None
    vote: Answer | None = None
    vote_info: dict[str, Any] = field(default_factory=dict)
    samples: list[str | None] = field(default_factory=list)
    pass_score: float | None = None
    pass_correct: int = 0
    tags: tuple[str, ...] | None = None
    multi: Answer | None = None
    turns: int | None = None
    done_reason: str | None = None
    first_turns: tuple[rewards.Turn, ...] = ()  # the multi-turn episode's first two (eval.metrics.second_turn_counts)

    def record(self) -> dict[str, Any]:
        ex = self.example
        out: dict[str, Any] = {"id": ex.id, "db_id": ex.db_id, "hardness": ex.hardness, "difficulty": ex.difficulty,
                               "question": ex.question, "gold_sql": ex.gold_sql}
        if self.greedy is not None:
            out["greedy"] = {**self.greedy.record(), "odt_tags": list(self.tags or ())}
        if self.vote is not None:
            out["vote"] = {**self.vote.record(), **self.vote_info}
        if self.samples:
            out["samples"] = self.samples
        if self.pass_score is not None:
            out["pass"] = {"n": len(self.samples), "correct": self.pass_correct, "score": self.pass_score}
        if self.multi is not None:
            out["multi_turn"] = {**self.multi.record(), "turns": self.turns, "done_reason": self.done_reason}
        return out


# ----------------------------------------------------------------------------- the evaluation
class _SplitEvaluator:
    def __init__(self, settings: Settings, generator: Generator, judge: BatchVerdicts, layout: CorpusLayout,
                 schema_texts: SchemaTexts, fmt: FormatName) -> None:
        self.settings, self.cfg = settings, settings.eval
        self.generator, self.judge, self.layout = generator, judge, layout
        self.schema_texts, self.fmt = schema_texts, fmt
        self.n_samples = max(self.cfg.vote_k, self.cfg.pass_k)
        self.prompts_too_long = 0

    def _suite(self, db_id: str) -> list[Path] | None:
        if not self.cfg.ts:
            return None
        suite = self.layout.test_suite(db_id)
        return suite if len(suite) > 1 else None

    def _answers(self, chunk: Sequence[Example], outputs: Sequence[Sequence[Any]],
                 keep_text: bool) -> list[list[Answer]]:
        """Parse every output and judge its SQL (one batch through the pool)."""
        parsed = [[parse_output(c.text, self.fmt) for c in row] for row in outputs]
        cands = [Candidate(str(self.layout.database(ex.db_id)), p.sql, ex.gold_sql, ex.semantics)
                 for ex, row in zip(chunk, parsed) for p in row]
        verdicts = iter(self.judge.judge(cands))
        return [
            [Answer(p.sql, p.well_formed, next(verdicts), float(c.n_tokens), text=c.text if keep_text else None)
             for c, p in zip(row, prow)]
            for row, prow in zip(outputs, parsed)
        ]

    def _add_ts(self, answers: Sequence[tuple[Example, Answer]]) -> None:
        """TS for the answers whose EX holds and whose database has neighbours; the others
        get False (EX failed, so TS fails) or None (no neighbours / TS off)."""
        todo = []
        for example, answer in answers:
            suite = self._suite(example.db_id)
            if suite is None:
                answer.ts = None
            elif not answer.verdict.correct or answer.sql is None:
                answer.ts = False
            else:
                todo.append((answer, (Candidate(suite[0], answer.sql, example.gold_sql, example.semantics), suite[1:])))
        for (answer, _), passed in zip(todo, self.judge.test_suite([item for _, item in todo])):
            answer.ts = passed

    def single_turn(self, split: str, start: int, chunk: Sequence[Example]) -> list[ExampleEval]:
        requests = [
            Request(round1_messages(ex, self.schema_texts(ex.db_id, self.layout.database(ex.db_id)), self.fmt,
                                    self.settings.env), self.fmt, ex)
            for ex in chunk
        ]
        evals = [ExampleEval(ex) for ex in chunk]
        greedy = samples = None
        if self.cfg.greedy:
            greedy = self.generator.complete(requests, n=1, temperature=0.0, top_p=1.0, seed=None)
        if self.n_samples:
            seed = zlib.crc32(f"{self.settings.seed}:{split}:{start}".encode())
            samples = self.generator.complete(requests, n=self.n_samples, temperature=self.cfg.temperature,
                                              top_p=self.cfg.top_p, seed=seed)
        self.prompts_too_long += sum(
            1 for rows in (greedy, samples) for row in rows or () for c in row if c.finish_reason == PROMPT_TOO_LONG
        )
        if greedy is not None:
            for ev, (answer,) in zip(evals, self._answers(chunk, greedy, keep_text=True)):
                ev.greedy = answer
                ev.tags = prediction_tags(answer.sql, ev.example.gold_sql, self.settings.odt)
        if samples is not None:
            for ev, answers in zip(evals, self._answers(chunk, samples, keep_text=False)):
                ev.samples = [a.sql for a in answers]
                if self.cfg.vote_k:
                    voted = answers[: self.cfg.vote_k]
                    # Grouped on the comparison views' results alone (no gold information),
                    # by the example's semantics, unordered.
                    outcome = vote([a.verdict.compared for a in voted], ev.example.semantics)
                    winner = voted[outcome.winner]
                    ev.vote = Answer(winner.sql, winner.well_formed, winner.verdict,
                                     mean(a.tokens for a in voted) or 0.0)
                    ev.vote_info = {"winner": outcome.winner, "votes": outcome.votes, "valid": outcome.valid,
                                    "classes": len(outcome.classes)}
                if self.cfg.pass_k:
                    ev.pass_correct = sum(a.verdict.correct for a in answers)
                    ev.pass_score = (None if answers[0].verdict.unjudged  # counted apart (eval.metrics)
                                     else pass_at_k(len(answers), ev.pass_correct, self.cfg.pass_k))
        self._add_ts([(ev.example, a) for ev in evals for a in (ev.greedy, ev.vote) if a is not None])
        return evals

    def multi_turn(self, chunk: Sequence[Example], evals: Sequence[ExampleEval]) -> None:
        settings, schema_texts = self.settings, self.schema_texts
        env_cls = envs.get(self.cfg.multi_turn_env)
        fmt = env_cls.formats[0]
        policy = RequestPolicy(self.generator)
        episodes = rollout(lambda: env_cls(settings, fmt=fmt, schema_texts=schema_texts), policy, chunk,
                           self.layout.database, judge=self.judge)
        # judged: the final answer of an episode that gave one (a tool call is not an answer)
        finals = [ep.turns[-1].sql if ep.done_reason in ("solution", "single") else None for ep in episodes]
        verdicts = self.judge.judge([Candidate(str(self.layout.database(ep.example.db_id)), sql, ep.example.gold_sql,
                                               ep.example.semantics)
                                     for ep, sql in zip(episodes, finals)])
        answers = []
        for ev, ep, sql, verdict in zip(evals, episodes, finals, verdicts):
            well_formed = all(parse_output(t.text, fmt).well_formed for t in ep.turns)
            tokens = float(policy.tokens.get(ep.id, 0))
            ev.multi = Answer(sql, well_formed, verdict, tokens)
            ev.turns, ev.done_reason, ev.first_turns = ep.K, ep.done_reason, tuple(ep.turns[:2])
            answers.append((ev.example, ev.multi))
        self._add_ts(answers)

    def evaluate(self, split: str, examples: Sequence[Example], progress: bool) -> tuple[dict[str, Any], list[ExampleEval]]:
        """Every example of ``split``, ``eval.batch_size`` at a time: the split's metrics (with
        its gold queries that fail and its prompts too long counted) and each example's evaluation."""
        evals: list[ExampleEval] = []
        with tqdm(total=len(examples), desc=f"eval {split}", unit="ex", disable=not progress) as bar:
            for start in range(0, len(examples), self.cfg.batch_size):
                chunk = examples[start : start + self.cfg.batch_size]
                chunk_evals = self.single_turn(split, start, chunk)
                if self.cfg.multi_turn:
                    self.multi_turn(chunk, chunk_evals)
                evals += chunk_evals
                bar.update(len(chunk))
        metrics = self.metrics(evals)
        golds = [self.judge.gold(self.layout.database(ex.db_id), ex.gold_sql, ex.semantics) for ex in examples]
        metrics["gold_errors"] = sum(not gold.ok for gold in golds)
        metrics["gold_too_large"] = sum(bool(too_large_reason(gold)) for gold in golds)
        metrics["prompt_too_long"] = self.prompts_too_long
        return metrics, evals

    def metrics(self, evals: Sequence[ExampleEval]) -> dict[str, Any]:
        cfg = self.cfg
        out: dict[str, Any] = {"n": len(evals), "semantics": split_semantics(ev.example for ev in evals)}
        if cfg.greedy:
            out[GREEDY] = mode_metrics([ev.greedy.outcome(ev.example) for ev in evals])
            out["odt_mismatch"] = mismatch_rates(ev.tags or () for ev in evals)
        if cfg.vote_k:
            m = mode_metrics([ev.vote.outcome(ev.example) for ev in evals])
            m["mean_votes"] = mean(ev.vote_info["votes"] for ev in evals)
            m["all_invalid_rate"] = mean(float(ev.vote_info["valid"] == 0) for ev in evals)
            out[vote_key(cfg.vote_k)] = m
        if cfg.pass_k:
            out[pass_key(cfg.pass_k)] = pass_metrics([ev.pass_score for ev in evals], [ev.example.hardness for ev in evals])
        if cfg.multi_turn:
            m = mode_metrics([ev.multi.outcome(ev.example) for ev in evals])
            m["mean_turns"] = mean(ev.turns for ev in evals)
            m["solution_rate"] = mean(float(ev.done_reason == "solution") for ev in evals)
            m["turn2"] = second_turn_counts(ev.first_turns for ev in evals)
            out[MULTI_TURN] = m
        return out


def run_eval(
    settings: Settings,
    model: str | Generator,
    corpus_dir: str | Path,
    splits: Sequence[str] | None,
    out_dir: str | Path,
    *,
    progress: bool = True,
) -> EvalResult:
    """Evaluate ``model`` on ``splits`` of the corpus at ``corpus_dir``; write the files under
    ``out_dir`` (see the module notes) and return the metrics.

    ``model``: a model directory or hub id, ``"smollm2"``, ``"oracle"`` (gold SQL: EX/TS must be
    1.0), or a ready ``Generator``. ``splits``: names among train/dev/test/indomain/syn/realistic/dk
    (None: ``eval.splits``). Everything else comes from ``settings.eval`` (and
    ``generation``, ``sandbox``, ``env``, ``rl.recipe`` for the output format). Raises
    CorpusError when a split file or database is missing, before any model is loaded.
    """
    cfg = settings.eval
    layout = CorpusLayout(Path(corpus_dir))
    names = list(splits) if splits else list(cfg.splits)
    for name in names:
        split_path(layout, name)  # unknown names fail before any file is read
    if len(set(names)) != len(names):
        raise ValueError(f"splits listed twice: {names}")
    data = {name: load_split(layout, name, cfg.max_examples) for name in names}
    fmt = eval_format(settings)
    generator = model if not isinstance(model, str) else make_generator(model, settings)
    model_name = model if isinstance(model, str) else generator.name

    notes: list[str] = []
    metrics: dict[str, Any] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    schema_texts = SchemaTexts.for_corpus(layout, settings.env.prompt_style)
    # a model loaded here is closed here (a given generator is its caller's)
    with SQLPool(settings=settings.sandbox) as pool, (closing(generator) if generator is not model else nullcontext()):
        judge = BatchVerdicts(settings.sandbox, pool=pool, gold_cache=GoldCache(settings=settings.sandbox))
        for name, examples in data.items():
            if not examples:
                notes.append(f"{name}: no examples, skipped")
                continue
            worker = _SplitEvaluator(settings, generator, judge, layout, schema_texts, fmt)
            metrics[name], evals = worker.evaluate(name, examples, progress)
            records[name] = [ev.record() for ev in evals]
            notes += _split_notes(name, metrics[name], layout, examples, cfg.ts)

    out = Path(out_dir)
    files = _write_outputs(out, model_name, metrics, records, notes, settings)
    return EvalResult(model=model_name, metrics=metrics, flat=flat_metrics(metrics), files=files, notes=notes)


def greedy_answers(settings: Settings, generator: Generator, corpus_dir: str | Path,
                   examples: Sequence[Example]) -> list[ExampleEval]:
    """Each example's greedy single-turn answer, judged for EX: the greedy mode of ``run_eval``
    without TS, samples or report files, for callers that need per-example verdicts (RL's
    ``rl.questions: solved``). ``ev.record()`` gives the predictions-file line."""
    layout = CorpusLayout(Path(corpus_dir))
    greedy_only = settings.eval.model_copy(update={"greedy": True, "vote_k": 0, "pass_k": 0, "multi_turn": False,
                                                   "ts": False})
    settings = settings.model_copy(update={"eval": greedy_only})
    schema_texts = SchemaTexts.for_corpus(layout, settings.env.prompt_style)
    evals: list[ExampleEval] = []
    with SQLPool(settings=settings.sandbox) as pool:
        judge = BatchVerdicts(settings.sandbox, pool=pool, gold_cache=GoldCache(settings=settings.sandbox))
        worker = _SplitEvaluator(settings, generator, judge, layout, schema_texts, eval_format(settings))
        for start in range(0, len(examples), greedy_only.batch_size):
            evals += worker.single_turn("greedy", start, examples[start:start + greedy_only.batch_size])
    return evals


def _split_notes(name: str, m: dict[str, Any], layout: CorpusLayout, examples: Sequence[Example], ts: bool) -> list[str]:
    notes = []
    if m["gold_errors"]:
        notes.append(f"{name}: {m['gold_errors']} gold queries fail to execute; no prediction can match them")
    if m["gold_too_large"]:
        notes.append(f"{name}: {m['gold_too_large']} gold queries return more than sandbox.max_rows rows; counted "
                     "apart (gold_too_large), not in EX/TS: raise sandbox.max_rows or fix the questions")
    if m["prompt_too_long"]:
        notes.append(f"{name}: {m['prompt_too_long']} generations skipped, prompt over generation.max_prompt_tokens")
    if ts:
        bare = sorted({ex.db_id for ex in examples if not layout.neighbours(ex.db_id)})
        if bare:
            notes.append(f"{name}: no test-suite neighbours for {', '.join(bare)}; TS not computed there")
    return notes


# The evaluation's files in its output folder (the evaluate stage's outs), written aside and
# swapped in whole; the folder's other entries (a user's notes) are kept.
OUTPUT_FILES = {"metrics": "metrics.json", "report": "report.md", "hardness_csv": "plots/hardness.csv",
                "robustness_csv": "plots/robustness.csv", "hardness_png": "plots/hardness.png",
                "robustness_png": "plots/robustness.png"}
PREDICTIONS = "predictions"  # <split>.jsonl; a split not evaluated this time leaves no file behind
ERROR_MESSAGE_CHARS = 300  # of an execution error's message, kept in the predictions file


def _write_outputs(out: Path, model: str, metrics: dict[str, Any], records: dict[str, list[dict[str, Any]]],
                   notes: list[str], settings: Settings) -> dict[str, Path]:
    names = {**OUTPUT_FILES, **{f"predictions/{name}": f"{PREDICTIONS}/{name}.jsonl" for name in records}}
    hardness, robustness = reports.hardness_rows(metrics), reports.robustness_rows(metrics)
    with written_aside(out, owned=[*OUTPUT_FILES.values(), PREDICTIONS]) as tmp:
        write_json(tmp / names["metrics"], metrics)
        write_text(tmp / names["report"], reports.markdown_report(model, metrics, settings.eval, notes))
        write_csv(tmp / names["hardness_csv"], hardness, reports.HARDNESS_COLUMNS)
        write_csv(tmp / names["robustness_csv"], robustness, reports.ROBUSTNESS_COLUMNS)
        plots.plot_hardness(hardness, tmp / names["hardness_png"])
        plots.plot_robustness(robustness, tmp / names["robustness_png"])
        for name, rows in records.items():
            write_text(tmp / names[f"predictions/{name}"],
                       "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
    return {key: out / rel for key, rel in names.items()}
