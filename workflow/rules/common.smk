# Shared definitions: the config file the CLI reads, the CLI invocation, the arms.
import csv
import importlib.util
import os
import sys

import yaml
from pathlib import Path

from snakemake.utils import validate

# The repository root: the main Snakefile's folder (the top-level Snakefile), or the one above it
# (`snakemake -s workflow/Snakefile`).
ROOT = Path(workflow.basedir) if (Path(workflow.basedir) / "src").is_dir() else Path(workflow.basedir).parent
# The package from this source tree, for its configuration check and STEP_KEYS (no torch needed).
sys.path.insert(0, str(ROOT / "src"))
from acoustic_mlm import config as amlm_config
from acoustic_mlm.config import sweep as amlm_sweep
from acoustic_mlm.utils import atomic_path


# The CLI reads the configuration from a file, so that file is the whole configuration: the one
# --configfile, or the default. Snakemake deep-merges --configfile into the Snakefile's
# `configfile:` (config/config.yaml), which would add the default's arms to the user's; so `config`
# is rebuilt below from the file's contents alone. Several --configfile files would be merged where
# the CLI reads one: they are refused in one line (exit status 2, as the CLI's refusals), before any
# job runs. `--config KEY=VALUE` overrides are merged into the file's settings, and the result is
# written to MERGED, which every job then reads in place of the file.
def _refuse(message):
    print(f"snakemake: error: {message}", file=sys.stderr)
    sys.exit(2)


# Snakemake keeps only the last of repeated options (`--configfile a --configfile b` reads b alone), so
# the command line itself is counted too.
_given = [a for a in sys.argv[1:] if a.split("=")[0] in ("--configfile", "--configfiles")]
if len(workflow.overwrite_configfiles) > 1 or len(_given) > 1:
    _refuse(
        f"{max(len(workflow.overwrite_configfiles), len(_given))} --configfile files given; the stages read one: "
        "merge them into one YAML file and pass it with --configfile FILE"
    )
CONFIGFILE = (
    os.path.relpath(workflow.overwrite_configfiles[-1]) if workflow.overwrite_configfiles else "config/config.yaml"
)
MERGED = "results/config.yaml"  # the file's settings with the --config overrides, when there are any
OVERRIDES = dict(workflow.config_settings.config or {})


def _typed(value):
    """A nested --config value as YAML would type it: Snakemake reads `train={steps: 10}` with YAML's
    base loader, which leaves every scalar inside a string ('10'); a top-level value it types itself."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, str):
        for parse in (int, float):  # the order Snakemake types a top-level value in
            try:
                return parse(value)
            except ValueError:
                pass
        words = {"true": True, "false": False, "null": None, "~": None}
        return words.get(value.lower(), value) if value.lower() in words else value
    return value


def _merged(base, overrides):
    """`base` with `overrides` merged in key by key (nested mappings merged, any other value replaced), as
    Snakemake merges --config into its config; `base` itself is left as it is."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


class _PlainDumper(yaml.SafeDumper):
    def ignore_aliases(self, data):  # the package's reader refuses YAML aliases: write every value out
        return True


# The CLI's own validation (schema, cross-field and cross-stage rules), at parse time: an invalid
# file or override stops Snakemake with one line before any job runs, so no output is deleted for a
# job that would fail.
try:
    _whole = amlm_config.read_yaml(CONFIGFILE)
    _source = CONFIGFILE
    if OVERRIDES:
        _whole = _merged(_whole, {k: _typed(v) for k, v in OVERRIDES.items()})
        _source = f"{CONFIGFILE} with --config {' '.join(OVERRIDES)}"
    amlm_config.from_mapping(_whole, source=_source)
except amlm_config.ConfigError as _exc:
    print(f"snakemake: invalid configuration: {_exc}", file=sys.stderr)
    sys.exit(2)  # as the CLI: exit status 2 for a problem with the user's input
# The catalog's check: the same schema (generated from the configuration's dataclasses, as the
# package's; tests/config/test_schema.py holds the two equal), by Snakemake's validator.
validate(_whole, str(ROOT / "workflow/schemas/config.schema.yaml"), set_default=False)
if OVERRIDES:
    _text = (
        f"# {CONFIGFILE} with --config {' '.join(OVERRIDES)}, written by Snakemake for its jobs: edit those,\n"
        "# not this file (it is rewritten at every run with overrides).\n"
    ) + yaml.dump(_whole, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True)
    if not os.path.isfile(MERGED) or Path(MERGED).read_text() != _text:  # unchanged: left alone
        with atomic_path(MERGED) as _tmp:
            _tmp.write_text(_text)
    CONFIGFILE = MERGED
config.clear()
config.update(_whole)

# Snakemake strips PYTHONPATH inside conda jobs and the conda env does not install this
# package, so every job points Python at the source tree explicitly.
# The path is relative to the working directory (the repository root), so that moving the
# checkout does not change rule parameters and trigger reruns.
SRC = os.path.relpath(ROOT / "src")
# The paper's digitised curves, shipped in the repository (relative, as SRC: `-d .test` finds them too).
REFERENCE = os.path.relpath(ROOT / "data/reference/paper_curves.csv")
AMLM = f'PYTHONPATH="{SRC}" python -m acoustic_mlm'
# A run on several GPUs: torchrun starts train.processes DDP processes (one per GPU) on each of
# train.nodes machines (srun and a c10d rendezvous under SLURM); the package builds the command
# (src/acoustic_mlm/train/launch.py, standard library only, loaded by path: no package install needed).
_spec = importlib.util.spec_from_file_location("amlm_launch", ROOT / "src/acoustic_mlm/train/launch.py")
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)
TRAIN_CLI = launch.train_launcher(config["train"], SRC)
TRAIN_SLURM = launch.slurm_resources(config["train"])  # nodes, one task per node (several nodes)
GPUS = amlm_config.world_size(config["train"])  # GPUs of one training job
ENV = "../envs/amlm.yaml"

# The training runs: the arms, or with a `sweep:` section every point of it (acoustic_mlm.config.sweep).
RUNS = amlm_sweep.run_names(config)
SWEEP = bool(config.get("sweep"))
FIGURE_FORMATS = ["png", "pdf", "svg"]
USE_GPU = config["train"]["device"] == "cuda"


wildcard_constraints:
    run="|".join(RUNS),
    shard=r"\d{5}",


def settings_for(step, run=None):
    """The settings a step's outputs depend on (acoustic_mlm.config.STEP_KEYS, the one statement of
    them; dvc.yaml lists the same): as rule params, a changed value reruns the rule. A sweep point's
    settings are those of its own configuration (the file's with the point's values in place)."""
    cfg = amlm_sweep.point_config(config, run) if run is not None else config
    return amlm_config.settings(cfg, amlm_config.result_keys(step, cfg, run))


# The shards of data/prepared/shards.csv, written by the `plan` checkpoint (data.smk); until it
# exists, checkpoints.plan.get() tells Snakemake to re-evaluate the DAG after it runs.
def shard_ids():
    """The shards of the plan (raises Snakemake's incomplete-checkpoint signal until it exists)."""
    plan = checkpoints.plan.get().output[0]
    with open(plan) as fh:
        return sorted({int(row["shard"]) for row in csv.DictReader(fh)})


def prepared_shards(wildcards):
    return [f"data/prepared/shard-{k:05d}" for k in shard_ids()]


def code_shards(wildcards):
    return [f"data/codes/shard-{k:05d}" for k in shard_ids()]
