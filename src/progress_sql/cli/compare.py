"""``progress-sql compare``: two evaluations of the same questions, paired question by question
(gained, lost, exact McNemar p), so that a change of a few points can be told from noise."""

from __future__ import annotations

import json

import typer


def compare(
    run_a: str = typer.Argument(..., help="Output folder of the first `progress-sql eval` (the baseline)"),
    run_b: str = typer.Argument(..., help="Output folder of the second (the candidate)"),
    splits: list[str] = typer.Option([], "--split", help="Split to compare (repeatable; default: every split both hold)"),
    modes: list[str] = typer.Option([], "--mode", help="Decoding mode: greedy, vote, multi_turn (repeatable; default: all)"),
    ids: bool = typer.Option(False, "--ids", help="Also list the ids of the gained and lost examples"),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list, one object per split and mode"),
) -> None:
    """Compare run B with run A: EX of each, examples gained and lost, McNemar p-value."""
    # imported here: progress_sql.eval loads the evaluation runner, which no other command needs
    from progress_sql.eval.paired import MODES, CompareError, compare_runs, markdown_table

    try:
        comparisons = compare_runs(run_a, run_b, splits, modes or MODES)
    except CompareError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps([c.record() for c in comparisons], indent=1))
        return
    typer.echo(f"A: {run_a}\nB: {run_b}\n")
    typer.echo(markdown_table(comparisons))
    for c in comparisons:
        if c.only_a or c.only_b:
            typer.echo(f"note: {c.split}/{c.mode}: {c.only_a} examples only in A, {c.only_b} only in B (left out)")
        if ids:
            typer.echo(f"{c.split}/{c.mode} gained: {', '.join(c.gained) or '-'}")
            typer.echo(f"{c.split}/{c.mode} lost:   {', '.join(c.lost) or '-'}")
