"""The train stage: one arm of the ablation, metrics to a plain CSV, a final checkpoint.

Every arm with the same seed sees the same initial weights (where the architecture allows),
the same crops and the same masks: arms then differ only in their stability settings.
The validation set (crops and masks) is fixed and shared by all arms.

Metrics rows (`metrics.csv`) are written at steps 1, 2, 4, 8, ... and every `log_interval`
steps, and at the last step:
  step, train_loss_cb{k} (bits, mean since the previous row), train_loss (objective, mean),
  valid_loss_cb{k} (bits, fixed held-out crops and masks), lr, grad_norm (total norm before
  clipping, this step), grad_norm_max (since previous row), clipped (this step 0/1),
  clip_frac (since previous row), feature_penalty, nonfinite (cumulative count of skipped
  non-finite steps), wall_time (s since start).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import config as C
from .objective import AcousticMLM, compute_mask_indices
from .prepare import load_prepared
from .utils import Progress, atomic_path, log, set_threads, write_json

VALID_SEED = 20230601  # fixed: every arm is scored on the same crops and masks


# ----------------------------------------------------------------------------- schedule


def lr_at(step: int, t: C.TrainConfig) -> float:
    """fairseq `polynomial_decay`: linear warm-up to `lr`, then (1 - progress)^power to `end_lr`.

    `step` counts optimizer updates from 1.
    """
    if t.warmup_steps > 0 and step <= t.warmup_steps:
        return t.lr * step / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    return t.end_lr + (t.lr - t.end_lr) * (1.0 - progress) ** t.lr_power


def log_steps(steps: int, interval: int) -> list[int]:
    """Steps that get a metrics row: powers of two, multiples of `interval`, and the last."""
    out = {steps}
    p = 1
    while p <= steps:
        out.add(p)
        p *= 2
    out.update(range(interval, steps + 1, interval))
    return sorted(out)


# ----------------------------------------------------------------------------- data


@dataclass
class CropSampler:
    """Random crops aligned to EnCodec frames: (wav (B, T*320), codes (B, K, T))."""

    audio: np.ndarray  # (samples,) float32, memory-mapped
    codes: np.ndarray  # (K_all, frames) int16, memory-mapped
    starts: np.ndarray  # (clips,) first frame of each clip
    frames: np.ndarray  # (clips,) frames per clip
    crop_frames: int
    codebooks: int

    @classmethod
    def from_split(cls, audio, codes, manifest: pd.DataFrame, split: str, crop_frames: int, codebooks: int):
        m = manifest[(manifest["split"] == split) & (manifest["num_frames"] >= crop_frames)]
        if m.empty:
            raise ValueError(
                f"no {split} clip holds {crop_frames} frames ({crop_frames / 75:.2f} s): "
                "lower 'train.crop_seconds' or use longer clips"
            )
        return cls(
            audio,
            codes,
            (m["offset"].to_numpy() // C.ENCODEC_HOP).astype(np.int64),
            m["num_frames"].to_numpy().astype(np.int64),
            crop_frames,
            codebooks,
        )

    def sample(self, rng: np.random.Generator, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Clips are drawn in proportion to the crops they hold, so every frame is equally likely.
        weights = (self.frames - self.crop_frames + 1).astype(np.float64)
        clips = rng.choice(len(self.starts), size=batch, p=weights / weights.sum())
        offsets = rng.integers(0, self.frames[clips] - self.crop_frames + 1)
        return self.gather(self.starts[clips] + offsets)

    def gather(self, first_frames: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        T, hop = self.crop_frames, C.ENCODEC_HOP
        wav = np.stack([self.audio[f * hop : (f + T) * hop] for f in first_frames])  # (B, T*hop)
        codes = np.stack([self.codes[: self.codebooks, f : f + T] for f in first_frames])  # (B, K, T)
        return torch.from_numpy(wav.astype(np.float32)), torch.from_numpy(codes.astype(np.int64))

    def fixed_set(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sample(np.random.default_rng(seed), n)


# ----------------------------------------------------------------------------- device, precision


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("'train.device' is cuda but torch sees no CUDA device")
    return torch.device(name)


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


# ----------------------------------------------------------------------------- the run


def masks_for(rng: np.random.Generator, batch: int, frames: int, m: C.ModelConfig) -> torch.Tensor:
    mask = compute_mask_indices((batch, frames), m.mask_prob, m.mask_length, m.mask_min_masks, rng)
    return torch.from_numpy(mask)


@torch.no_grad()
def evaluate(model: AcousticMLM, wav, codes, mask, device, precision, chunk: int = 16) -> np.ndarray:
    """Per-codebook masked loss in bits on a fixed set, weighted by masked frames."""
    model.eval()
    total, count = None, 0
    for i in range(0, wav.shape[0], chunk):
        with autocast(device, precision):
            out = model(wav[i : i + chunk].to(device), codes[i : i + chunk].to(device), mask[i : i + chunk].to(device))
        bits = out.bits.float().cpu().numpy() * out.n_masked
        total = bits if total is None else total + bits
        count += out.n_masked
    model.train()
    return total / count


def run(cfg: dict, run_name: str, prepared_dir: Path, codes_dir: Path, out_dir: Path, threads: int | None = None) -> dict:
    """Train one arm; write metrics.csv, checkpoint.pt and summary.json into out_dir."""
    rc = C.run_config(cfg, run_name)
    m = C.model_config(cfg, run_name)
    t = C.train_config(cfg, run_name)
    set_threads(threads if threads is not None else t.threads)
    device = pick_device(t.device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    audio, manifest = load_prepared(prepared_dir)
    codes_path = Path(codes_dir) / "codes.npy"
    if not codes_path.is_file():
        raise FileNotFoundError(f"{codes_path}: codes not found; run the tokenize stage first")
    codes = np.load(codes_path, mmap_mode="r")
    if codes.shape[0] < m.codebooks:
        raise ValueError(f"{codes_path}: holds {codes.shape[0]} codebooks, 'model.codebooks' asks for {m.codebooks}")
    if int(codes.max()) >= m.codebook_size:  # cheap on a memmap of int16 at this scale
        raise ValueError(f"{codes_path}: codes exceed 'model.codebook_size' ({m.codebook_size})")

    crop_frames = int(round(t.crop_seconds * cfg["data"]["sample_rate"])) // C.ENCODEC_HOP
    train_data = CropSampler.from_split(audio, codes, manifest, "train", crop_frames, m.codebooks)
    valid_data = CropSampler.from_split(audio, codes, manifest, "valid", crop_frames, m.codebooks)
    v_wav, v_codes = valid_data.fixed_set(t.valid_crops, VALID_SEED)
    v_mask = masks_for(np.random.default_rng(VALID_SEED + 1), t.valid_crops, crop_frames, m)

    torch.manual_seed(t.seed)
    model = AcousticMLM(m).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")
    rng = np.random.default_rng(t.seed)
    max_norm = t.clip if t.clip > 0 else math.inf  # clip 0 disables clipping; the norm is still measured

    rows_at = set(log_steps(t.steps, t.log_interval))
    rows: list[dict] = []
    acc = _Accumulator(m.codebooks)
    nonfinite = 0
    t0 = time.monotonic()
    log.info(
        "train %s: %s, %d params, %d steps of %d x %d frames on %s (%s)",
        run_name, rc.label, sum(p.numel() for p in model.parameters()), t.steps, t.batch_size,
        crop_frames, device, t.precision,
    )
    partial = out_dir / "metrics.partial.csv"
    with Progress(t.steps, f"train {run_name}", unit="step") as bar:
        for step in range(1, t.steps + 1):
            lr = lr_at(step, t)
            for group in opt.param_groups:
                group["lr"] = lr
            wav, tgt = train_data.sample(rng, t.batch_size)
            mask = masks_for(rng, t.batch_size, crop_frames, m)
            with autocast(device, t.precision):
                out = model(wav.to(device), tgt.to(device), mask.to(device))
            opt.zero_grad(set_to_none=True)
            if not torch.isfinite(out.loss):
                nonfinite += 1  # skipped: no update from a non-finite loss
                grad_norm, clipped = float("nan"), False
            else:
                scaler.scale(out.loss).backward()
                scaler.unscale_(opt)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
                clipped = math.isfinite(grad_norm) and grad_norm > max_norm
                scale_before = scaler.get_scale()
                scaler.step(opt)  # skips the update itself when fp16 gradients overflowed
                scaler.update()
                if scaler.is_enabled() and scaler.get_scale() < scale_before:
                    nonfinite += 1
                acc.add(out, grad_norm, clipped)
            bar.update(1, cb0=float(out.bits[0]))
            if step in rows_at:
                v_bits = evaluate(model, v_wav, v_codes, v_mask, device, t.precision)
                row = {"step": step, **acc.flush(), "lr": lr, "grad_norm": grad_norm, "clipped": int(clipped)}
                row.update({f"valid_loss_cb{k}": float(b) for k, b in enumerate(v_bits)})
                row.update(nonfinite=nonfinite, wall_time=time.monotonic() - t0)
                rows.append(row)
                pd.DataFrame(rows).to_csv(partial, index=False)  # visible progress, never the final name

    metrics = pd.DataFrame(rows)
    with atomic_path(out_dir / "checkpoint.pt") as tmp:
        torch.save(
            {
                "model": model.state_dict(),
                "model_config": C.to_dict(m),
                "train_config": C.to_dict(t),
                "run": C.to_dict(rc),
                "step": t.steps,
            },
            tmp,
        )
    summary = summarize(metrics, rc, t)
    write_json(out_dir / "summary.json", summary)
    with atomic_path(out_dir / "metrics.csv") as tmp:
        metrics.to_csv(tmp, index=False)
    partial.unlink(missing_ok=True)
    log.info("train %s: done in %.0f s, final codebook-0 loss %.3f bits", run_name, summary["wall_time_s"], summary["final_train_loss_cb0"])
    return summary


class _Accumulator:
    """Means since the last metrics row."""

    def __init__(self, codebooks: int):
        self.k = codebooks
        self.reset()

    def reset(self):
        self.n, self.bits, self.loss, self.pen, self.clipped, self.gmax = 0, np.zeros(self.k), 0.0, 0.0, 0, 0.0

    def add(self, out, grad_norm: float, clipped: bool):
        self.n += 1
        self.bits += out.bits.float().cpu().numpy()
        self.loss += float(out.loss)
        self.pen += float(out.feature_penalty)
        self.clipped += int(clipped)
        self.gmax = max(self.gmax, grad_norm) if math.isfinite(grad_norm) else self.gmax

    def flush(self) -> dict:
        n = max(self.n, 1)
        nan = float("nan")
        row = {f"train_loss_cb{k}": (self.bits[k] / n if self.n else nan) for k in range(self.k)}
        row.update(
            train_loss=self.loss / n if self.n else nan,
            feature_penalty=self.pen / n if self.n else nan,
            grad_norm_max=self.gmax if self.n else nan,
            clip_frac=self.clipped / n if self.n else nan,
        )
        self.reset()
        return row


def summarize(metrics: pd.DataFrame, rc: C.RunConfig, t: C.TrainConfig) -> dict:
    """Scalars for `dvc metrics show`: final losses (mean of the last 3 rows), clipping, status."""
    tail = metrics.tail(3)
    steps_per_row = metrics["step"].diff().fillna(metrics["step"].iloc[0])
    finite = np.isfinite(metrics["train_loss_cb0"]).all()
    return {
        "run": rc.name,
        "label": rc.label,
        "seed": t.seed,
        "steps": int(metrics["step"].iloc[-1]),
        "status": "completed" if finite else "diverged",
        "final_train_loss_cb0": float(tail["train_loss_cb0"].mean()),
        "final_valid_loss_cb0": float(tail["valid_loss_cb0"].mean()),
        "first_train_loss_cb0": float(metrics["train_loss_cb0"].iloc[0]),
        "max_grad_norm": float(metrics["grad_norm_max"].max()),
        "clipped_frac": float((metrics["clip_frac"] * steps_per_row).sum() / steps_per_row.sum()),
        "nonfinite_steps": int(metrics["nonfinite"].iloc[-1]),
        "wall_time_s": float(metrics["wall_time"].iloc[-1]),
    }
