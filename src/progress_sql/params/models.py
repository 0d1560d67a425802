"""Model folders: whether a model setting (``sft.init_from``, ``rl.init_from``) names a local
folder or a hub id, and the check that a named local folder exists before a stage loads it.

Nothing downloads at run time. A value is a local folder when it exists, is absolute, starts
with ./ ../ or ~, or lies under one of ``LOCAL_MODEL_ROOTS``: models/ (pretrained weights put
there by hand, as the papers' presets expect them: models/Qwen2.5-Coder-7B-Instruct) and
outputs/ (what the pipeline trains). Anything else is a hub id (from the local cache when
HF_HUB_OFFLINE=1) or the name of a bundled model.
"""

from __future__ import annotations

from pathlib import Path

from progress_sql.params.settings import Settings, SettingsError

LOCAL_MODEL_ROOTS = ("models", "outputs")
MODEL_SETTINGS = ("sft.init_from", "rl.init_from")


def is_local_model_path(value: str) -> bool:
    """Whether a model setting's value names a local folder (see ``LOCAL_MODEL_ROOTS``)."""
    path = Path(value).expanduser()
    if path.exists() or path.is_absolute() or value.startswith((".", "~")):
        return True
    return len(path.parts) > 1 and path.parts[0] in LOCAL_MODEL_ROOTS


def check_model_paths(settings: Settings, *keys: str) -> None:
    """SettingsError naming the setting and the folder when a model setting of ``keys`` (dotted,
    among ``MODEL_SETTINGS``) names a local folder that does not exist. The stages that load a
    model call it first, so a preset whose model is missing fails at once, while the stages
    that need no model (data, evaluation of another model) run."""
    for key in keys:
        section, name = key.split(".")
        value = getattr(getattr(settings, section), name)
        if is_local_model_path(value) and not Path(value).expanduser().exists():
            raise SettingsError(f"{key}: {value} does not exist (a local model folder: put the model there, "
                                f"e.g. save_pretrained output or a hub snapshot, or point {key} at one)")
