"""The train questions scored by RL's starting policy before the run (``rl.scores``: the DVC
stage ``score_questions``, ``progress-sql train score``), which ``rl.questions: band`` draws from.

Each question of a seeded pool of the train split (those of ``rl.hardness``, ``rl.scores.pool``
of them) gets ``rl.scores.k`` single-turn samples from the rollout sampler (``generation.backend``
at ``generation.temperature`` and ``top_p``: an RL episode's first turn), each judged for EX as
the evaluation judges (``sql.BatchVerdicts``); its pass rate is correct / k. ``rl.scores.out_dir``
holds:

    scores.jsonl    {example_id, k, correct, rate}, one line a question
    summary.json    how many questions are at rate 0, strictly between, at 1 (and how many at
                    each count correct), and the fingerprint of the scoring: the settings that
                    decide the scores, the sha256 of the train split and of the policy

A run of ``rl.questions: band`` takes the questions with ``rl.scores.low < rate < rl.scores.high``
(``band_ids``), and only from scores made as it would make them: missing scores, or scores of
another policy, corpus or k, stop it with a line naming what differs and the command that scores
again. With another ``rl.questions`` the stage scores nothing and writes empty scores
(``write_unscored``), so that the tiny pipeline pays nothing for it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tqdm import tqdm

from progress_sql.corpus.integrity import sha256_file, sha256_tree
from progress_sql.corpus.records import CorpusError, CorpusLayout, Example, read_jsonl
from progress_sql.envs import Request, SchemaTexts, round1_messages
from progress_sql.files import write_json, write_json_lines, written_aside
from progress_sql.formats import parse_output
from progress_sql.params import Settings, dotted_items
from progress_sql.rewards import get as get_recipe
from progress_sql.sql import BatchVerdicts, Candidate, GoldCache, SQLPool

SCORES_FILE = "scores.jsonl"
SUMMARY_FILE = "summary.json"
# The settings that decide the scores (with the output format rl.recipe teaches: recipes of one
# format, such as progress and oneshot, share scores): a run of rl.questions band refuses scores
# made otherwise.
SCORING_KEYS = ("rl.scores.k", "rl.scores.pool", "rl.seed", "rl.hardness", "generation.temperature",
                "generation.top_p", "generation.max_new_tokens", "env.prompt_style")
SCORE_COMMAND = "progress-sql train score (the DVC stage score_questions)"


def question_pool(examples: Sequence[Example], size: int, seed: int) -> list[Example]:
    """A seeded sample of ``size`` of ``examples`` in their order (all of them when ``size`` is
    0 or not below their number): the questions a pass over the train split tries
    (``rl.solved_candidates``, ``rl.scores.pool``)."""
    if not 0 < size < len(examples):
        return list(examples)
    picked = np.random.default_rng([seed, len(examples)]).choice(len(examples), size, replace=False)
    return [examples[i] for i in sorted(picked)]


def train_questions(settings: Settings, layout: CorpusLayout) -> list[Example]:
    """The train questions of ``rl.hardness``: those an RL run draws from (``train.rl_run``)."""
    rl = settings.rl
    train = [ex for ex in read_jsonl(layout.split("train")) if ex.hardness in rl.hardness]
    if not train:
        raise CorpusError(f"{layout.split('train')}: no training examples of hardness {', '.join(rl.hardness)} "
                          "(rl.hardness)")
    return train


def policy_identity(init_from: str) -> str:
    """What a policy is, for fingerprints: the sha256 of its folder's files, or its name when it
    is no folder (a hub id)."""
    path = Path(init_from)
    return sha256_tree(path) if path.is_dir() else init_from


def scoring_settings(settings: Settings) -> dict[str, Any]:
    """The settings that decide the scores: ``SCORING_KEYS`` and the output format."""
    flat = dotted_items(settings.model_dump(mode="json"))
    return {**{key: flat[key] for key in SCORING_KEYS}, "format": get_recipe(settings.rl.recipe).fmt}


def scoring_fingerprint(settings: Settings, layout: CorpusLayout) -> dict[str, Any]:
    """What decides the scores: the settings of ``SCORING_KEYS``, the output format, and the
    sha256 of the train split and of ``rl.init_from``."""
    return {"settings": scoring_settings(settings),
            "inputs": {"train split": sha256_file(layout.split("train")),
                       "policy": policy_identity(settings.rl.init_from)}}


# ----------------------------------------------------------------------------- scoring
def judged_samples(settings: Settings, chat: Any, layout: CorpusLayout, questions: Sequence[Example], k: int,
                   *, progress: bool = False) -> list[int]:
    """How many of ``k`` single-turn samples of each question ``chat`` answers right (EX, the
    evaluation's judge), ``eval.batch_size`` questions a generation round."""
    return [sum(correct for _, correct in row)
            for row in judged_answers(settings, chat, layout, questions, k, progress=progress)]


def judged_answers(settings: Settings, chat: Any, layout: CorpusLayout, questions: Sequence[Example], k: int,
                   *, progress: bool = False, desc: str = "score") -> list[list[tuple[str, bool]]]:
    """``k`` single-turn samples of each question from ``chat`` (``generation.temperature`` and
    ``top_p``: an RL episode's first turn, seeded by ``rl.seed``), each as (its text, right by
    EX as the evaluation judges), ``eval.batch_size`` questions a generation round."""
    gen, fmt = settings.generation, get_recipe(settings.rl.recipe).fmt
    schema_texts = SchemaTexts.for_corpus(layout, settings.env.prompt_style)
    answers: list[list[tuple[str, bool]]] = []
    with SQLPool(settings=settings.sandbox) as pool, \
            tqdm(total=len(questions), desc=desc, unit="q", disable=not progress) as bar:
        judge = BatchVerdicts(settings.sandbox, pool=pool, gold_cache=GoldCache(settings=settings.sandbox))
        for start in range(0, len(questions), settings.eval.batch_size):
            chunk = questions[start:start + settings.eval.batch_size]
            requests = [Request(round1_messages(ex, schema_texts(ex.db_id, layout.database(ex.db_id)), fmt,
                                                settings.env), fmt, ex) for ex in chunk]
            seed = int(np.random.SeedSequence([settings.rl.seed, start]).generate_state(1)[0])
            outputs = chat.complete(requests, n=k, temperature=gen.temperature, top_p=gen.top_p, seed=seed)
            verdicts = iter(judge.judge([Candidate(str(layout.database(ex.db_id)), parse_output(o.text, fmt).sql,
                                                   ex.gold_sql, ex.semantics)
                                         for ex, row in zip(chunk, outputs) for o in row]))
            answers += [[(o.text, next(verdicts).correct) for o in row] for row in outputs]
            bar.update(len(chunk))
    return answers


def summary_of(rows: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """How many scored questions are at rate 0, strictly between 0 and 1, at 1, and at each count
    correct (``by_correct[c]``: questions with c of k right)."""
    counts = [0] * (k + 1)
    for row in rows:
        counts[row["correct"]] += 1
    return {"scored": len(rows), "k": k, "at_0": counts[0], "between": sum(counts[1:k]), "at_1": counts[k],
            "by_correct": counts}


def write_scores(out: Path, rows: Sequence[dict[str, Any]], summary: dict[str, Any]) -> None:
    """``out`` with its scores and summary, written aside and swapped in whole."""
    with written_aside(out, owned=(SCORES_FILE, SUMMARY_FILE)) as tmp:
        write_json_lines(tmp / SCORES_FILE, rows)
        write_json(tmp / SUMMARY_FILE, summary)


def score_train_questions(settings: Settings, corpus_dir: str | Path, out: str | Path, *,
                          progress: bool = True) -> dict[str, Any]:
    """Score the pool of train questions with ``rl.init_from`` (the module notes); its summary,
    the scores and summary written to ``out``."""
    from progress_sql.inference.policy import ChatModel  # noqa: PLC0415 - torch only when scoring

    rl, layout = settings.rl, CorpusLayout(Path(corpus_dir))
    pool = question_pool(train_questions(settings, layout), rl.scores.pool, rl.seed)
    started = time.monotonic()
    # fp32 weights, as an RL run loads them for its sampler (vLLM takes generation.vllm.dtype)
    with ChatModel.load(rl.init_from, settings.generation, dtype="float32", seed=settings.seed) as chat:
        correct = judged_samples(settings, chat, layout, pool, rl.scores.k, progress=progress)
    k = rl.scores.k
    rows = [{"example_id": ex.id, "k": k, "correct": c, "rate": c / k} for ex, c in zip(pool, correct)]
    summary = {**summary_of(rows, k), "seconds": time.monotonic() - started, "policy": rl.init_from,
               "fingerprint": scoring_fingerprint(settings, layout)}
    write_scores(Path(out), rows, summary)
    return summary


def write_unscored(settings: Settings, out: str | Path) -> dict[str, Any]:
    """Empty scores in ``out`` for a run that does not draw by them (``rl.questions`` not
    band): the DVC stage's output exists, and nothing was loaded or sampled."""
    summary = {"scored": 0, "note": f"rl.questions is {settings.rl.questions}: nothing scored (band draws by scores)"}
    write_scores(Path(out), [], summary)
    return summary


# ----------------------------------------------------------------------------- reading
def band_ids(settings: Settings, layout: CorpusLayout) -> list[str]:
    """The ids of the scored questions inside the band (``rl.scores.low < rate < rl.scores.high``),
    from the scores in ``rl.scores.out_dir``: CorpusError when they are missing or were made
    otherwise than this run would make them (another policy, corpus or k: the line names it)."""
    scores = settings.rl.scores
    folder = Path(scores.out_dir)
    try:
        summary = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))
        rows = [json.loads(line) for line in (folder / SCORES_FILE).read_text(encoding="utf-8").splitlines() if line]
    except FileNotFoundError as err:
        raise CorpusError(f"rl.questions band draws by the scores in {folder}, and {err.filename} is missing: "
                          f"run {SCORE_COMMAND} first") from None
    except (ValueError, OSError) as err:
        raise CorpusError(f"{folder}: the question scores cannot be read ({err}): run {SCORE_COMMAND} again") from None
    recorded = summary.get("fingerprint") if isinstance(summary, dict) else None
    if not isinstance(recorded, dict):
        raise CorpusError(f"{folder / SUMMARY_FILE}: no scores there ({summary.get('note', 'no fingerprint')}); "
                          f"run {SCORE_COMMAND} with rl.questions band")
    differs = _differences(recorded, scoring_fingerprint(settings, layout), summary.get("policy"))
    if differs:
        raise CorpusError(f"the question scores in {folder} were made otherwise than this run would make them "
                          f"({'; '.join(differs)}): run {SCORE_COMMAND} again")
    return [row["example_id"] for row in rows if in_band(row["rate"], scores)]


def in_band(rate: float, scores: Any) -> bool:
    """Whether a pass rate lies inside the band of ``scores`` (``rl.scores``): strictly."""
    return scores.low < rate < scores.high


def scores_identity(settings: Settings) -> str:
    """The sha256 of the scores a run of ``rl.questions: band`` draws by (for its fingerprint:
    new scores start a resumed run over); 'missing' when there are none."""
    path = Path(settings.rl.scores.out_dir) / SCORES_FILE
    return sha256_file(path) if path.is_file() else "missing"


def _differences(recorded: dict[str, Any], now: dict[str, Any], scored_policy: Any) -> list[str]:
    old, new = recorded.get("settings", {}), now["settings"]
    out = [f"{key} {old.get(key)!r} → {new[key]!r}" for key in new if old.get(key) != new[key]]
    for name, value in now["inputs"].items():
        if recorded.get("inputs", {}).get(name) != value:
            out.append(f"scored with another policy ({scored_policy} as it was then)" if name == "policy"
                       else f"the {name} changed")
    return out
