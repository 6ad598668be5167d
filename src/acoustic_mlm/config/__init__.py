"""Configuration: one YAML file, validated before any work, read into typed dataclasses.

The same file is Snakemake's configfile and DVC's params file. Validation has two layers:
the JSON schema next to this module (types, ranges, unknown keys) and the cross-field rules
(the conv stack must stride 320, one arm per role, ...). Every failure is one line that names
the file and the key.

This module is the package's face: callers write `from acoustic_mlm import config as C` and
`C.load(path)`, `C.model_config(cfg, run)`, `C.result_keys("train", cfg, run)`, whichever module
below holds the name:

    sections.py   the typed sections (ModelConfig, TrainConfig, RunConfig, ClaimThresholds), the
                  research axes' values, one arm's settings from a mapping, world_size
    load.py       the strict YAML reader, the path and size checks, load
    checks.py     validate, section by section, the check_* functions of one value, renamed keys,
                  and the formulas the checks apply (mask_groups, the CQT frequencies, total_stride,
                  crop_frames)
    steps.py      what each pipeline step's outputs depend on (STEP_KEYS, UPSTREAM, DVC_STAGES)
    sweep.py      the optional `sweep:` section's points (imported as acoustic_mlm.config.sweep)
"""

from acoustic_mlm.config.checks import (
    MAX_LABEL_CHARS,
    MAX_RUN_NAME_BYTES,
    RENAMED_KEYS,
    check_run_name,
    cqt_bin_frequency,
    cqt_top_frequency,
    crop_frames,
    mask_groups,
    renamed_settings,
    total_stride,
    validate,
)
from acoustic_mlm.config.load import load
from acoustic_mlm.config.sections import (
    ATTENTIONS,
    CQT_IMPLS,
    NORMS,
    PRECISIONS,
    ROLES,
    SCHEMA_PATH,
    ClaimThresholds,
    ModelConfig,
    RunConfig,
    TrainConfig,
    get,
    model_config,
    run_config,
    runs_by_role,
    to_dict,
    train_config,
    world_size,
)
from acoustic_mlm.config.steps import DVC_STAGES, STEP_KEYS, result_keys, settings
from acoustic_mlm.errors import ConfigError  # the error every check raises, as C.ConfigError

__all__ = [
    # sections.py
    "SCHEMA_PATH", "NORMS", "ATTENTIONS", "ROLES", "PRECISIONS", "CQT_IMPLS",
    "ModelConfig", "TrainConfig", "RunConfig", "ClaimThresholds",
    "model_config", "train_config", "run_config", "runs_by_role", "to_dict", "get", "world_size",
    # load.py
    "load",
    # checks.py
    "validate", "RENAMED_KEYS", "renamed_settings", "MAX_RUN_NAME_BYTES", "MAX_LABEL_CHARS", "check_run_name",
    "total_stride", "mask_groups", "cqt_bin_frequency", "cqt_top_frequency", "crop_frames",
    # steps.py
    "STEP_KEYS", "DVC_STAGES", "result_keys", "settings",
    # errors.py
    "ConfigError",
]
