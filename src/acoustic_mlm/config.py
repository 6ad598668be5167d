"""Configuration: one YAML file, validated before any work, read into typed dataclasses.

The same file is Snakemake's configfile and DVC's params file. Validation has two layers:
the JSON schema next to this module (types, ranges, unknown keys) and the cross-field rules
below (the conv stack must stride 320, one arm per role, ...). Every failure is one
line that names the file and the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError

SCHEMA_PATH = Path(__file__).with_name("config.schema.json")
ENCODEC_HOP = 320  # samples per EnCodec frame at 24 kHz (75 Hz)
NORMS = ("pre", "post", "deepnorm")  # the norm axis of the ablation
ATTENTIONS = ("softmax", "pb_relax")  # the attention axis
ROLES = ("clip10", "clip1", "deepnorm", "attn_relax")  # the paper's four curves, in legend order
# Keys of earlier versions, with what replaced them (a config still using one gets this sentence).
RENAMED_RUN_KEYS = {
    "deepnorm": "'norm: deepnorm' (norm is pre | post | deepnorm)",
    "attn_relax": "'attention: pb_relax' (attention is softmax | pb_relax)",
}


class ConfigError(UserError, ValueError):
    """A configuration problem; the message is one line naming the file and the key."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the acoustic MLM: the `model:` section plus one arm's stability settings."""

    conv_layers: tuple[tuple[int, int, int], ...]  # (channels, kernel, stride) per conv layer
    dim: int  # transformer width
    layers: int  # transformer blocks
    heads: int  # attention heads
    ffn_dim: int  # feed-forward hidden size
    dropout: float  # residual dropout
    attention_dropout: float  # dropout on attention probabilities
    pos_conv_kernel: int  # convolutional positional embedding kernel
    pos_conv_groups: int  # ... and groups
    final_dim: int  # per-codebook projection size for cosine logits
    logit_temp: float  # cosine logits / logit_temp
    relax_alpha: float  # PB-Relax alpha (used only when attn_relax)
    feature_penalty: float  # weight of the L2 penalty on conv features
    mask_prob: float  # fairseq span-mask probability
    mask_length: int  # span length in frames
    mask_min_masks: int  # minimum spans per sequence
    codebooks: int  # codebooks predicted
    codebook_size: int  # codes per codebook
    norm: str = "pre"  # pre: x + F(LN(x)); post: LN(x + F(x)); deepnorm: LN(alpha*x + F(x)), beta-scaled init
    attention: str = "softmax"  # softmax: fused kernel; pb_relax: PB-Relax with relax_alpha


@dataclass(frozen=True)
class TrainConfig:
    """The `train:` section plus one arm's gradient clip and seed."""

    device: str
    processes: int  # DDP processes per run (torchrun); batch_size is the global batch, split between them
    precision: str
    steps: int
    batch_size: int  # crops per micro-batch
    accum_steps: int  # micro-batches per optimizer update (effective batch = batch_size * accum_steps)
    crop_seconds: float
    lr: float
    warmup_steps: int
    end_lr: float
    lr_power: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    log_interval: int
    valid_crops: int
    max_nonfinite: int  # this many non-finite steps in a row end the run as diverged (0: never)
    checkpoint_interval: int  # steps between resumable states in <run>/state/ (0: none)
    threads: int
    workers: int  # data-loader worker processes (0: load in the training process)
    compile: bool  # torch.compile the model
    clip: float = 0.0  # max total gradient norm; 0 disables clipping
    seed: int = 0
    diagnostics: bool = True  # stability diagnostics in every metrics row (diagnostics.py)


@dataclass(frozen=True)
class RunConfig:
    """One arm of the ablation."""

    name: str
    label: str
    norm: str  # pre | post | deepnorm
    attention: str  # softmax | pb_relax
    clip: float
    seeds: tuple[int, ...]  # one training run per seed; the figure shows their mean and 95% interval
    role: str | None = None  # which of the paper's curves it reproduces (ROLES), None for an extra arm


@lru_cache(maxsize=1)
def _schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _key_path(error) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "<top level>"


def validate(cfg: Any, source: str = "config") -> dict:
    """Check a configuration mapping; raise ConfigError (one line) on the first problem."""
    import jsonschema

    _check_renamed_keys(cfg, source)
    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(list(e.absolute_path)), str(e.absolute_path)))
    if errors:
        err = errors[0]
        where = _key_path(err)
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            key = f"{where}.{extra[0]}" if where != "<top level>" else extra[0]
            raise ConfigError(f"{source}: unknown key '{key}'")
        if err.validator == "required":
            missing = [k for k in err.validator_value if k not in err.instance]
            key = f"{where}.{missing[0]}" if where != "<top level>" else missing[0]
            raise ConfigError(f"{source}: missing key '{key}'")
        raise ConfigError(f"{source}: '{where}': {err.message}")

    d = cfg["data"]
    if d["source"] == "url" and not (d["url"] and d["known_hash"]):
        raise ConfigError(f"{source}: 'data.source' is url: set 'data.url' and 'data.known_hash' (sha256:<hex>)")
    if d["source"] == "folder" and not d["folder"]:
        raise ConfigError(f"{source}: 'data.source' is folder: set 'data.folder'")
    seen_roles: dict[str, str] = {}
    for name, run in cfg["runs"].items():
        role = run.get("role")
        if role is not None and role in seen_roles:
            raise ConfigError(f"{source}: 'runs.{name}.role' is {role}, as is 'runs.{seen_roles[role]}.role': "
                              "each of the paper's curves is reproduced by one arm")
        if role is not None:
            seen_roles[role] = name
    labels = [r["label"] for r in cfg["runs"].values()]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{source}: 'runs': two arms share a label; legend labels must be unique")
    m = cfg["model"]
    stride = total_stride(m["conv_layers"])
    if stride != ENCODEC_HOP:
        raise ConfigError(
            f"{source}: 'model.conv_layers' strides multiply to {stride}; they must multiply to "
            f"{ENCODEC_HOP} so that features align with EnCodec's 75 Hz frames"
        )
    if m["dim"] % m["heads"]:
        raise ConfigError(f"{source}: 'model.dim' ({m['dim']}) must be divisible by 'model.heads' ({m['heads']})")
    if m["dim"] % m["pos_conv_groups"]:
        raise ConfigError(
            f"{source}: 'model.dim' ({m['dim']}) must be divisible by 'model.pos_conv_groups' ({m['pos_conv_groups']})"
        )
    t = cfg["train"]
    if t["batch_size"] % t["processes"]:
        raise ConfigError(f"{source}: 'train.batch_size' ({t['batch_size']}) must be divisible by 'train.processes' ({t['processes']})")
    if t["warmup_steps"] >= t["steps"]:
        raise ConfigError(f"{source}: 'train.warmup_steps' ({t['warmup_steps']}) must be below 'train.steps' ({t['steps']})")
    if crop_frames(cfg) < 2 * m["mask_length"]:
        raise ConfigError(f"{source}: 'train.crop_seconds' is too short for 'model.mask_length' spans")
    if cfg["tokenizer"]["mode"] == "calibrated" and cfg["tokenizer"]["calibration_frames"] < m["codebook_size"]:
        raise ConfigError(
            f"{source}: 'tokenizer.calibration_frames' must be at least 'model.codebook_size' ({m['codebook_size']})"
        )
    from .claims import ClaimThresholds  # the claims module owns the cross-field rules of its thresholds

    try:
        ClaimThresholds.from_dict(cfg["claims"])
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    f = cfg["figure"]
    if f["y_min"] is not None and f["y_max"] is not None and f["y_min"] >= f["y_max"]:
        raise ConfigError(f"{source}: 'figure.y_min' must be below 'figure.y_max'")
    return cfg


def _check_renamed_keys(cfg: Any, source: str) -> None:
    """Keys of earlier versions get a sentence saying what replaced them, not 'unknown key'."""
    runs = cfg.get("runs") if isinstance(cfg, dict) else None
    for name, run in (runs.items() if isinstance(runs, dict) else ()):
        for old in RENAMED_RUN_KEYS:
            if isinstance(run, dict) and old in run:
                raise ConfigError(f"{source}: 'runs.{name}.{old}' was replaced by {RENAMED_RUN_KEYS[old]}")


def load(path: str | Path) -> dict:
    """Read and validate a YAML configuration file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: configuration file not found")
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return validate(cfg, source=str(path))


def run_config(cfg: dict, run: str) -> RunConfig:
    if run not in cfg["runs"]:
        raise ConfigError(f"config: no run '{run}' under 'runs' (have: {', '.join(cfg['runs'])})")
    r = dict(cfg["runs"][run])
    r["seeds"] = tuple(r["seeds"])
    return RunConfig(name=run, **r)


def runs_by_role(cfg: dict) -> dict[str, str]:
    """role -> run name, for the arms that reproduce one of the paper's curves."""
    return {r["role"]: name for name, r in cfg["runs"].items() if r.get("role") is not None}


def model_config(cfg: dict, run: str | None = None) -> ModelConfig:
    """The `model:` section with one arm's norm and attention applied."""
    m = dict(cfg["model"])
    m["conv_layers"] = tuple(tuple(layer) for layer in m["conv_layers"])
    if run is not None:
        r = run_config(cfg, run)
        m.update(norm=r.norm, attention=r.attention)
    return ModelConfig(**m)


def train_config(cfg: dict, run: str | None = None, seed: int | None = None) -> TrainConfig:
    """The `train:` section with one arm's clip and one of its seeds (default: the first)."""
    t = dict(cfg["train"])
    t["betas"] = tuple(t["betas"])
    if run is not None:
        r = run_config(cfg, run)
        if seed is not None and seed not in r.seeds:
            raise ConfigError(f"config: seed {seed} is not among 'runs.{run}.seeds' {list(r.seeds)}")
        t.update(clip=r.clip, seed=r.seeds[0] if seed is None else seed)
    return TrainConfig(**t)


def to_dict(dc) -> dict:
    """A dataclass as a plain, JSON-able dict (saved inside checkpoints and metadata)."""
    return json.loads(json.dumps(asdict(dc)))


def total_stride(conv_layers) -> int:
    """Samples between consecutive frames of a (channels, kernel, stride) conv stack: the product
    of its strides (ENCODEC_HOP = 320 in every valid config)."""
    return math.prod(stride for _, _, stride in conv_layers)


def crop_frames(cfg: dict) -> int:
    """Frames in one training crop: train.crop_seconds rounded to whole samples, then down to whole
    EnCodec frames. Training cuts crops of this length; prepare rejects clips shorter than one."""
    return int(round(cfg["train"]["crop_seconds"] * cfg["data"]["sample_rate"])) // ENCODEC_HOP


# ----------------------------------------------------------------------------- what each step depends on
#
# The one statement of which settings each pipeline step's outputs depend on. Snakemake passes
# them as rule params (a changed value reruns the rule), dvc.yaml lists them as stage params (a
# test holds it equal to DVC_STAGES below), and training fingerprints its resumable states and
# completed seeds with them. Each entry: (included keys, excluded keys); a key is a section, a
# dotted key, or an arm's key with "{run}" (that arm) or "*" (every arm). Settings left out change
# how fast or where a step runs, not what it writes.
STEP_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fetch": (("data",), ("data.shard_files", "data.sample_rate", "data.valid_fraction", "data.split_seed")),
    "plan": (("data.shard_files",), ()),
    "prepare_shard": (("data.sample_rate", "train.crop_seconds"), ()),  # clips shorter than a crop are rejected
    "prepare_merge": (("data.valid_fraction", "data.split_seed"), ()),
    "tokenize_fit": (("tokenizer",), ("tokenizer.batch_size", "tokenizer.device", "tokenizer.segment_seconds",
                                      "tokenizer.context_seconds")),
    "tokenize_shard": (("tokenizer",), ()),  # batch size, segments and device move codes at near-ties
    "tokenize_merge": (("tokenizer.batch_size",), ()),
    "train": (("model", "train", "runs.{run}"), ("train.threads", "train.workers", "train.checkpoint_interval",
                                                 "runs.{run}.label", "runs.{run}.role")),
    "aggregate": (("runs.*.label",), ()),
    "figure": (("figure", "runs.*.label", "runs.*.role"), ()),
    "claims": (("claims", "figure.split", "runs.*.role"), ()),
    "compare": (("figure", "runs.*.label", "runs.*.role"), ()),
    "stability": (("figure", "runs.*.label", "runs.*.role", "runs.*.clip", "claims.spike_threshold",
                   "claims.recovery_margin"), ()),
}
# The steps before each step, whose settings also shape its outputs.
UPSTREAM = {
    "fetch": (), "plan": ("fetch",), "prepare_shard": ("fetch", "plan"),
    "prepare_merge": ("fetch", "plan", "prepare_shard"),
    "tokenize_fit": ("fetch", "plan", "prepare_shard", "prepare_merge"),
    "tokenize_shard": ("fetch", "plan", "prepare_shard", "prepare_merge", "tokenize_fit"),
    "tokenize_merge": ("fetch", "plan", "prepare_shard", "prepare_merge", "tokenize_fit", "tokenize_shard"),
}
UPSTREAM["train"] = UPSTREAM["tokenize_merge"] + ("tokenize_merge",)
# DVC runs each group of steps as one stage.
DVC_STAGES = {
    "fetch": ("fetch",), "prepare": ("plan", "prepare_shard", "prepare_merge"),
    "tokenize": ("tokenize_fit", "tokenize_shard", "tokenize_merge"), "train": ("train",),
    "aggregate": ("aggregate",), "figure": ("figure",), "claims": ("claims",), "compare": ("compare",),
    "stability": ("stability",),
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


def result_keys(step: str, cfg: dict, run: str | None = None, upstream: bool = False) -> list[str]:
    """The config's leaf keys (dotted) that `step`'s outputs depend on (with `upstream`, also those
    of every step before it), in config order. `run` names the arm of a training step."""
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


def get(cfg: dict, dotted: str) -> Any:
    """The value at a dotted key ("train.lr", "runs.prenorm_clip1.clip")."""
    node: Any = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def settings(cfg: dict, keys: list[str]) -> dict:
    """{dotted key: value} for these keys: what a step's outputs depend on."""
    return {k: get(cfg, k) for k in keys}
