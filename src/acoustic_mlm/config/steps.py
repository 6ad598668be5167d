"""What each pipeline step's outputs depend on: the settings (`STEP_KEYS`), the steps before it
(`UPSTREAM`) and DVC's grouping of steps into stages (`DVC_STAGES`), read by the Snakemake rules
(workflow/rules/common.smk), `acoustic_mlm.dvcgen` (dvc.yaml) and training's fingerprints.
"""

from __future__ import annotations

from typing import Any

from acoustic_mlm.config.sections import get

# The one statement of which settings each pipeline step's outputs depend on. Snakemake passes
# them as rule params (a changed value reruns the rule), dvc.yaml lists them as stage params (a
# test holds it equal to DVC_STAGES below), and training fingerprints its resumable states and
# completed seeds with them. Each entry: (included keys, excluded keys); a key is a section, a
# dotted key, or an arm's key with "{run}" (that arm) or "*" (every arm). Settings left out change
# how fast or where a step runs, not what it writes.
STEP_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # cpu_kernels: the pinned (avx2) or native kernels compute different bits (acoustic_mlm.kernels)
    # data.remove_archive: no step's outputs depend on it (prepare removes the archive after its outputs are whole)
    "fetch": (
        ("data", "cpu_kernels"),
        (
            "data.shard_files",
            "data.sample_rate",
            "data.sample_format",
            "data.valid_fraction",
            "data.split_seed",
            "data.remove_archive",
        ),
    ),
    "plan": (("data.shard_files",), ()),
    # clips shorter than a crop are rejected
    "prepare_shard": (("data.sample_rate", "data.sample_format", "train.crop_seconds", "cpu_kernels"), ()),
    "prepare_merge": (("data.valid_fraction", "data.split_seed"), ()),
    # the fitted tokenizer is the same at any thread count (measured: 1 and 2 threads give one tokenizer.pt)
    "tokenize_fit": (
        ("tokenizer", "cpu_kernels"),
        (
            "tokenizer.batch_size",
            "tokenizer.device",
            "tokenizer.segment_seconds",
            "tokenizer.context_seconds",
            "tokenizer.threads",
        ),
    ),
    # batch size, segments, device and threads move codes at near-ties
    "tokenize_shard": (("tokenizer", "cpu_kernels"), ()),
    "tokenize_merge": (("tokenizer.batch_size",), ()),
    "train": (
        ("model", "train", "runs.{run}", "cpu_kernels"),
        (
            "train.threads",
            "train.workers",
            "train.checkpoint_interval",
            "train.loggers",
            "train.wandb_project",  # trackers watch, never change
            "runs.{run}.label",
            "runs.{run}.role",
        ),
    ),
    # The summary steps read every arm's label and role; they take the whole `runs:` section (which
    # DVC can name), since an arm's other settings reach them through its retrained metrics anyway.
    "aggregate": (("runs",), ()),
    "figure": (("figure", "runs"), ()),
    "claims": (("claims", "figure.split", "runs"), ()),
    "compare": (("figure", "runs"), ()),
    "stability": (("figure", "runs", "claims.spike_threshold", "claims.recovery_margin"), ()),  # spikes as claim (d)
    # A sweep's stability map (config with `sweep:`): its points come from `runs` and `sweep`.
    "map": (("runs", "sweep"), ()),
    "map_figure": (("runs", "sweep", "model.relax_alpha"), ()),
    "map_claims": (("runs", "sweep", "model.relax_alpha", "claims.min_final_gap", "claims.seed_spread"), ()),
    # The decisive experiments' verdicts: their rules are fixed in code; runs' settings come from their summaries.
    "decide": (("runs", "sweep"), ()),
}
# The steps before each step, whose settings also shape its outputs.
UPSTREAM = {
    "fetch": (),
    "plan": ("fetch",),
    "prepare_shard": ("fetch", "plan"),
    "prepare_merge": ("fetch", "plan", "prepare_shard"),
    "tokenize_fit": ("fetch", "plan", "prepare_shard", "prepare_merge"),
    "tokenize_shard": ("fetch", "plan", "prepare_shard", "prepare_merge", "tokenize_fit"),
    "tokenize_merge": ("fetch", "plan", "prepare_shard", "prepare_merge", "tokenize_fit", "tokenize_shard"),
}
UPSTREAM["train"] = UPSTREAM["tokenize_merge"] + ("tokenize_merge",)
# DVC runs each group of steps as one stage.
DVC_STAGES = {
    "fetch": ("fetch",),
    "prepare": ("plan", "prepare_shard", "prepare_merge"),
    "tokenize": ("tokenize_fit", "tokenize_shard", "tokenize_merge"),
    "train": ("train",),
    "aggregate": ("aggregate",),
    "figure": ("figure",),
    "claims": ("claims",),
    "compare": ("compare",),
    "stability": ("stability",),
    "map": ("map",),
    "map_figure": ("map_figure",),
    "map_claims": ("map_claims",),
    "decide": ("decide",),
}


def _leaves(node: Any, prefix: str) -> list[str]:
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}.{k}")]
    return [prefix]


def _expand(pattern: str, cfg: dict, run: str | None) -> list[str]:
    """A pattern's dotted keys: "{run}" for the given arm, "*" for every arm."""
    if "{run}" in pattern:
        return [pattern.replace("{run}", run)] if run is not None else []
    if "*" in pattern:
        return [pattern.replace("*", name) for name in cfg["runs"]]
    return [pattern]


def _mapping(cfg) -> dict:
    """The file's mapping of a `Config` (or the mapping itself: Snakemake's and a sweep's view)."""
    return cfg if isinstance(cfg, dict) else cfg.mapping


def result_keys(step: str, cfg, run: str | None = None, upstream: bool = False) -> list[str]:
    """The config's leaf keys (dotted) that `step`'s outputs depend on (with `upstream`, also those
    of every step before it), in config order. `run` names the arm of a training step. `cfg`: a
    `Config` or its mapping."""
    cfg = _mapping(cfg)
    if step not in STEP_KEYS:
        raise KeyError(f"no pipeline step {step!r} (steps: {', '.join(STEP_KEYS)})")
    keys: list[str] = []
    for name in (UPSTREAM.get(step, ()) if upstream else ()) + (step,):
        include, exclude = STEP_KEYS[name]
        out = {e for pattern in exclude for e in _expand(pattern, cfg, run)}
        for pattern in include:
            for key in _expand(pattern, cfg, run):
                try:
                    node = get(cfg, key)
                except (KeyError, TypeError):  # an optional key left out (an arm without a role)
                    continue
                for leaf in _leaves(node, key):
                    if leaf not in out and not any(leaf.startswith(o + ".") for o in out) and leaf not in keys:
                        keys.append(leaf)
    return keys


def settings(cfg, keys: list[str]) -> dict:
    """{dotted key: value} for these keys: what a step's outputs depend on (`cfg`: a `Config` or its mapping)."""
    cfg = _mapping(cfg)
    return {k: get(cfg, k) for k in keys}
