"""The configuration's sections as typed, frozen dataclasses (a model, a training run, an arm, the
claims' thresholds), the values each research axis takes, and the functions that read one arm's
settings out of a validated configuration mapping (`model_config`, `train_config`, `run_config`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from acoustic_mlm.errors import ConfigError

SCHEMA_PATH = Path(__file__).with_name("config.schema.json")
NORMS = ("pre", "post", "deepnorm")  # the norm axis of the ablation
ATTENTIONS = ("softmax", "pb_relax", "unfused")  # the attention axis
ROLES = ("clip10", "clip1", "deepnorm", "attn_relax")  # the paper's four curves, in legend order
# The values train.precision takes, read from the schema (CLI options offer the same ones)
_SCHEMA = json.loads(SCHEMA_PATH.read_text())
PRECISIONS = tuple(_SCHEMA["properties"]["train"]["properties"]["precision"]["enum"])
# How the CQT target is computed (model/cqt.py): nnAudio's convolutions, or the same kernels by FFT
CQT_IMPLS = tuple(_SCHEMA["properties"]["model"]["properties"]["cqt_impl"]["enum"])


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
    relax_alpha: float  # PB-Relax alpha (used only when attention is pb_relax)
    feature_penalty: float  # weight of the L2 penalty on conv features
    mask_prob: float  # fairseq span-mask probability
    mask_length: int  # span length in frames
    mask_min_masks: int  # minimum spans per sequence
    codebooks: int  # codebooks predicted
    codebook_size: int  # codes per codebook
    norm: str = "pre"  # pre: x + F(LN(x)); post: LN(x + F(x)); deepnorm: LN(alpha*x + F(x)), beta-scaled init
    attention: str = "softmax"  # softmax: fused kernel; pb_relax: PB-Relax with relax_alpha; unfused: fairseq's order
    qk_gain: float = 1.0  # q and k each multiplied by this (forced logit growth); 1: off
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
    cqt_impl: str = "nnaudio"  # nnaudio: nnAudio's convolutions (as MERT); fft: the same kernels by FFT (model/cqt.py)
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
    loggers: tuple[str,
                   ...] = ("csv",)  # where metrics rows go besides the CSV (trackers.py); results do not depend on it
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
    attention: str  # softmax | pb_relax | unfused
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


def get(cfg: dict, dotted: str) -> Any:
    """The value at a dotted key ("train.lr", "runs.prenorm_clip1.clip")."""
    node: Any = cfg
    for part in dotted.split("."):
        node = node[part]
    return node

