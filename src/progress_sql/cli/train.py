"""``progress-sql train``: build the tiny policy, SFT warm start, score the train questions, RL
(the DVC stages ``init_model``, ``sft``, ``score_questions`` and ``train`` run exactly these
commands). Each runs inside its nested MLflow run; the summary metrics and curves also go to
``--report-dir`` for ``dvc metrics`` and ``dvc plots``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from progress_sql import stages
from progress_sql.cli.common import (
    CorpusDir,
    Overrides,
    POLICY_ERRORS,
    ParamsFile,
    ProgressBar,
    die_with_dvc,
    load_or_exit,
    parse_overrides,
    stage_or_exit,
)

app = typer.Typer(help="Build, warm-start (SFT) and RL-train the policy.", no_args_is_help=True)

REPORT_HELP = "Where the stage's metrics JSON and curve CSV go (dvc metrics / plots)"




@app.command("init")
def init(
    ctx: typer.Context,
    params: ParamsFile = "params.yaml",
    corpus: CorpusDir = None,
    out: str = typer.Option(None, "--out", help="Model folder (default: model.base_dir)"),
    model: str = typer.Option(None, "--model", help="Start from this pretrained model instead of the tiny one "
                                                     "(model.pretrained): smollm2, a model folder or a hub id"),
    overrides: Overrides = [],
    progress: ProgressBar = True,
) -> None:
    """Build the tiny policy (a BPE tokenizer trained on the corpus, a model from model.*, copy-pretrained),
    or save a pretrained one (--model, model.pretrained) as a plain model folder."""
    settings = load_or_exit(ctx, params, {**parse_overrides(overrides), **({"model.pretrained": model} if model else {})})
    with stage_or_exit("init_model", POLICY_ERRORS, writes=out or settings.model.base_dir):
        path = stages.init_model(settings, Path(corpus or settings.data.out_dir), out, progress=progress)
    if settings.model.pretrained:
        info = json.loads((path / "pretrained_model.json").read_text(encoding="utf-8"))
        typer.echo(f"saved {settings.model.pretrained} to {path} ({info['parameters'] / 1e6:.1f}M parameters, "
                   f"vocabulary {info['vocab_size']})")
        return
    typer.echo(f"built {path} ({settings.model.arch}, {settings.model.num_layers} layers, "
               f"hidden {settings.model.hidden_size}, vocabulary {settings.model.vocab_size})")
    warmup = json.loads((path / "tiny_model.json").read_text(encoding="utf-8"))["copy_warmup"]
    if warmup.get("steps"):
        line = (f"copy warmup: {warmup['steps']} steps, loss {warmup['first_loss']:.3f} → {warmup['final_loss']:.3f}, "
                f"copy accuracy {warmup['copy_accuracy_before']:.2f} → {warmup['copy_accuracy']:.2f}")
        if warmup["copy_accuracy"] < 0.5:  # the induction head forms suddenly; before that SFT memorises names
            line += " (below 0.5: the model cannot copy yet; raise model.copy_warmup.steps)"
        typer.echo(line)


@app.command("sft")
def sft(
    ctx: typer.Context,
    params: ParamsFile = "params.yaml",
    corpus: CorpusDir = None,
    out: str = typer.Option(None, "--out", help="Model folder (default: sft.out_dir)"),
    report_dir: str = typer.Option("reports/train", "--report-dir", help=REPORT_HELP),
    overrides: Overrides = [],
    progress: ProgressBar = True,
) -> None:
    """Supervised warm start on the train split (gold SQL in the recipe's tags, revision dialogues)."""
    die_with_dvc()
    settings = load_or_exit(ctx, params, parse_overrides(overrides))
    with stage_or_exit("sft", POLICY_ERRORS, writes=out or settings.sft.out_dir):
        result, _ = stages.sft(settings, Path(corpus or settings.data.out_dir), out=out, report_dir=report_dir,
                               progress=progress)
    copy = f", copy loss {result.final_copy_loss:.3f}" if result.copy_losses else ""
    typer.echo(f"sft: {result.steps} steps in {result.seconds:.0f} s, loss {result.losses[0]:.3f} → "
               f"{result.final_loss:.3f}{copy}{' (stopped by sft.max_minutes)' if result.stopped_early else ''}; "
               f"saved {result.out_dir}")


@app.command("score")
def score(
    ctx: typer.Context,
    params: ParamsFile = "params.yaml",
    corpus: CorpusDir = None,
    out: str = typer.Option(None, "--out", help="Scores folder (default: rl.scores.out_dir)"),
    report_dir: str = typer.Option("reports/train", "--report-dir", help="Where scores.json goes (dvc metrics)"),
    overrides: Overrides = [],
    progress: ProgressBar = True,
) -> None:
    """Score the train questions with RL's starting policy (rl.init_from): rl.scores.k single-turn samples each,
    judged for EX; rl.questions band draws those whose pass rate is inside the band. Scores nothing (and writes
    empty scores) when rl.questions is not band."""
    die_with_dvc()
    settings = load_or_exit(ctx, params, parse_overrides(overrides))
    with stage_or_exit("score_questions", POLICY_ERRORS, writes=out or settings.rl.scores.out_dir):
        summary = stages.score_questions(settings, Path(corpus or settings.data.out_dir), out=out,
                                         report_dir=report_dir, progress=progress)
    folder = out or settings.rl.scores.out_dir
    if not summary["scored"]:
        typer.echo(f"score: {summary['note']}; wrote empty scores to {folder}")
        return
    from progress_sql.train.question_scores import in_band

    sc = settings.rl.scores
    band = sum(n for c, n in enumerate(summary["by_correct"]) if in_band(c / summary["k"], sc))
    typer.echo(f"score: {summary['scored']} train questions × {summary['k']} samples of {settings.rl.init_from} in "
               f"{summary['seconds']:.0f} s: {summary['at_0']} never right, {summary['between']} sometimes, "
               f"{summary['at_1']} always; {band} inside the band {sc.low:g} < rate < {sc.high:g}; saved {folder}")


@app.command("rl")
def rl(
    ctx: typer.Context,
    params: ParamsFile = "params.yaml",
    corpus: CorpusDir = None,
    out: str = typer.Option(None, "--out", help="Run folder (default: rl.out_dir); the policy goes to OUT/final"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in the run folder"),
    auto_resume: bool = typer.Option(
        False, "--auto-resume", help="Continue from the newest checkpoint in the run folder only when it was trained "
                                     "with the same settings, corpus, starting policy and code; else start over "
                                     "(the DVC stage's way)"),
    resume_from: Optional[str] = typer.Option(None, "--resume-from", help="Continue from this checkpoint folder"),
    report_dir: str = typer.Option("reports/train", "--report-dir", help=REPORT_HELP),
    overrides: Overrides = [],
    progress: ProgressBar = True,
) -> None:
    """Multi-turn RL (GRPO / GSPO / Dr.GRPO) with the reward recipe and environment of rl.*."""
    die_with_dvc()
    if auto_resume and (resume or resume_from):
        raise typer.BadParameter("--auto-resume decides itself: give no --resume or --resume-from with it",
                                 param_hint="--auto-resume")
    settings = load_or_exit(ctx, params, parse_overrides(overrides))
    start: bool | str | Path = Path(resume_from) if resume_from else "auto" if auto_resume else resume
    with stage_or_exit("train", POLICY_ERRORS, writes=out or settings.rl.out_dir):
        result, summary = stages.train_rl(settings, Path(corpus or settings.data.out_dir), out=out, resume=start,
                                          report_dir=report_dir, progress=progress)
    typer.echo(f"rl: {result.steps} steps ({settings.rl.recipe}, {settings.rl.env}, {settings.rl.algorithm}) on "
               f"{result.questions} train questions (rl.questions: {settings.rl.questions}), "
               f"stopped by {result.stopped_by}; final reward/mean {summary.get('rl/reward_mean', float('nan')):.3f}; "
               f"policy saved to {result.final_dir}")
    if result.start:
        typer.echo(f"rl: {result.start}")
    origin = result.final_from
    if origin.get("from") == "best":
        typer.echo(f"rl: the final policy is step {origin['step']}'s, the best check (check/ex {origin['check/ex']:.3f} "
                   f"on {int(origin['check/n'])} {settings.rl.check.split} questions)")
