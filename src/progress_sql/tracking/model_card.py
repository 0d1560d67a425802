"""The model card logged with every registered version: what the model is, how it was
trained, on which data, how it scored, and what it is not for."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from progress_sql.params import Settings


def _model_facts(model_dir: Path) -> list[tuple[str, str]]:
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return [("config", "unreadable")]
    facts = [("architecture", ", ".join(config.get("architectures") or [config.get("model_type", "?")]))]
    for key, label in (("num_hidden_layers", "layers"), ("hidden_size", "hidden size"),
                       ("num_attention_heads", "attention heads"), ("vocab_size", "vocabulary")):
        if key in config:
            facts.append((label, str(config[key])))
    tiny = model_dir / "tiny_model.json"  # written by train.tiny for models it builds
    if tiny.is_file():
        try:
            facts.append(("parameters", f"{json.loads(tiny.read_text(encoding='utf-8'))['parameters']:,}"))
        except (OSError, json.JSONDecodeError, KeyError):
            pass
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    if weights:
        facts.append(("weights", f"{weights / 2**20:.1f} MiB (safetensors)"))
    return facts


def _table(rows: list[tuple[str, str]]) -> str:
    return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def render_model_card(model_dir: str | os.PathLike, settings: Settings, metrics: Mapping[str, Any],
                      *, data_version: str | None = None) -> str:
    """Markdown: model facts (from its config), training recipe, data version, the
    evaluation metrics (the gate metric first), intended use and limits."""
    from progress_sql.tracking.mlflow_runs import data_version as corpus_version

    model_dir = Path(model_dir)
    rl, sft, gate = settings.rl, settings.sft, settings.eval.gate_metric
    version = data_version or corpus_version(settings.data.out_dir) or "unknown (corpus not built here)"
    training = [
        ("warm start (SFT)", f"from {sft.init_from}: {sft.epochs:g} epochs, lr {sft.lr:g}, "
                             f"revision share {sft.revision_share:g}"),
        ("RL", f"recipe {rl.recipe}, environment {rl.env}, {rl.algorithm}, G={rl.group_size}, "
               f"{rl.questions_per_step} questions/step, up to {rl.steps} steps or {rl.max_minutes:g} min, lr {rl.lr:g}"),
        ("reward weights", f"rewards.{rl.recipe} in params.yaml"),
        ("max turns", str(settings.env.max_turns)),
    ]
    numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    ordered = ([gate] if gate in numeric else []) + sorted(k for k in numeric if k != gate)
    metric_rows = [(f"**{k}** (gate)" if k == gate else k, f"{numeric[k]:.4f}") for k in ordered]
    sections = [
        f"# {settings.tracking.model_name}",
        "A Text-to-SQL policy post-trained by the progress-sql pipeline (multi-turn RL with "
        "execution-grounded rewards). It answers a question about a SQLite database, given the "
        "schema as DDL, with its reasoning and one SQL query in the output format's tags.",
        "## Model\n\n" + _table(_model_facts(model_dir)),
        "## Training\n\n" + _table(training),
        "## Data\n\n" + _table([("corpus", settings.data.out_dir), ("data version", version),
                                 ("train / dev / test", f"{settings.data.train_size} / {settings.data.dev_size} / "
                                                        f"{settings.data.test_size} questions")]),
        "## Evaluation\n\n" + (_table(metric_rows) if metric_rows else "No evaluation metrics were given."),
        "## Intended use and limits\n\n"
        "Research and pipeline testing. Run the SQL it writes only through a read-only sandbox "
        "(`progress-sql ask` does): the model can write wrong or slow queries. A tiny model built "
        "for CPU runs has seen only the bundled synthetic corpus; its answers elsewhere are not "
        "meaningful.",
    ]
    return "\n\n".join(sections) + "\n"
