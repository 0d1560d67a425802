"""Helpers shared by the CLI commands: settings with a preset and overrides, and clean exits."""

from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Iterator

import click
import typer
import yaml
from typer.core import TyperGroup

from progress_sql.params import (
    Settings,
    SettingsError,
    load_settings,
    presets_dir,
    settings_from_dict,
    with_preset,
    yaml_load,
)

SET_HELP = "Override a setting, e.g. --set data.train_size=200 (repeatable; the value is read as YAML)"
# The options most commands share, one home each (typer reads the option from the Annotated type):
# ``params: ParamsFile = "params.yaml"``, ``overrides: Overrides = []``, ...
ParamsFile = Annotated[str, typer.Option("--params", help="Settings file (defaults when absent)")]
Overrides = Annotated[list[str], typer.Option("--set", help=SET_HELP)]
CorpusDir = Annotated[str, typer.Option("--corpus", help="Corpus folder (default: data.out_dir)")]
ProgressBar = Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar")]
PRESET_HELP = ("A preset of configs/presets/ (or a YAML file) merged over the settings file before the --set "
               "overrides, e.g. cpu-demo (the one-minute demo sizes)")

@dataclass(frozen=True)
class Invocation:
    """What the options before the command give it (``progress-sql --preset NAME data build``):
    the group's callback puts it in its context's ``obj``, which every command's context inherits."""

    preset: str | None = None


def global_preset(ctx: typer.Context) -> str | None:
    """The ``--preset`` given before the command (None: none given)."""
    return ctx.obj.preset if isinstance(ctx.obj, Invocation) else None


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["data.train_size=200", ...]`` → ``{"data.train_size": 200}``; values are YAML."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        try:
            out[key.strip()] = yaml_load(raw)
        except yaml.YAMLError as err:
            raise typer.BadParameter(f"{key}: value is not valid YAML ({err})", param_hint="--set") from None
    return out


def load_or_exit(ctx: typer.Context, params: str, overrides: dict | None = None, preset: str | None = None) -> Settings:
    """Settings from ``params`` (built-in defaults when the default params.yaml is absent), the
    preset (default: the ``--preset`` given before the command) merged in, then the overrides; a
    bad file, preset or override ends the command with its message and exit code 2."""
    path = Path(params)
    preset = preset if preset is not None else global_preset(ctx)
    try:
        if params == "params.yaml" and not path.exists():
            raw, layers = with_preset({}, preset, "built-in defaults", presets_dir())
            return settings_from_dict(raw, "built-in defaults", overrides, layers=layers)
        return load_settings(path, overrides, preset=preset)
    except SettingsError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


# The errors a stage reports as one line (exit 1), named "module:Class". They are looked up when
# a stage fails, and only in modules already imported (an error of a module that was never
# imported cannot have been raised): entering a stage imports nothing, so a refused second
# writer answers before torch or MLflow are loaded.
STAGE_ERRORS = ("progress_sql.corpus.records:CorpusError", "progress_sql.tracking.mlflow_runs:TrackingError",
                "progress_sql.files:FolderInUse", "progress_sql.sql.worker:SandboxUnavailable")
# what the stages that load a policy report too
POLICY_ERRORS = ("progress_sql.inference.models:PolicyLoadError", "progress_sql.inference.backends.base:NonFiniteLogits",
                 "progress_sql.train.checkpoint:CheckpointError")


def _imported(names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    found = []
    for name in names:
        module, _, cls = name.partition(":")
        if module in sys.modules:
            found.append(getattr(sys.modules[module], cls))
    return tuple(found)


def model_or_exit(model: str) -> str:
    """``model`` as given, or exit 2 naming it when it names a local folder (a path: absolute,
    ./ ~, or under models/ or outputs/) that does not exist: a typo of a folder is not a hub id."""
    from progress_sql.params import is_local_model_path

    if not model.strip():
        typer.echo("error: --model is empty: give a local model folder, a hub id ORG/NAME or a registered "
                   "model models:/NAME@ALIAS", err=True)
        raise typer.Exit(2)
    if is_local_model_path(model) and not Path(model).expanduser().exists():
        typer.echo(f"error: --model {model}: no such folder (a local model folder; a hub id is ORG/NAME, "
                   "a registered one models:/NAME@ALIAS)", err=True)
        raise typer.Exit(2)
    return model


@contextmanager
def stage_or_exit(name: str, errors: tuple[str, ...] = (), writes: str | Path | None = None) -> Iterator[None]:
    """End the command with its message and exit code 1 when the stage run inside (a function
    of ``progress_sql.stages``) fails in a way it reports: one of ``STAGE_ERRORS`` (a
    CorpusError, an MLflow TrackingError, a FolderInUse, a SandboxUnavailable), a ValueError or
    FileNotFoundError from the stage's checks, or one of ``errors`` ("module:Class"). Any other
    error while the disk holding ``writes`` (the stage's output folder) is full is that: a
    library that fails to write does not always say why (safetensors, torch). An OSError goes on
    to ``Commands``; so does a failed write of the local MLflow store (``store_disk_error``: SQLite's
    full disk or I/O error, named by the store's file). The stage's MLflow run is already marked
    FAILED when the error gets here."""
    from progress_sql.files import disk_full

    try:
        yield
    except Exception as err:
        tracking = sys.modules.get("progress_sql.tracking.mlflow_runs")  # loaded: MLflow may have failed
        if tracking is not None and (failure := tracking.store_disk_error(err)) is not None:
            raise failure from None
        if isinstance(err, (ValueError, FileNotFoundError, *_imported((*STAGE_ERRORS, *errors)))):
            typer.echo(f"error: stage {name} failed: {err}", err=True)
            raise typer.Exit(1) from None
        if not isinstance(err, OSError) and writes is not None and disk_full(writes):
            typer.echo(os_error_line(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(writes))), err=True)
            raise typer.Exit(1) from None
        raise


# ----------------------------------------------------------------------------- faults of the machine
_ELSEWHERE = "write elsewhere (--out, or the setting naming the folder)"
# what to do when the machine refuses a write, by its errno
_WRITE_HINTS = {
    errno.ENOSPC: f"free space on that disk or {_ELSEWHERE}",
    errno.EDQUOT: f"free space within your disk quota or {_ELSEWHERE}",
    errno.EFBIG: f"over the file size limit (ulimit -f) or the file system's largest file: raise the limit or "
                 f"{_ELSEWHERE}",
    errno.EROFS: _ELSEWHERE,
}


def os_error_line(err: OSError) -> str:
    """One line for an error of the machine (a read-only folder, a full disk, a missing
    permission): the path, the cause and, for a refused write, what to do, as ``error: cannot
    write PATH: Read-only file system; write elsewhere (...)``."""
    cause = err.strerror or str(err) or type(err).__name__
    if err.filename is None:  # a connection, a pipe: no path to name
        return f"error: {cause}"
    path = f"{err.filename} → {err.filename2}" if err.filename2 is not None else str(err.filename)
    if err.errno in _WRITE_HINTS:
        return f"error: cannot write {path}: {cause}; {_WRITE_HINTS[err.errno]}"
    return f"error: {path}: {cause}"


class Commands(TyperGroup):
    """The command group: an OSError that reaches it (the machine's fault, not the input's) ends
    the command with ``os_error_line`` and exit code 1 instead of a traceback. A broken pipe
    (``progress-sql ... | head``) ends it quietly."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise typer.Exit(1) from None
        except OSError as err:
            typer.echo(os_error_line(err), err=True)
            raise typer.Exit(1) from None


# ----------------------------------------------------------------------------- progress in a log
STATUS_EVERY_S = 20.0  # a progress bar's status line at most this often when stderr is not a terminal


class StatusLines:
    """A text stream over ``stream`` (stderr) that turns the carriage-return redraws of progress
    bars (tqdm's, and transformers') into whole lines, at most one per ``every_s`` seconds
    per bar, plus each bar's last state when it closes. Other text passes through unchanged.
    In a terminal a bar redraws one line in place; in a pipe (``dvc repro`` in CI, a log file)
    each redraw would be appended to that one line, tens of times a second."""

    def __init__(self, stream, every_s: float = STATUS_EVERY_S, clock=None) -> None:
        import time

        self._stream, self._every = stream, every_s
        self._clock = clock or time.monotonic
        self._pending: str | None = None  # the newest status not yet printed
        self._last: dict[str, float] = {}  # bar label → when its status was last printed
        self._after_status = False  # the last thing written was a status line

    def write(self, text: str) -> int:
        if "\r" not in text:
            if text == "\n" and (self._pending is not None or self._after_status):  # a bar closing
                if self._pending is not None:
                    self._emit(self._pending)  # its final state
                self._after_status = False
                return len(text)
            self._after_status = False
            return self._stream.write(text)
        lead, *redraws = text.split("\r")
        if lead:  # text before the redraw
            self._stream.write(lead)
        status = next((part.strip() for part in reversed(redraws) if part.strip()), "")
        if not status:  # a bar clearing its line (leave=False): its final state
            if self._pending is not None:
                self._emit(self._pending)
            return len(text)
        now = self._clock()
        if now - self._last.get(_label(status), -float("inf")) >= self._every:
            self._emit(status)
        else:
            self._pending = status
        return len(text)

    def _emit(self, status: str) -> None:
        self._pending, self._after_status = None, True
        self._last[_label(status)] = self._clock()
        self._stream.write(status + "\n")
        self._stream.flush()

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str):  # encoding, fileno, ... of the wrapped stream
        return getattr(self._stream, name)


def _label(status: str) -> str:
    """A bar's label: its status up to the first colon (``sft: 40%|...`` → ``sft``)."""
    return status.split(":", 1)[0]


def status_lines_when_piped() -> None:
    """Wrap ``sys.stderr`` in ``StatusLines`` when it is not a terminal (see there)."""
    import sys

    if not isinstance(sys.stderr, StatusLines) and not sys.stderr.isatty():
        sys.stderr = StatusLines(sys.stderr)


def exit_on_sigterm() -> None:
    """End the command on SIGTERM (``kill``, a cancelled run, ``die_with_dvc``) as an exception
    would: the context managers and finally clauses run, so a vLLM engine's processes are shut
    down with the command. Python's default, an immediate exit, left them running as orphans
    holding the cores and GiBs of memory."""
    import signal

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def die_with_dvc() -> None:
    """Under ``dvc repro`` / ``dvc exp run`` (which set DVC_STAGE) on Linux, have the kernel send
    this process SIGTERM when its parent (DVC: the stage's shell execs the command) dies. A
    DVC that was killed records nothing this run writes, and a trainer left running as an
    orphan would only race the next ``dvc repro``. Elsewhere nothing changes: a command run by
    hand, ``nohup`` or a scheduler lives on without its parent as before."""
    import os
    import signal
    import sys

    if "DVC_STAGE" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
