"""The configuration's sections as typed, frozen dataclasses, and `Config`, the whole validated
file typed once: `config.load(path)` returns it and every stage reads it, never the YAML mapping.

Per-arm views are methods: `cfg.model_for(run)` (the model of one arm, `model.config.ModelConfig`),
`cfg.train_for(run, seed)` (the `train:` section with the arm's clip and seed), `cfg.run(name)`.
A sweep point is typed the same way: `cfg.point(name)` is the file's configuration with the point's
values, holding only that point (config/sweep.py). The validated mapping stays inside (`mapping`) for
what only config/ reads: the settings a step depends on (steps.py), sweep expansion and DVC params.
The model's section and its formulas live with the model (acoustic_mlm.model.config); this module
imports them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from acoustic_mlm import encodec
from acoustic_mlm.errors import ConfigError
from acoustic_mlm.model.config import ATTENTIONS, CQT_IMPLS, NORMS, ModelConfig, ModelSection

SCHEMA_PATH = Path(__file__).with_name("config.schema.json")
ROLES = ("clip10", "clip1", "deepnorm", "attn_relax")  # the paper's four curves, in legend order
# The values train.precision takes, read from the schema (CLI options offer the same ones)
_SCHEMA = json.loads(SCHEMA_PATH.read_text())
PRECISIONS = tuple(_SCHEMA["properties"]["train"]["properties"]["precision"]["enum"])
__all__ = ["NORMS", "ATTENTIONS", "CQT_IMPLS", "ModelConfig", "ModelSection"]  # the model's, named here too


def world_size(train: dict) -> int:
    """DDP processes of one training run, from a `train:` mapping (Snakemake's view of the file):
    train.nodes x train.processes."""
    return train["processes"] * train.get("nodes", 1)


def _typed(cls, mapping: dict, **replace):
    """A section's dataclass from its mapping: lists become tuples, nested sections their dataclass."""
    values = {}
    for f in fields(cls):
        if f.name in replace:
            values[f.name] = replace[f.name]
        elif f.name in mapping:
            v = mapping[f.name]
            values[f.name] = tuple(v) if isinstance(v, list) else v
    return cls(**values)


@dataclass(frozen=True)
class SyntheticConfig:
    """`data.synthetic`: the generated corpus."""

    n_clips: int
    clip_seconds: float
    sample_rate: int
    seed: int


@dataclass(frozen=True)
class DataConfig:
    """The `data:` section: where the audio comes from and how it is split."""

    source: str
    url: str | None
    known_hash: str | None
    folder: str | None
    base_url: str | None
    shard_files: int
    max_extract_gb: float
    max_compression_ratio: float
    sample_rate: int
    sample_format: str  # float32 | int16: the prepared audio's samples on disk
    valid_fraction: float
    split_seed: int
    synthetic: SyntheticConfig


@dataclass(frozen=True)
class TokenizerConfig:
    """The `tokenizer:` section."""

    mode: str  # calibrated | pretrained
    bandwidth: float
    checkpoint: str | None
    seed: int
    calibration_frames: int
    calibration_iters: int
    loudness: str
    loudness_target: float
    batch_size: int
    threads: int
    segment_seconds: float
    context_seconds: float
    device: str


@dataclass(frozen=True, kw_only=True)
class TrainSection:
    """The `train:` section, the same for every arm."""

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
    crop_unit: str  # frame: crops start on EnCodec frames; sample: at any sample (MERT random_crop)
    mask_group: int  # crops whose masks are equalised together (MERT: one GPU's micro-batch); 0: whole micro-batch
    log_interval: int
    valid_crops: int
    checkpoint_interval: int  # steps between resumable states in <run>/state/ (0: none)
    max_nonfinite: int  # this many non-finite steps in a row end the run as diverged (0: never)
    threads: int
    workers: int  # data-loader worker processes (0: load in the training process)
    compile: bool  # torch.compile the model
    diagnostics: bool  # stability diagnostics in every metrics row (diagnostics.py)
    # the optional keys: a file without them gets these
    nodes: int = 1  # machines per run, each with `processes` processes (world = nodes * processes)
    total_updates: int | None = None  # schedule length (fairseq max_update); None: steps
    log_powers_of_two: bool = True  # metrics rows also at steps 1, 2, 4, 8, ...
    loggers: tuple[str, ...] = ("csv",)  # where rows go besides the CSV (trackers.py); results do not depend on it
    wandb_project: str = "acoustic-mlm"  # Weights & Biases project of the wandb logger

    @property
    def world(self) -> int:
        """DDP processes in all: nodes * processes."""
        return self.nodes * self.processes

    @property
    def schedule_updates(self) -> int:
        """Updates over which the learning rate decays to end_lr: total_updates, else steps."""
        return self.total_updates if self.total_updates is not None else self.steps

    @property
    def crops_per_update(self) -> int:
        """Crops in one optimizer update: batch_size (the global micro-batch) * accum_steps."""
        return self.batch_size * self.accum_steps


@dataclass(frozen=True, kw_only=True)
class TrainConfig(TrainSection):
    """The training of one arm's seed: the `train:` section plus the arm's clip and the seed."""

    clip: float  # max total gradient norm; 0 disables clipping
    seed: int


@dataclass(frozen=True)
class FigureConfig:
    """The `figure:` section."""

    x_max: float | None
    y_min: float | None
    y_max: float | None
    split: str  # train | valid
    overlay_paper: bool


@dataclass(frozen=True)
class SweepGrid:
    """One entry of the optional `sweep:` section: a grid of settings crossed with some arms."""

    grid: tuple[tuple[str, tuple], ...]  # (dotted key or "seeds", values) in the file's order
    arms: tuple[str, ...] | None  # None: every arm


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


@dataclass(frozen=True)
class Config:
    """A whole configuration file, validated and typed once (`config.load`, `config.from_mapping`)."""

    source: str  # the file (or "config"), named by every error about it
    cpu_kernels: str  # avx2 | native (acoustic_mlm.kernels)
    data: DataConfig
    tokenizer: TokenizerConfig
    model: ModelSection
    train: TrainSection
    runs: dict[str, RunConfig]  # the arms, in the file's order
    figure: FigureConfig
    claims: ClaimThresholds
    sweep: tuple[SweepGrid, ...] | None
    mapping: dict = field(repr=False, compare=False)  # the validated file, read only inside config/

    @classmethod
    def from_validated(cls, cfg: dict, source: str = "config") -> "Config":
        """A mapping that passed `validate` (config.load and config.from_mapping call it), typed."""
        runs = {name: _typed(RunConfig, r, name=name, role=r.get("role")) for name, r in cfg["runs"].items()}
        data = _typed(DataConfig, cfg["data"], synthetic=_typed(SyntheticConfig, cfg["data"]["synthetic"]))
        sweep = None
        if cfg.get("sweep") is not None:
            sweep = tuple(
                SweepGrid(
                    grid=tuple((k, tuple(v)) for k, v in g["grid"].items()),
                    arms=tuple(g["arms"]) if g.get("arms") is not None else None,
                )
                for g in cfg["sweep"]
            )
        return cls(
            source=source,
            cpu_kernels=cfg["cpu_kernels"],
            data=data,
            tokenizer=_typed(TokenizerConfig, cfg["tokenizer"]),
            model=ModelSection.from_mapping(cfg["model"]),
            train=_typed(TrainSection, cfg["train"]),
            runs=runs,
            figure=_typed(FigureConfig, cfg["figure"]),
            claims=ClaimThresholds.from_dict(cfg["claims"]),
            sweep=sweep,
            mapping=cfg,
        )

    # ---------------------------------------------------------------- one arm

    def run(self, name: str) -> RunConfig:
        """The arm (or sweep point) `name`; ConfigError naming the arms there are."""
        if name in self.runs:
            return self.runs[name]
        if name in self.points:
            return self._own(name).runs[name]
        raise self._unknown(name)

    def model_for(self, run: str) -> ModelConfig:
        """The model of one arm (or sweep point): the `model:` section with its norm and attention."""
        own = self._own(run)
        r = own.runs[run]
        return own.model.with_arm(norm=r.norm, attention=r.attention)

    def train_for(self, run: str, seed: int | None = None) -> TrainConfig:
        """The `train:` section with one arm's clip and one of its seeds (default: the first)."""
        own = self._own(run)
        r = own.runs[run]
        if seed is not None and seed not in r.seeds:
            raise ConfigError(f"{self.source}: seed {seed} is not among 'runs.{run}.seeds' {list(r.seeds)}")
        section = {f.name: getattr(own.train, f.name) for f in fields(TrainSection)}
        return TrainConfig(**section, clip=r.clip, seed=r.seeds[0] if seed is None else seed)

    def _own(self, run: str) -> "Config":
        """The configuration `run` trains under: this file's for an arm, its own for a sweep point;
        ConfigError for a name that is neither."""
        if run in self.runs:
            return self
        if run in self.points:
            return self.point(run)
        raise self._unknown(run)

    def _unknown(self, name: str) -> ConfigError:
        have = ", ".join(self.run_names[:8]) + (", ..." if len(self.run_names) > 8 else "")
        return ConfigError(f"{self.source}: no run '{name}' under 'runs' (have: {have})")

    def runs_by_role(self) -> dict[str, str]:
        """role -> run name, for the arms that reproduce one of the paper's curves."""
        return {r.role: name for name, r in self.runs.items() if r.role is not None}

    # ---------------------------------------------------------------- the whole file

    @property
    def crop_frames(self) -> int:
        """Frames in one training crop (train.crop_seconds at data.sample_rate, whole EnCodec frames)."""
        return encodec.frames(self.train.crop_seconds, self.data.sample_rate)

    @cached_property
    def points(self) -> dict:
        """A sweep's points by name (config/sweep.py's Point); empty without `sweep:`."""
        from acoustic_mlm.config import sweep

        return sweep.points(self.mapping, self.source) if self.sweep is not None else {}

    @property
    def run_names(self) -> list[str]:
        """The training runs this file asks for: a sweep's points, else the arms."""
        return list(self.points) if self.sweep is not None else list(self.runs)

    def point(self, name: str) -> "Config":
        """The configuration of one training run: a sweep point's (the file's settings with the point's
        values, `runs:` holding only it), or this file's for an arm when there is no sweep."""
        if self.sweep is None:
            self.run(name)
            return self
        from acoustic_mlm.config import sweep

        return Config.from_validated(sweep.point_config(self.mapping, name), self.source)

    def settings_dict(self) -> dict:
        """The file's settings as a plain, JSON-able dict (a copy): what a tracker records."""
        return json.loads(json.dumps(self.mapping))

    def value(self, dotted: str) -> Any:
        """The file's value at a dotted key ("train.lr", "runs.prenorm_clip1.clip"), as written."""
        return get(self.mapping, dotted)


def to_dict(dc) -> dict:
    """A dataclass as a plain, JSON-able dict (saved inside checkpoints and metadata)."""
    return json.loads(json.dumps(asdict(dc)))


def get(cfg: dict, dotted: str) -> Any:
    """The value at a dotted key ("train.lr", "runs.prenorm_clip1.clip")."""
    node: Any = cfg
    for part in dotted.split("."):
        node = node[part]
    return node
