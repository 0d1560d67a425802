"""``progress-sql study NAME``: a study of configs/studies/ (every arm × seed
trained and evaluated on one budget, one report), the same code path as the Prefect flow
``run-study``. The scale is the preset: ``progress-sql --preset cpu-demo study
methods`` (or ``--preset`` after the command)."""

from __future__ import annotations

import typer

from progress_sql.cli.common import PRESET_HELP, SET_HELP, global_preset, parse_overrides


def study(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A study of configs/studies/ (methods, ablations, async) or a YAML file"),
    preset: str = typer.Option(None, "--preset", metavar="SCALE",
                               help=PRESET_HELP + "; here the scale every arm runs at (default: the global --preset)"),
    params: str = typer.Option("params.yaml", "--params", help="Settings file"),
    arms: list[str] = typer.Option([], "--arm", help="Run this arm of the study (repeatable, at least two; "
                                   "the first is the one the others are tested against); default: every arm"),
    budget: list[str] = typer.Option([], "--budget", help="Override a budget key of the study, e.g. --budget steps=5"),
    seeds: int = typer.Option(None, "--seeds", min=1, help="Seeds 1..N (the budget's seeds)"),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP + "; on every arm, under the budget"),
    plan_only: bool = typer.Option(False, "--plan", help="Print the arms' settings and the budget; run nothing"),
) -> None:
    """Train and evaluate every arm × seed of a study on one budget; write reports/studies/NAME/."""
    from progress_sql.studies import StudyError, make_plan, run_study

    budget_overrides = parse_overrides(budget)
    if seeds is not None:
        budget_overrides["seeds"] = seeds
    try:
        plan = make_plan(name, params, preset or global_preset(ctx) or "", budget_overrides=budget_overrides,
                         overrides=parse_overrides(overrides), arms=arms)
    except StudyError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if plan_only:
        typer.echo("\n".join(plan.notes))
        for job in plan.jobs:
            s = job.settings
            what = (f"{s.rl.recipe}/{s.rl.env}/{s.rl.algorithm} G={s.rl.group_size} questions={s.rl.questions_per_step} "
                    f"steps={s.rl.steps} from" if job.rl else "no RL, evaluates")
            typer.echo(f"{job.label}: {what} {s.rl.init_from} → {job.run_dir}")
        return
    outcome = run_study(plan, log=typer.echo)
    typer.echo(f"\n{outcome.table}\n")
    for failure in outcome.failures:
        typer.echo(f"error: {failure.label} failed: {failure.error}", err=True)
    if outcome.failures:
        typer.echo(f"{len(outcome.failures)} run(s) failed; the report holds the others. Run the same command again "
                   "to run only the missing ones.", err=True)
        raise typer.Exit(1)
