"""Configuration: one YAML file, validated before any work, read into typed dataclasses.

The same file is Snakemake's configfile and DVC's params file. Validation has two layers:
the JSON schema next to this module (types, ranges, unknown keys) and the cross-field rules
below (the conv stack must stride 320, one arm per role, ...). Every failure is one
line that names the file and the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from acoustic_mlm import encodec
from acoustic_mlm.errors import ConfigError, UserError  # noqa: F401 - ConfigError: config.ConfigError for callers

SCHEMA_PATH = Path(__file__).with_name("config.schema.json")
NORMS = ("pre", "post", "deepnorm")  # the norm axis of the ablation
ATTENTIONS = ("softmax", "pb_relax")  # the attention axis
ROLES = ("clip10", "clip1", "deepnorm", "attn_relax")  # the paper's four curves, in legend order
# The values train.precision takes, read from the schema (CLI options offer the same ones)
PRECISIONS = tuple(json.loads(SCHEMA_PATH.read_text())["properties"]["train"]["properties"]["precision"]["enum"])
# Keys of earlier versions, with what replaced them (a config still using one gets this sentence).
RENAMED_RUN_KEYS = {
    "deepnorm": "'norm: deepnorm' (norm is pre | post | deepnorm)",
    "attn_relax": "'attention: pb_relax' (attention is softmax | pb_relax)",
}
# Keys of earlier versions renamed with their values unchanged: old dotted key -> new dotted key. A
# config still using one gets a sentence naming the new key; settings recorded under the old names
# (a reference run's, report.verify) are read through `renamed_settings`.
RENAMED_KEYS = {
    "tokenizer.level": "tokenizer.loudness",  # "level" is an RVQ level (a codebook); this is loudness normalisation
    "tokenizer.level_target": "tokenizer.loudness_target",
}


def world_size(train: dict) -> int:
    """DDP processes of one training run, from a `train:` section: train.nodes x train.processes."""
    return train["processes"] * train.get("nodes", 1)


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
    # MERT / fairseq recipe switches (docs/recipe.md); each default leaves the model as without it
    activation_dropout: float | None = None  # FFN hidden dropout (fairseq activation_dropout); None: = dropout
    encoder_layerdrop: float = 0.0  # probability of skipping each block in training (LayerDrop)
    dropout_input: float = 0.0  # dropout on the projected features, before masking
    feature_grad_mult: float = 1.0  # gradient scale into the conv front end (0: frozen)
    special_symbols: int = 0  # extra never-target classes per codebook (fairseq's Dictionary: 4)
    cqt_loss_weight: float = 0.0  # weight of the CQT reconstruction loss on masked frames (0: off)
    cqt_bins: int = 336  # CQT bins predicted
    cqt_bins_per_octave: int = 48  # CQT resolution
    cqt_fmin: float = 32.7  # lowest CQT bin's centre frequency, Hz
    mixture_prob: float = 0.0  # share of training crops mixed with in-batch noise (0: off)
    mixture_segments: tuple[int, int] = (1, 3)  # noise segments per mixed crop, inclusive range
    mixture_samples: tuple[int, int] = (12000, 36000)  # samples per noise segment, inclusive range
    mixture_volume: float = 1.0  # noise gain
    fp16_logits: bool = False  # cosine logits rounded to the model's dtype before / logit_temp (MERT's compute_nce)


@dataclass(frozen=True)
class TrainConfig:
    """The `train:` section plus one arm's gradient clip and seed."""

    device: str
    processes: int  # DDP processes per node (torchrun); batch_size is the global micro-batch, split between all
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
    crop_unit: str = "frame"  # frame: crops start on EnCodec frames; sample: at any sample (MERT random_crop)
    mask_group: int = 0  # crops whose masks are equalised together (MERT: one GPU's micro-batch); 0: whole micro-batch
    nodes: int = 1  # machines per run, each with `processes` processes (world = nodes * processes)
    total_updates: int | None = None  # schedule length (fairseq max_update); None: steps
    log_powers_of_two: bool = True  # metrics rows also at steps 1, 2, 4, 8, ...
    loggers: tuple[str, ...] = ("csv",)  # where metrics rows go besides the CSV (trackers.py); results do not depend on it
    wandb_project: str = "acoustic-mlm"  # Weights & Biases project of the wandb logger

    @property
    def world(self) -> int:
        """DDP processes in all: nodes * processes."""
        return world_size({"processes": self.processes, "nodes": self.nodes})

    @property
    def schedule_updates(self) -> int:
        """Updates over which the learning rate decays to end_lr: total_updates, else steps."""
        return self.total_updates if self.total_updates is not None else self.steps

    @property
    def crops_per_update(self) -> int:
        """Crops in one optimizer update: batch_size (the global micro-batch) * accum_steps."""
        return self.batch_size * self.accum_steps


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


@dataclass(frozen=True)
class ClaimThresholds:
    """Every number the verdicts depend on (the config's `claims:` section, same names)."""

    start_min: float = 9.0  # (a) lowest first loss, in bits, that counts as "near 10 bits"
    start_max: float = 10.6  # (a) highest; uniform guessing is 10 bits, the paper starts at 9.3-9.5
    converge_margin: float = 0.1  # (c, e, f) converged = stays within this many bits of its final loss
    spike_threshold: float = 0.5  # (d) a spike rises more than this many bits above the running minimum
    recovery_margin: float = 0.2  # (d) recovered = back within this many bits of that minimum
    stabilise_fraction: float = 0.4  # (f) converged step / last step must not exceed this
    min_final_gap: float = 0.02  # (b) final losses closer than this many bits are a tie: inconclusive
    seed_spread: str = "range"  # with several seeds: "range" (max - min) or "2std" (two sample std)

    def __post_init__(self):
        if not self.start_min < self.start_max:
            raise ConfigError("claims: 'start_min' must be below 'start_max'")
        if not 0 < self.stabilise_fraction <= 1:
            raise ConfigError("claims: 'stabilise_fraction' must be in (0, 1]")
        for name in ("converge_margin", "spike_threshold", "recovery_margin", "min_final_gap"):
            if getattr(self, name) < 0:
                raise ConfigError(f"claims: '{name}' must not be negative")
        if not self.recovery_margin < self.spike_threshold:
            raise ConfigError("claims: 'recovery_margin' must be below 'spike_threshold'")
        if self.seed_spread not in ("range", "2std"):
            raise ConfigError("claims: 'seed_spread' must be 'range' or '2std'")

    @classmethod
    def from_dict(cls, d: dict | None) -> "ClaimThresholds":
        d = dict(d or {})
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"claims: unknown key '{unknown[0]}'")
        return cls(**d)


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
    check_finite(cfg, source)
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
    check_integers(cfg, _schema(), source)

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
    if stride != encodec.HOP:
        raise ConfigError(
            f"{source}: 'model.conv_layers' strides multiply to {stride}; they must multiply to "
            f"{encodec.HOP} so that features align with EnCodec's 75 Hz frames"
        )
    if m["dim"] % m["heads"]:
        raise ConfigError(f"{source}: 'model.dim' ({m['dim']}) must be divisible by 'model.heads' ({m['heads']})")
    if m["dim"] % m["pos_conv_groups"]:
        raise ConfigError(
            f"{source}: 'model.dim' ({m['dim']}) must be divisible by 'model.pos_conv_groups' ({m['pos_conv_groups']})"
        )
    t = cfg["train"]
    world = world_size(t)
    if t["batch_size"] % world:
        raise ConfigError(f"{source}: 'train.batch_size' ({t['batch_size']}) must be divisible by the {world} processes "
                          "('train.nodes' x 'train.processes'): it is the global micro-batch, split between them")
    total = t.get("total_updates") or t["steps"]
    if t["warmup_steps"] >= total:
        key = "train.total_updates" if t.get("total_updates") else "train.steps"
        raise ConfigError(f"{source}: 'train.warmup_steps' ({t['warmup_steps']}) must be below '{key}' ({total})")
    if t["steps"] > total:
        raise ConfigError(f"{source}: 'train.steps' ({t['steps']}) must not exceed 'train.total_updates' ({total})")
    _check_recipe(cfg, source)
    if crop_frames(cfg) < 2 * m["mask_length"]:
        raise ConfigError(f"{source}: 'train.crop_seconds' is too short for 'model.mask_length' spans")
    if cfg["tokenizer"]["mode"] == "calibrated" and cfg["tokenizer"]["calibration_frames"] < m["codebook_size"]:
        raise ConfigError(
            f"{source}: 'tokenizer.calibration_frames' must be at least 'model.codebook_size' ({m['codebook_size']})"
        )
    try:
        ClaimThresholds.from_dict(cfg["claims"])
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    f = cfg["figure"]
    if f["y_min"] is not None and f["y_max"] is not None and f["y_min"] >= f["y_max"]:
        raise ConfigError(f"{source}: 'figure.y_min' must be below 'figure.y_max'")
    check_codebooks(cfg, source)
    check_labels(cfg, source)
    for name, run in cfg["runs"].items():
        check_run_name(name, source, f"runs.{name}")
        check_label_length(run["label"], source, f"runs.{name}.label")
    check_seeds(cfg, source)
    if cfg.get("sweep") is not None:
        from acoustic_mlm.config.sweep import validate_points  # the sweep's points are validated as files are, by this function

        train_keys = [k for k in result_keys("train", cfg) if k.startswith(("model.", "train."))]
        validate_points(cfg, source, validate, allowed=train_keys)
    return cfg


# ----------------------------------------------------------------------------- limits of later stages
#
# Values the schema accepts but a later stage cannot use. Each check is a function of one value, so
# that settings derived from the config (a sweep's run names, say) can be checked the same way.

# A run name is a file name in results/runs/<run>/, results/logs/train/<run>.log and DVC's
# train@<run>: the longest, <run>.log, must fit the 255-byte name limit of common file systems.
MAX_RUN_NAME_BYTES = 255 - len(".log")
# torch.manual_seed takes seeds in [-2^63, 2^64 - 1]; training seeds process r with seed + r * 1,000,003.
TORCH_SEED_MAX = 2**64 - 1
RANK_SEED_STRIDE = 1_000_003
# The legend draws each label on one line: four labels of 60 wide characters (W) fill about 70 % of
# the figure's width, the legend still above the curves (drawn and looked at); the presets' labels
# have 32-42. A label of 10,000 characters covered the plot and pushed the other arms off the image.
MAX_LABEL_CHARS = 60


def check_run_name(name: str, source: str = "config", key: str | None = None) -> None:
    """A run name (given or derived) that every results path can hold: at most MAX_RUN_NAME_BYTES
    bytes of UTF-8, no '/' or NUL, not '.' or '..'."""
    key = key if key is not None else f"runs.{name}"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_RUN_NAME_BYTES:
        raise ConfigError(f"{source}: '{_short(key)}': the run name is {size} bytes; at most {MAX_RUN_NAME_BYTES} "
                          f"(results/logs/train/<run>.log must fit the file system's 255-byte name limit); shorten it")
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise ConfigError(f"{source}: '{_short(key)}': {name!r} cannot be a folder name; use letters, digits and _")


def check_seed(seed: int, source: str = "config", key: str = "seed", processes: int = 1) -> None:
    """A seed torch accepts in every one of `processes` DDP processes (seed + rank * 1,000,003)."""
    top = TORCH_SEED_MAX - RANK_SEED_STRIDE * (processes - 1)
    if not 0 <= seed <= top:
        raise ConfigError(f"{source}: '{key}' has seed {seed}; seeds run from 0 to {top} (torch.manual_seed takes "
                          f"at most 2^64 - 1{', less 1000003 per further process' if processes > 1 else ''})")


def check_seeds(cfg: dict, source: str = "config") -> None:
    t = cfg["train"]
    world = world_size(t)
    for name, run in cfg["runs"].items():
        for seed in run["seeds"]:
            check_seed(seed, source, f"runs.{name}.seeds", world)
    check_seed(cfg["tokenizer"]["seed"], source, "tokenizer.seed")


def check_label_length(label: str, source: str = "config", key: str = "label") -> None:
    """A legend label the figure can draw beside the curves (MAX_LABEL_CHARS characters, one line)."""
    if len(label) > MAX_LABEL_CHARS or "\n" in label:
        what = "holds a line break" if "\n" in label else f"is {len(label)} characters long"
        raise ConfigError(f"{source}: '{key}' {json.dumps(_short(label))} {what}; the legend draws one line of at most "
                          f"{MAX_LABEL_CHARS} characters: shorten it (the run name can carry the rest)")


def _check_recipe(cfg: dict, source: str) -> None:
    """Cross-field rules of the MERT recipe switches: mask groups, noise mixing, CQT bins (docs/recipe.md)."""
    m, t = cfg["model"], cfg["train"]
    groups = mask_groups(t["batch_size"], t["mask_group"])
    world = world_size(t)
    if len(groups) % world and (t["mask_group"] or m["mixture_prob"] > 0):
        raise ConfigError(
            f"{source}: 'train.mask_group' ({t['mask_group']}) splits 'train.batch_size' ({t['batch_size']}) into "
            f"{len(groups)} groups, which the {world} processes ('train.nodes' x 'train.processes') must divide "
            "(each process holds whole groups)"
        )
    if m["mixture_prob"] > 0:
        crop = crop_frames(cfg) * encodec.HOP
        (n_min, n_max), (len_min, len_max) = m["mixture_segments"], m["mixture_samples"]
        if n_min > n_max or len_min > len_max:
            raise ConfigError(f"{source}: 'model.mixture_segments' and 'model.mixture_samples' must be [min, max] ranges")
        if len_max > crop:
            raise ConfigError(f"{source}: 'model.mixture_samples' reaches {len_max} samples, longer than a crop ({crop})")
        smallest = min(len(g) for g in groups)
        if (smallest - 1) * crop < len_max:
            raise ConfigError(
                f"{source}: 'model.mixture_prob' > 0 needs groups ('train.mask_group') of crops whose others hold "
                f"{len_max} samples of noise ('model.mixture_samples'); the smallest group has {smallest} crops"
            )
    top = cqt_top_frequency(m["cqt_fmin"], m["cqt_bins"], m["cqt_bins_per_octave"])
    if m["cqt_loss_weight"] > 0 and top >= cfg["data"]["sample_rate"] / 2:
        raise ConfigError(f"{source}: 'model.cqt_bins' reach {top:.0f} Hz, above Nyquist of 'data.sample_rate'")


def _check_renamed_keys(cfg: Any, source: str) -> None:
    """Keys of earlier versions get a sentence saying what replaced them, not 'unknown key'."""
    claims = cfg.get("claims") if isinstance(cfg, dict) else None
    if isinstance(claims, dict) and "final_fraction" in claims:
        raise ConfigError(f"{source}: 'claims.final_fraction' was removed: the final loss has one definition, the "
                          "mean over the last 10% of the steps (acoustic_mlm.curves); delete the key")
    runs = cfg.get("runs") if isinstance(cfg, dict) else None
    for name, run in (runs.items() if isinstance(runs, dict) else ()):
        for old in RENAMED_RUN_KEYS:
            if isinstance(run, dict) and old in run:
                raise ConfigError(f"{source}: 'runs.{name}.{old}' was replaced by {RENAMED_RUN_KEYS[old]}")
    for old, new in RENAMED_KEYS.items():
        *parents, last = old.split(".")
        node = cfg
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            raise ConfigError(f"{source}: '{old}' was renamed to '{new}' (the values are the same)")


def renamed_settings(settings: dict) -> dict:
    """{dotted key: value} recorded by an earlier version, its renamed keys (RENAMED_KEYS) under
    their new names, in the same order."""
    return {RENAMED_KEYS.get(key, key): value for key, value in settings.items()}


def load(path: str | Path) -> dict:
    """Read and validate a YAML configuration file."""
    path = Path(path)
    _check_config_path(path)
    return validate(read_yaml(path), source=str(path))


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
    for key in ("mixture_segments", "mixture_samples"):
        if key in m:
            m[key] = tuple(m[key])
    if run is not None:
        r = run_config(cfg, run)
        m.update(norm=r.norm, attention=r.attention)
    return ModelConfig(**m)


def train_config(cfg: dict, run: str | None = None, seed: int | None = None) -> TrainConfig:
    """The `train:` section with one arm's clip and one of its seeds (default: the first)."""
    t = dict(cfg["train"])
    t["betas"] = tuple(t["betas"])
    t["loggers"] = tuple(t.get("loggers", ("csv",)))
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
    of its strides (encodec.HOP = 320 in every valid config)."""
    return math.prod(stride for _, _, stride in conv_layers)


def mask_groups(batch: int, group: int) -> list:
    """The rows of a micro-batch of `batch` crops split into ceil(batch / group) groups of about
    `group` crops (0: one group). Group j holds rows j, j + n, j + 2n, ... (n groups), so the
    rows r, r + P, ... that process r of P keeps hold whole groups whenever P divides n."""
    n = 1 if group <= 0 else -(-batch // group)
    return [np.arange(j, batch, n) for j in range(n)]


def cqt_bin_frequency(k, fmin: float, bins_per_octave: int):
    """Centre frequency of CQT bin k: fmin * 2^(k / bins_per_octave) (nnAudio create_cqt_kernels)."""
    return fmin * 2.0 ** (k / bins_per_octave)


def cqt_top_frequency(fmin: float, bins: int, bins_per_octave: int) -> float:
    """Centre frequency of the highest bin; must stay below Nyquist (MERT: 32.7 Hz, 336, 48 -> 4,127 Hz)."""
    return cqt_bin_frequency(bins - 1, fmin, bins_per_octave)


def crop_frames(cfg: dict) -> int:
    """Frames in one training crop: train.crop_seconds rounded to whole samples, then down to whole
    EnCodec frames. Training cuts crops of this length; prepare rejects clips shorter than one."""
    return int(round(cfg["train"]["crop_seconds"] * cfg["data"]["sample_rate"])) // encodec.HOP


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
                                                 "train.loggers", "train.wandb_project",  # trackers watch, never change
                                                 "runs.{run}.label", "runs.{run}.role")),
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
    "stability": ("stability",), "map": ("map",), "map_figure": ("map_figure",), "map_claims": ("map_claims",),
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
# ----------------------------------------------------------------------------- strict reading

MAX_CONFIG_BYTES = 1 << 20  # the presets are under 10 KB; a larger file is not a configuration


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases and duplicate keys.

    Aliases are refused outright, not capped: a configuration never needs one, and refusing the
    first alias event ends a "billion laughs" file before anything is expanded. Duplicate keys
    (PyYAML keeps the last silently) are refused with the key and both lines.
    """

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(f"line {event.start_mark.line + 1}: YAML alias '*{_short(event.anchor)}' is not "
                              "supported in a configuration; write the value out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if first != key_node.start_mark.line + 1:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: duplicate key {_short(key)!r} "
                                  f"(first at line {first}); keep one")
        return super().construct_mapping(node, deep=deep)


def _short(value, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_yaml(path: str | Path):
    """The YAML document in `path`, read strictly: UTF-8 only, no aliases, no duplicate keys, at
    most MAX_CONFIG_BYTES. Every refusal is one ConfigError line naming the file."""
    path = Path(path)
    _check_config_path(path)
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size} bytes; a configuration file is at most {MAX_CONFIG_BYTES} bytes")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); "
                          "save the file as UTF-8") from None
    try:
        document = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if document is None:
        raise ConfigError(f"{path}: the file is empty (no settings); copy a preset from config/ and edit it")
    return document


def _check_config_path(path: Path) -> None:
    """The configuration path is a regular file (or a link to one): a folder, a device or a FIFO is
    named as what it is, never opened (reading a FIFO would wait forever)."""
    if path.is_file():
        return
    if path.is_dir():
        raise ConfigError(f"{path}: a folder, not a configuration file; name a YAML file (e.g. config/smoke.yaml)")
    if path.exists():
        raise ConfigError(f"{path}: not a regular file (a device, FIFO or socket); name a YAML file")
    if path.is_symlink():
        raise ConfigError(f"{path}: a broken link; configuration file not found")
    raise ConfigError(f"{path}: configuration file not found")


# ----------------------------------------------------------------------------- checks the schema cannot express


def _dotted(parts: tuple) -> str:
    return ".".join(str(p) for p in parts) if parts else "<top level>"


def check_finite(cfg: Any, source: str = "config", at: tuple = ()) -> None:
    """Refuse NaN and infinity anywhere: JSON schema ranges let NaN through (every comparison is false)."""
    if isinstance(cfg, float) and not math.isfinite(cfg):
        raise ConfigError(f"{source}: '{_dotted(at)}' is {cfg}; it must be a finite number")
    if isinstance(cfg, dict):
        for k, v in cfg.items():
            check_finite(v, source, at + (k,))
    elif isinstance(cfg, list):
        for i, v in enumerate(cfg):
            check_finite(v, source, at + (i,))


def check_integers(cfg: Any, schema: dict, source: str = "config", at: tuple = ()) -> None:
    """Refuse a float where the schema asks for an integer. JSON schema counts 150.0 as an
    integer, but the code would receive a float (range(150.0) fails deep inside training)."""
    kind = schema.get("type")
    wants_int = kind == "integer" or (isinstance(kind, list) and "integer" in kind) or (
        isinstance(schema.get("const"), int) and not isinstance(schema.get("const"), bool))
    if isinstance(cfg, float) and wants_int:
        raise ConfigError(f"{source}: '{_dotted(at)}' is {cfg!r}; it must be a whole number, written without "
                          "a decimal point")
    if isinstance(cfg, dict):
        props, other = schema.get("properties", {}), schema.get("additionalProperties")
        for k, v in cfg.items():
            sub = props.get(k, other if isinstance(other, dict) else None)
            if sub is not None:
                check_integers(v, sub, source, at + (k,))
    elif isinstance(cfg, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(cfg):
            check_integers(v, schema["items"], source, at + (i,))


def check_codebooks(cfg: dict, source: str = "config") -> None:
    """The model predicts codebooks the tokenizer will write (known before tokenize runs)."""
    m, bandwidth = cfg["model"], float(cfg["tokenizer"]["bandwidth"])
    have = encodec.codebooks(bandwidth)
    if m["codebooks"] > have:
        raise ConfigError(
            f"{source}: 'model.codebooks' is {m['codebooks']} but 'tokenizer.bandwidth' {bandwidth:g} kbps gives "
            f"{have} codebooks (EnCodec 24 kHz: 1.5/3/6/12/24 kbps give 2/4/8/16/32); lower model.codebooks "
            "or raise tokenizer.bandwidth"
        )
    if m["codebook_size"] < encodec.CODEBOOK_SIZE:
        raise ConfigError(f"{source}: 'model.codebook_size' is {m['codebook_size']} but EnCodec codes run from 0 "
                          f"to {encodec.CODEBOOK_SIZE - 1}; set it to {encodec.CODEBOOK_SIZE}")


def check_labels(cfg: dict, source: str = "config") -> None:
    """Every arm's label is drawn once with matplotlib's mathtext parser, as the figure will draw it
    in its legend, so a label it cannot render fails now rather than after training."""
    labels = {name: run["label"] for name, run in cfg["runs"].items() if "$" in run["label"]}
    if not labels:
        return  # plain text: nothing to parse (and no matplotlib import)
    try:
        from matplotlib import cbook
        from matplotlib.mathtext import MathTextParser
    except ImportError:  # e.g. Snakemake's own environment; every amlm stage has matplotlib and checks again
        return

    parser = MathTextParser("path")
    for name, label in labels.items():
        if not cbook.is_math_text(label):  # an odd number of unescaped '$' is drawn as plain text
            continue
        try:
            parser.parse(label)
        except ValueError as exc:
            why = " ".join([line for line in str(exc).splitlines() if line.strip()][-1].split())
            raise ConfigError(f"{source}: 'runs.{name}.label' \"{_short(label)}\" cannot be drawn by matplotlib "
                              f"({why}); fix the math or write a literal dollar sign as \\$") from None
