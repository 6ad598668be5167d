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
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Any

from acoustic_mlm import encodec
from acoustic_mlm.declare import not_a_key, setting
from acoustic_mlm.errors import ConfigError
from acoustic_mlm.model.config import ATTENTIONS, CQT_IMPLS, NORMS, ModelConfig, ModelSection

ROLES = ("clip10", "clip1", "deepnorm", "attn_relax")  # the paper's four curves, in legend order
PRECISIONS = ("fp32", "bf16", "fp16", "fp16_fairseq")  # the values train.precision takes (train/precision.py)
DEVICES = ("cpu", "cuda", "auto")  # train.device and tokenizer.device
LOGGERS = ("csv", "tensorboard", "wandb")  # train.loggers (train/trackers.py)
SEED_SPREADS = ("range", "2std")  # claims.seed_spread
DATA_SOURCES = (  # data.source (data/fetch.py's SOURCES; tests/data/test_fetch.py holds them equal)
    "synthetic",
    "tones",
    "folder",
    "url",
    "librosa",
    "fma_small",
    "fma_medium",
    "fma_large",
    "fma_full",
    "librispeech-dev-clean",
    "librispeech-dev-other",
    "librispeech-test-clean",
    "librispeech-test-other",
    "librispeech-train-clean-100",
    "librispeech-train-clean-360",
    "librispeech-train-other-500",
)
# tokenizer.mode: EnCodec calibrated offline, EnCodec's official weights, or the tone corpus's oracle (data.tones)
TOKENIZER_MODES = ("calibrated", "pretrained", "pitch")
# `sweep:` as the file holds it (a mapping of dotted keys to lists of values), not as SweepGrid types it
SWEEP_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "description": "optional: grids of training settings crossed with the arms; each point is a run "
    "(acoustic_mlm.sweep)",
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["grid"],
        "properties": {
            "grid": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "array", "minItems": 1}},
            "arms": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        },
    },
}
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
    """`data.synthetic`: the generated corpus (data.source synthetic, or tones: the tone corpus of the rounds,
    at 24000 Hz in whole EnCodec frames)."""

    n_clips: int = setting(minimum=2)
    clip_seconds: float = setting(exclusiveMinimum=0)
    sample_rate: int = setting(minimum=8000)
    seed: int = setting(minimum=0)


@dataclass(frozen=True)
class DataConfig:
    """The `data:` section: where the audio comes from and how it is split."""

    source: str = setting(enum=DATA_SOURCES)
    url: str | None = setting()
    known_hash: str | None = setting(pattern="^(sha256|sha1|md5):[0-9a-fA-F]+$")
    folder: str | None = setting()
    base_url: str | None = setting(
        doc="source librosa: the base URL its files are served from (null: https://librosa.org/data/audio/)"
    )
    shard_files: int = setting(minimum=1, doc="audio files per prepare/tokenize shard (one Snakemake job each)")
    max_extract_gb: float = setting(
        exclusiveMinimum=0,
        doc="archives (url, fma_*, librispeech-*): refuse one whose files add up to more GB (10^9 bytes)",
    )
    max_compression_ratio: float = setting(
        minimum=1, doc="archives: refuse a member (or a whole tar) that expands more than this many times"
    )
    remove_archive: bool = setting(
        doc="fma_*: remove the archive from the downloads folder once prepare has prepared every member (it reads "
        "them straight from the zip); a later fetch writes data/raw again from the record left beside it, without "
        "downloading; preparing again needs the archive (delete the record and rerun fetch)"
    )
    sample_rate: int = setting(const=encodec.SAMPLE_RATE)
    sample_format: str = setting(  # float32 | int16: the prepared audio's samples on disk
        enum=("float32", "int16"),
        doc="prepared audio on disk: float32 (4 bytes per sample) | int16 PCM (2 bytes per sample, read back as "
        "float32 = int16 / 32768)",
    )
    valid_fraction: float = setting(exclusiveMinimum=0, exclusiveMaximum=1)
    split_seed: int = setting(minimum=0)
    synthetic: SyntheticConfig = setting()


@dataclass(frozen=True)
class TokenizerConfig:
    """The `tokenizer:` section."""

    mode: str = setting(enum=TOKENIZER_MODES)  # calibrated | pretrained | pitch (the tone corpus's oracle)
    bandwidth: float = setting(enum=(1.5, 3.0, 6.0, 12.0, 24.0))
    checkpoint: str | None = setting()
    seed: int = setting(minimum=0)
    calibration_frames: int = setting(
        minimum=1024,
        doc="frames of the train split the codebooks are fitted on (a multiple of the 1024 codes per level)",
    )
    calibration_iters: int = setting(minimum=1)
    loudness: str = setting(
        enum=("kweighted", "lufs", "rms", "none"),
        doc="calibrated mode: what the tokenizer's input is normalised to (kweighted: ITU-R BS.1770 K-weighted "
        "loudness per 107 ms window; lufs: BS.1770 integrated loudness per clip; rms: RMS per 107 ms window; "
        "none); the model trains on the raw waveform",
    )
    loudness_target: float = setting(
        minimum=-70,
        maximum=0,
        doc="the loudness the tokenizer's input is brought to: LUFS (methods kweighted, lufs) or dBFS RMS (method rms)",
    )
    batch_size: int = setting(minimum=1, doc="clips per zero-padded EnCodec batch")
    threads: int = setting(
        minimum=1,
        maximum=256,
        doc="torch threads of the tokenize stage, whatever cores the engine grants: EnCodec's encoder gives "
        "other codes at another thread count",
    )
    segment_seconds: float = setting(minimum=0, doc="clips longer than this are encoded in segments (0: never)")
    context_seconds: float = setting(minimum=0, doc="left context per segment, its codes dropped")
    device: str = setting(enum=DEVICES, doc="where EnCodec encodes (calibration runs on CPU)")


@dataclass(frozen=True, kw_only=True)
class TrainSection:
    """The `train:` section, the same for every arm."""

    device: str = setting(enum=DEVICES)
    processes: int = (
        setting(  # DDP processes per node (torchrun); batch_size is the global micro-batch, split between all
            minimum=1,
        )
    )
    precision: str = setting(
        enum=PRECISIONS,
        doc="fp32 | bf16 | fp16: autocast (fp16 with torch's GradScaler) | fp16_fairseq: model.half(), fp32 master "
        "weights, fairseq's loss scaler; overflowing steps are not updates",
    )
    steps: int = setting(minimum=1)
    batch_size: int = setting(minimum=1)  # crops per micro-batch
    accum_steps: int = setting(  # micro-batches per optimizer update (effective batch = batch_size * accum_steps)
        minimum=1,
    )
    crop_seconds: float = setting(exclusiveMinimum=0)
    lr: float = setting(exclusiveMinimum=0)
    warmup_steps: int = setting(minimum=0)
    end_lr: float = setting(minimum=0)
    lr_power: float = setting(exclusiveMinimum=0)
    betas: tuple[float, float] = setting(items={"minimum": 0, "exclusiveMaximum": 1})
    eps: float = setting(exclusiveMinimum=0)
    weight_decay: float = setting(minimum=0)
    crop_unit: str = setting(  # frame: crops start on EnCodec frames; sample: at any sample (MERT random_crop)
        enum=("frame", "sample"),
    )
    mask_group: int = (
        setting(  # crops whose masks are equalised together (MERT: one GPU's micro-batch); 0: whole micro-batch
            minimum=0,
        )
    )
    log_interval: int = setting(minimum=1)
    valid_crops: int = setting(minimum=1)
    checkpoint_interval: int = setting(minimum=0)  # steps between resumable states in <run>/state/ (0: none)
    max_nonfinite: int = setting(minimum=0)  # this many non-finite steps in a row end the run as diverged (0: never)
    threads: int = setting(minimum=1)
    workers: int = setting(minimum=0)  # data-loader worker processes (0: load in the training process)
    compile: bool = setting()  # torch.compile the model
    diagnostics: bool = setting(  # stability diagnostics in every metrics row (diagnostics.py)
        doc="stability diagnostics in every metrics row (gradient norms per block, attention logit maxima, loss "
        "scale, ...); false measures their cost"
    )
    # the optional keys: a file without them gets these
    nodes: int = setting(  # machines per run, each with `processes` processes (world = nodes * processes)
        1,
        optional=True,
        minimum=1,
        doc="machines per run (default 1); each runs train.processes processes: torchrun with a c10d rendezvous, "
        "under SLURM through srun",
    )
    total_updates: int | None = setting(  # schedule length (fairseq max_update); None: steps
        None,
        optional=True,
        minimum=1,
        doc="schedule length: the polynomial decay reaches end_lr here (fairseq max_update); null (default): "
        "train.steps",
    )
    log_powers_of_two: bool = setting(  # metrics rows also at steps 1, 2, 4, 8, ...
        True,
        optional=True,
        doc="also write metrics rows at steps 1, 2, 4, 8, ... (default true); false: rows only every "
        "log_interval steps and at the last, as fairseq logs",
    )
    loggers: tuple[str, ...] = setting(  # where rows go besides the CSV (trackers.py); results do not depend on it
        ("csv",),
        optional=True,
        items={"enum": LOGGERS},
        uniqueItems=True,
        contains={"const": "csv"},
        doc="where metrics rows go (default [csv]): csv is always written; tensorboard adds event files under the "
        'seed\'s folder, wandb a Weights & Biases run (pip install -e ".[wandb]"); see trackers.py',
    )
    wandb_project: str = setting(  # Weights & Biases project of the wandb logger
        "acoustic-mlm",
        optional=True,
        minLength=1,
        doc="Weights & Biases project of the wandb logger (default acoustic-mlm); runs are named <run>-seed<S> "
        "and grouped by run",
    )

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

    x_max: float | None = setting(exclusiveMinimum=0)
    y_min: float | None = setting()
    y_max: float | None = setting()
    split: str = setting(enum=("train", "valid"))  # train | valid
    overlay_paper: bool = setting()


@dataclass(frozen=True)
class SweepGrid:
    """One entry of the optional `sweep:` section: a grid of settings crossed with some arms."""

    grid: tuple[tuple[str, tuple], ...]  # (dotted key or "seeds", values) in the file's order
    arms: tuple[str, ...] | None  # None: every arm


@dataclass(frozen=True)
class RunConfig:
    """One arm of the ablation."""

    name: str = not_a_key()  # the arm's key under runs:
    label: str = setting(minLength=1)
    norm: str = setting(  # pre | post | deepnorm
        enum=NORMS,
        doc="pre: x + F(LN(x)); post: LN(x + F(x)); deepnorm: LN(alpha x + F(x)) with beta-scaled init",
    )
    attention: str = setting(  # softmax | pb_relax | unfused | qk_norm
        enum=ATTENTIONS,
        doc="softmax: fused scaled-dot-product attention; pb_relax: CogView's PB-Relax with model.relax_alpha; "
        "unfused: fairseq's order (q.k in the model's dtype, softmax in float32); qk_norm: queries and keys "
        "layer-normalised per head, then the fused kernel (Dehghani et al. 2023)",
    )
    clip: float = setting(minimum=0)
    seeds: tuple[int, ...] = setting(  # one training run per seed; the figure shows their mean and 95% interval
        minItems=1, uniqueItems=True, items={"minimum": 0}
    )
    role: str | None = setting(  # which of the paper's curves it reproduces (ROLES), None for an extra arm
        None,
        optional=True,
        enum=(*ROLES, None),
        doc="which curve of the paper's figure this arm reproduces: the claims and the figure's colours find arms "
        "by it; omit (or null) for an extra arm",
    )


@dataclass(frozen=True)
class ClaimThresholds:
    """Every number the verdicts depend on (the config's `claims:` section, same names)."""

    start_min: float = setting(9.0)  # (a) lowest first loss, in bits, that counts as "near 10 bits"
    start_max: float = setting(10.6)  # (a) highest; uniform guessing is 10 bits, the paper starts at 9.3-9.5
    converge_margin: float = setting(  # (c, e, f) converged = stays within this many bits of its final loss
        0.1,
        minimum=0,
    )
    spike_threshold: float = setting(  # (d) a spike rises more than this many bits above the running minimum
        0.5,
        minimum=0,
    )
    recovery_margin: float = setting(0.2, minimum=0)  # (d) recovered = back within this many bits of that minimum
    stabilise_fraction: float = setting(  # (f) converged step / last step must not exceed this
        0.4,
        exclusiveMinimum=0,
        maximum=1,
    )
    min_final_gap: float = setting(  # (b) final losses closer than this many bits are a tie: inconclusive
        0.02,
        minimum=0,
    )
    seed_spread: str = setting(  # with several seeds: "range" (max - min) or "2std" (two sample std)
        "range",
        enum=SEED_SPREADS,
    )

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
        if self.seed_spread not in SEED_SPREADS:
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

    source: str = not_a_key()  # the file (or "config"), named by every error about it
    cpu_kernels: str = setting(  # avx2 | native (acoustic_mlm.kernels)
        enum=("avx2", "native"),
        doc="avx2: torch's, MKL's, oneDNN's and numpy's CPU kernels pinned to AVX2 in every stage's process, so "
        "that any x86-64 CPU with AVX2 computes the same bits; native: the fastest kernels of this CPU (numbers "
        "differ between CPUs)",
    )
    data: DataConfig = setting()
    tokenizer: TokenizerConfig = setting()
    model: ModelSection = setting()
    train: TrainSection = setting()
    runs: dict[str, RunConfig] = setting(  # the arms, in the file's order
        minProperties=1, propertyNames={"pattern": "^[a-z0-9][a-z0-9_-]*$"}
    )
    figure: FigureConfig = setting()
    claims: ClaimThresholds = setting()
    sweep: tuple[SweepGrid, ...] | None = setting(optional=True, replace=SWEEP_SCHEMA)
    mapping: dict = not_a_key(repr=False, compare=False)  # the validated file, read only inside config/

    @classmethod
    def _from_checked(cls, cfg: dict, source: str = "config") -> "Config":
        """A mapping that passed `validate`, typed. Private: its three callers come right after a check,
        config.load and config.from_mapping after `validate`, `point` after the sweep's points were
        validated with the file (checks._check_sweep); anything else goes through from_mapping."""
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

        return Config._from_checked(sweep.point_config(self.mapping, name), self.source)

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
