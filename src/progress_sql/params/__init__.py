"""The parameters of the pipeline: the typed settings of params.yaml and how they are loaded
(named as the file, apart from ``configs/``, the presets, studies and DeepSpeed files it reads).

One module per concern; the names below are re-exported so that callers import them from
``progress_sql.params`` whatever module holds them:

- ``settings``: the settings sections and the root ``Settings`` (with ``SettingsError``);
- ``yaml_files``: YAML read as params.yaml is read (YAML 1.2 booleans);
- ``loading``: a params tree, params.yaml, a preset and ``--set`` overrides into Settings;
- ``presets``: the named overlays of params.yaml (``configs/presets/``);
- ``models``: which model settings name local folders, and that those exist;
- ``reference``: docs/CONFIG.md, generated from the settings and params.yaml's comments
  (``python -m progress_sql.params.reference``; not re-exported).
"""

from progress_sql.params.loading import dotted_items, load_settings, settings_from_dict
from progress_sql.params.models import LOCAL_MODEL_ROOTS, MODEL_SETTINGS, check_model_paths, is_local_model_path
from progress_sql.params.presets import (
    NO_PRESET,
    PACKAGE_CONFIGS,
    PRESETS_SUBDIR,
    load_preset,
    merge_overlay,
    preset_file,
    preset_names,
    presets_dir,
    with_preset,
)
from progress_sql.params.settings import (
    ALGORITHMS,
    EVAL_SPLITS,
    Algorithm,
    CopyWarmupSettings,
    DataSettings,
    EnvSettings,
    EvalSettings,
    EvalSplit,
    GenerationSettings,
    HardnessMix,
    LoRASettings,
    MixRatios,
    ModelSettings,
    NAMING_CASES,
    ODTSettings,
    Registered,
    RewardSettings,
    RLAsyncSettings,
    RLSettings,
    SandboxSettings,
    Settings,
    SettingsError,
    SFTSettings,
    StudySettings,
    TrackingSettings,
    default_settings,
    derived_settings,
    part_settings,
    registered_names,
    registered_settings,
)
from progress_sql.params.yaml_files import yaml_load

__all__ = [
    "ALGORITHMS", "EVAL_SPLITS", "LOCAL_MODEL_ROOTS", "MODEL_SETTINGS", "NAMING_CASES", "NO_PRESET", "PACKAGE_CONFIGS",
    "PRESETS_SUBDIR",
    "Algorithm", "CopyWarmupSettings", "DataSettings", "EnvSettings", "EvalSettings", "EvalSplit",
    "GenerationSettings", "HardnessMix", "LoRASettings", "MixRatios", "ModelSettings", "ODTSettings", "RLAsyncSettings",
    "RLSettings", "Registered", "RewardSettings", "SFTSettings", "SandboxSettings", "Settings", "SettingsError",
    "StudySettings", "TrackingSettings",
    "check_model_paths", "default_settings", "derived_settings", "dotted_items", "is_local_model_path", "load_preset",
    "load_settings", "merge_overlay", "part_settings", "preset_file", "preset_names", "presets_dir", "registered_names",
    "registered_settings", "settings_from_dict", "with_preset", "yaml_load",
]
