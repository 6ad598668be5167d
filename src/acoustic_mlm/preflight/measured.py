"""The GPU measurements preflight projects from: model FLOPs utilisation (MFU) measured on a GPU, per preset
shape and precision, each with its source. The one place these numbers live in the package;
`tests/preflight/test_measured.py` holds them equal to BENCHMARKS.md.

A record applies to a configuration whose first arm's model has the measured layers, width and FFN width,
whose micro-batch per process and crop (frames) are the measured ones, at a measured precision: the same
counted FLOPs per micro-batch (`flops.step_flops`). Where one applies, preflight projects at its MFU on the
GPU it was measured on; elsewhere at an assumed utilisation, with these measurements beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from acoustic_mlm import config as C

# torch 2.11.0+cu130, the code before the FFT CQT and the matmul front end
H200_B88A247 = "BENCHMARKS.md#on-a-gpu-one-h200-run-at-b88a247"


@dataclass(frozen=True)
class MeasuredMfu:
    """One GPU measurement: the MFU range of a preset's micro-batch on one GPU."""

    preset: str  # the preset measured (config/<preset>.yaml)
    gpu: str  # the GPU measured on, matched as a substring of a projection row's name
    precisions: tuple[str, ...]  # train.precision values measured
    layers: int  # the measured model: blocks, width, FFN width
    dim: int
    ffn_dim: int
    micro_batch: int  # crops per micro-batch and process
    frames: int  # frames per crop
    mfu_low: float  # measured MFU range (share of the dense fp16/bf16 peak)
    mfu_high: float
    commit: str
    source: str

    @property
    def mfu(self) -> float:
        """The middle of the measured range: what a projection uses."""
        return (self.mfu_low + self.mfu_high) / 2

    def text(self) -> str:
        """'gpu-small 5.0-5.2 %' or 'paper 12.4 %'."""
        lo, hi = 100 * self.mfu_low, 100 * self.mfu_high
        span = f"{lo:.1f}" if abs(hi - lo) < 0.05 else f"{lo:.1f}-{hi:.1f}"
        return f"{self.preset} {span} %"


MEASURED_MFU: tuple[MeasuredMfu, ...] = (
    # 102-106 ms per micro-batch of 16 x 5 s; the same run's preflight: fp16_fairseq 6,563 ms per update of 64
    # micro-batches, fp16 6,802, bf16 6,855 (5.0-5.2 % of 989 TFLOP/s at the counted 5.29 TFLOP per micro-batch)
    MeasuredMfu(
        "gpu-small",
        "H200",
        ("fp16_fairseq", "fp16", "bf16"),
        12,
        768,
        3072,
        16,
        375,
        0.050,
        0.052,
        "b88a247",
        H200_B88A247,
    ),  # fmt: skip
    # 46 ms per micro-batch of 7 x 5.12 s (one process's share of paper's 3,584 crops), fp16_fairseq
    MeasuredMfu(
        "paper", "H200", ("fp16_fairseq",), 24, 1024, 4096, 7, 384, 0.124, 0.124, "b88a247", H200_B88A247
    ),  # fmt: skip
)


def for_config(cfg: C.Config, precision: str) -> MeasuredMfu | None:
    """The measurement of this configuration's shape at `precision`, or None when there is none."""
    m, t = cfg.model_for(next(iter(cfg.runs))), cfg.train
    micro = t.batch_size // t.world
    for rec in MEASURED_MFU:
        shape = (rec.layers, rec.dim, rec.ffn_dim, rec.micro_batch, rec.frames)
        if precision in rec.precisions and shape == (m.layers, m.dim, m.ffn_dim, micro, cfg.crop_frames):
            return rec
    return None


def on_gpu(rec: MeasuredMfu | None, gpu: str) -> MeasuredMfu | None:
    """The measurement if it was taken on this projection row's GPU (its name names the measured GPU)."""
    return rec if rec is not None and rec.gpu in gpu else None


def beside() -> str:
    """Every measurement in one phrase, to stand beside an assumed utilisation: 'measured on an H200 at
    b88a247: gpu-small 5.0-5.2 %, paper 12.4 %'."""
    by_run: dict[tuple[str, str], list[str]] = {}
    for rec in MEASURED_MFU:
        by_run.setdefault((rec.gpu, rec.commit), []).append(rec.text())
    return "; ".join(f"measured on an {gpu} at {commit}: {', '.join(t)}" for (gpu, commit), t in by_run.items())


def lowest() -> MeasuredMfu:
    """The lowest measured MFU: the pessimistic end for a shape that has no measurement."""
    return min(MEASURED_MFU, key=lambda r: r.mfu_low)
