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


# The CLI reads the configuration from a file, so that file is the whole configuration: the one
# --configfile, or the default. Snakemake deep-merges --configfile into the Snakefile's
# `configfile:` (config/config.yaml), which would add the default's arms to the user's; so `config`
# is replaced below by the file's contents alone. `--config KEY=VALUE` overrides would never reach
# the CLI's jobs, and several --configfile files would be merged where the CLI reads one: both are
# refused in one line (exit status 2, as the CLI's refusals), before any job runs.
def _refuse(message):
    print(f"snakemake: error: {message}", file=sys.stderr)
    sys.exit(2)


if workflow.config_settings.config:
    _refuse(
        f"--config {' '.join(f'{k}=...' for k in workflow.config_settings.config)}: command-line overrides are "
        "not supported; put every setting in one YAML file and pass it with --configfile FILE"
    )
# Snakemake keeps only the last of repeated options (`--configfile a --configfile b` reads b alone), so
# the command line itself is counted too.
_given = [a for a in sys.argv[1:] if a.split("=")[0] in ("--configfile", "--configfiles")]
if len(workflow.overwrite_configfiles) > 1 or len(_given) > 1:
    _refuse(
        f"{max(len(workflow.overwrite_configfiles), len(_given))} --configfile files given; the stages read one: "
        "merge them into one YAML file and pass it with --configfile FILE"
    )
CONFIGFILE = (
    os.path.relpath(workflow.overwrite_configfiles[-1])
    if workflow.overwrite_configfiles
    else "config/config.yaml"
)
# The CLI's own validation (schema, cross-field and cross-stage rules), at parse time: an invalid
# file stops Snakemake before any job runs, so no output is deleted for a job that would fail.
try:
    _whole = amlm_config.load(CONFIGFILE).mapping  # the validated file: Snakemake's config is the file's keys
except amlm_config.ConfigError as _exc:
    print(f"snakemake: invalid configuration: {_exc}", file=sys.stderr)
    sys.exit(2)  # as the CLI: exit status 2 for a problem with the user's input
except ImportError as _exc:  # Snakemake's own environment lacks a dependency of the package
    # The shipped schema is generated from the configuration's dataclasses (python -m acoustic_mlm.config
    # --write; tests/config/test_schema.py holds it current): keys, types, ranges and every enum, the
    # model's norms and attentions included. Only the rules across keys are left to the stages.
    print(f"snakemake: warning: full configuration check skipped ({_exc}); schema only", file=sys.stderr)
    with open(CONFIGFILE) as _fh:
        _whole = yaml.safe_load(_fh)
    validate(_whole, str(ROOT / "src/acoustic_mlm/config/config.schema.json"))
config.clear()
config.update(_whole)

# Snakemake strips PYTHONPATH inside conda jobs and the conda env does not install this
# package, so every job points Python at the source tree explicitly.
# The path is relative to the working directory (the repository root), so that moving the
# checkout does not change rule parameters and trigger reruns.
SRC = os.path.relpath(ROOT / "src")
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
