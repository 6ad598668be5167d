"""Configuration: one YAML file, validated before any work, typed once into `Config`.

The same file is Snakemake's configfile and DVC's params file. Validation has two layers:
the JSON schema generated from the dataclasses (types, ranges, enums, unknown keys) and the cross-field rules
(the conv stack must stride 320, one arm per role, ...). Every failure is one line that names
the file and the key. `load(path)` returns a `Config`, frozen dataclasses all the way down; the
stages read it (`cfg.train.lr`, `cfg.model_for(run)`, `cfg.train_for(run, seed)`) and never the
YAML mapping, which only this package reads (settings, sweeps, DVC params).

Callers write `from acoustic_mlm import config as C` and `C.load(path)`, whichever module below
holds the name:

    sections.py   the typed sections and `Config` (per-arm views as methods)
    load.py       the strict YAML reader (read_yaml: the mapping, for a program that edits it), load,
                  from_mapping (validate and type a mapping)
    checks.py     validate, section by section, and the check_* functions of one value; the formulas
                  it applies are the model's (acoustic_mlm.model.config) and EnCodec's (encodec.py)
    steps.py      what each pipeline step's outputs depend on (STEP_KEYS, UPSTREAM, DVC_STAGES)
    sweep.py      the optional `sweep:` section's points (imported as acoustic_mlm.config.sweep)
    schema.py     the JSON schema generated from the dataclasses (`python -m acoustic_mlm.config --write`)
"""

from acoustic_mlm.config.checks import (
    ADDED_KEYS,
    MAX_LABEL_CHARS,
    MAX_RUN_NAME_BYTES,
    RENAMED_KEYS,
    check_run_name,
    renamed_settings,
    validate,
)
from acoustic_mlm.config.load import from_mapping, load, read_yaml
from acoustic_mlm.config.schema import SCHEMA_PATH
from acoustic_mlm.config.sections import (
    ATTENTIONS,
    CQT_IMPLS,
    NORMS,
    PRECISIONS,
    ROLES,
    TOKENIZER_MODES,
    ClaimThresholds,
    Config,
    DataConfig,
    FigureConfig,
    ModelConfig,
    ModelSection,
    RunConfig,
    TokenizerConfig,
    TrainConfig,
    TrainSection,
    to_dict,
    world_size,
)
from acoustic_mlm.config.steps import DVC_STAGES, STEP_KEYS, result_keys, settings
from acoustic_mlm.errors import ConfigError  # the error every check raises, as C.ConfigError

__all__ = [
    # sections.py
    "SCHEMA_PATH",
    "NORMS",
    "ATTENTIONS",
    "ROLES",
    "PRECISIONS",
    "CQT_IMPLS",
    "TOKENIZER_MODES",
    "Config",
    "DataConfig",
    "TokenizerConfig",
    "ModelSection",
    "ModelConfig",
    "TrainSection",
    "TrainConfig",
    "RunConfig",
    "FigureConfig",
    "ClaimThresholds",
    "to_dict",
    "world_size",
    # load.py
    "load",
    "read_yaml",
    "from_mapping",
    # checks.py
    "validate",
    "ADDED_KEYS",
    "RENAMED_KEYS",
    "renamed_settings",
    "MAX_RUN_NAME_BYTES",
    "MAX_LABEL_CHARS",
    "check_run_name",
    # steps.py
    "STEP_KEYS",
    "DVC_STAGES",
    "result_keys",
    "settings",
    # errors.py
    "ConfigError",
]
