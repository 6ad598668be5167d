"""The train stage: one arm of the ablation, metrics to a plain CSV, a final checkpoint.

Every arm with the same seed sees the same initial weights (where the architecture allows),
the same crops and the same masks: arms then differ only in their stability settings.
The validation set (crops and masks) is fixed and shared by all arms.

Metrics rows (`metrics.csv`) are written every `log_interval` steps, at the last step, and (unless
`train.log_powers_of_two` is false) at steps 1, 2, 4, 8, ...; the training means of a row cover the
updates since the previous row, which makes them fairseq's interval means when only multiples of
`log_interval` get rows:
  step, train_loss_cb{k} (bits, mean since the previous row), train_loss (objective, mean),
  valid_loss_cb{k} (bits, fixed held-out crops and masks), lr, grad_norm (total norm before
  clipping, this step), grad_norm_max (since previous row), clipped (this step 0/1),
  clip_frac (since previous row), clipped_steps (cumulative clipped updates), feature_penalty,
  nonfinite (cumulative count of skipped non-finite steps), diverged (1 on the row where train.max_nonfinite non-finite steps in a row
  stopped the run), overflow_skips (cumulative fp16 steps skipped by the loss scaler),
  loss_scale (fp16 loss scale now; NaN without one), wall_time (s since start).
With `train.precision: fp16_fairseq` a step is an update: steps whose gradients overflowed are
not counted (see precision.py).
With train.diagnostics, each row also holds the stability diagnostics of `diagnostics.py`
(per-block gradient norms and update ratios, attention logit maxima, masked share, codebook-0
accuracy), measured at the row steps only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm import curves
from acoustic_mlm.train import diagnostics
from acoustic_mlm import readers
from acoustic_mlm.devices import pick_device
from acoustic_mlm.errors import UserError
from acoustic_mlm.train.augment import apply_mixture, draw_mixture
from acoustic_mlm.model.objective import AcousticMLM, compute_group_masks, mask_groups
from acoustic_mlm.train.precision import FP16Optimizer, LossScaler, MinLossScaleError, half_model, scale_window
from acoustic_mlm.data.corpus import load_prepared, shard_name
from acoustic_mlm.tokenizer.stage import shard_codes
from acoustic_mlm.train.trackers import Trackers
from acoustic_mlm.utils import Progress, atomic_path, file_sha256, log, set_threads, write_json

VALID_SEED = 20230601  # fixed: every arm is scored on the same crops and masks


# ----------------------------------------------------------------------------- schedule


def lr_at(step: int, t: C.TrainConfig) -> float:
    """fairseq `polynomial_decay` (fairseq/optim/lr_scheduler/polynomial_decay_schedule.py): linear
    warm-up to `lr` over warmup_steps, then (1 - progress)^power down to `end_lr` at
    train.total_updates (fairseq `total_num_update` = `max_update`; default train.steps).

    `step` counts optimizer updates from 1 (fairseq sets the lr of update n+1 from n updates done:
    one update later than here).
    """
    if t.warmup_steps > 0 and step <= t.warmup_steps:
        return t.lr * step / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, t.schedule_updates - t.warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    return t.end_lr + (t.lr - t.end_lr) * (1.0 - progress) ** t.lr_power


def log_steps(steps: int, interval: int, powers_of_two: bool = True) -> list[int]:
    """Steps that get a metrics row: multiples of `interval`, the last, and (powers_of_two) 1, 2, 4, ...

    Without powers of two every row but possibly the last covers exactly `interval` updates, as
    fairseq's `train_inner` rows (fairseq_cli/train.py: a row when num_updates % log_interval == 0).
    """
    out = {steps}
    p = 1
    while powers_of_two and p <= steps:
        out.add(p)
        p *= 2
    out.update(range(interval, steps + 1, interval))
    return sorted(out)


# ----------------------------------------------------------------------------- data


class CropData(torch.utils.data.Dataset):
    """Training batches indexed by micro-batch number: item i is (wav, codes, mask) for micro-batch i,
    plus the clean crops (wav before noise mixing) as a fourth item when model.mixture_prob > 0.

    Item i depends only on (seed, i), never on which worker made it or what came before, so a
    run is identical with any number of loader workers and can restart at any step. Audio and
    codes are memory-mapped lazily in each worker (a memmap must not be pickled to workers).
    wav (B, T*320), codes (B, K, T), mask (B, T). crop_unit "frame": crops start on EnCodec
    frame boundaries; "sample": at any sample, as MERT's random_crop, with the codes starting at
    the rounded frame (label_offset). Masks are equalised per group of mask_group crops
    (objective.compute_group_masks) and noise is mixed within those groups (augment.py).
    """

    def __init__(self, corpus, codes_dir: Path, split: str, crop_frames: int, batch: int,
                 m: C.ModelConfig, seed: int, rank: int = 0, world: int = 1,
                 crop_unit: str = "frame", mask_group: int = 0, mixture: bool = False):
        manifest = corpus.manifest
        rows = manifest[(manifest["split"] == split) & (manifest["num_frames"] >= crop_frames)]
        if rows.empty:
            raise UserError(
                f"no {split} clip holds {crop_frames} frames ({crop_frames / encodec.FRAME_RATE:.2f} s): "
                "lower 'train.crop_seconds' or use longer clips"
            )
        self.corpus, self.codes_dir = corpus, Path(codes_dir)
        self.shard = rows["shard"].to_numpy().astype(np.int64)  # shard per clip
        self.offsets = rows["offset"].to_numpy().astype(np.int64)  # first sample in its shard
        self.starts = (self.offsets // encodec.HOP).astype(np.int64)  # first frame in its shard
        self.frames = rows["num_frames"].to_numpy().astype(np.int64)
        # Clips are drawn in proportion to the crops they hold, so every frame is equally likely.
        weights = (self.frames - crop_frames + 1).astype(np.float64)
        self.p = weights / weights.sum()
        self.crop_frames, self.batch, self.m, self.seed = crop_frames, batch, m, seed
        self.rank, self.world = rank, world  # DDP: each process keeps rows rank, rank+world, ... of a batch
        self.crop_unit, self.mask_group = crop_unit, mask_group
        self.mixture = mixture and m.mixture_prob > 0  # noise mixing: training crops only
        self._codes: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return 2**62  # indexed by micro-batch number; the sampler decides how many

    def __getstate__(self):  # memory maps are reopened in each worker, never pickled
        return {**self.__dict__, "_codes": {}}

    def __getitem__(self, i: int):
        rng = np.random.default_rng([self.seed, int(i)])
        clips = rng.choice(len(self.starts), size=self.batch, p=self.p)
        T, hop = self.crop_frames, encodec.HOP
        if self.crop_unit == "sample":  # any sample whose rounded frame leaves T codes
            offset = rng.integers(0, (self.frames[clips] - T) * hop + 1)  # samples into the clip
            samples = self.offsets[clips] + offset
            first = self.starts[clips] + np.array([label_offset(int(o)) for o in offset], dtype=np.int64)
        else:
            first = self.starts[clips] + rng.integers(0, self.frames[clips] - T + 1)
            samples = first * hop
        m = self.m
        mask = compute_group_masks(self.batch, T, m.mask_prob, m.mask_length, m.mask_min_masks, rng, self.mask_group)
        rows = slice(self.rank, None, self.world)  # the global batch is drawn whole, then split
        wav, codes = self.gather(self.shard[clips][rows], samples[rows], first[rows])
        if not self.mixture:
            return wav, codes, torch.from_numpy(mask[rows])
        groups = mask_groups(self.batch, self.mask_group)
        plan = draw_mixture(rng, groups, T * hop, m.mixture_prob, m.mixture_segments, m.mixture_samples)
        mixed = apply_mixture(wav.numpy(), np.arange(self.batch)[rows], groups, plan, m.mixture_volume)
        return torch.from_numpy(mixed), codes, torch.from_numpy(mask[rows]), wav

    def codes(self, shard: int) -> np.ndarray:
        if shard not in self._codes:
            self._codes[shard] = shard_codes(self.codes_dir, shard)
        return self._codes[shard]

    def gather(self, shards: np.ndarray, first_samples: np.ndarray,
               first_frames: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        T, hop, K = self.crop_frames, encodec.HOP, self.m.codebooks
        wav = np.stack([self.corpus.audio(s)[a : a + T * hop] for s, a in zip(shards, first_samples)])
        codes = np.stack([self.codes(s)[:K, f : f + T] for s, f in zip(shards, first_frames)])  # (B, K, T)
        return torch.from_numpy(wav.astype(np.float32)), torch.from_numpy(codes.astype(np.int64))


def label_offset(sample: int, sample_rate: int = encodec.SAMPLE_RATE, label_rate: float = encodec.FRAME_RATE) -> int:
    """The first code frame of a crop starting at `sample`: int(round(sample * label_rate / sample_rate)),
    as MERT's collater_frm_label (mert_fairseq/data/mert_dataset.py; Python's round: halves to even)."""
    return int(round(sample * (label_rate / sample_rate)))


def batches(data: CropData, first: int, last: int, workers: int, pin: bool):
    """Micro-batches first..last-1 in order, made by `workers` processes (0: in this process)."""
    return torch.utils.data.DataLoader(
        data,
        batch_size=None,  # items are whole batches
        sampler=range(first, last),
        num_workers=workers,
        pin_memory=pin,
        prefetch_factor=4 if workers else None,
        persistent_workers=False,
    )


# ----------------------------------------------------------------------------- device, precision


def autocast(device: torch.device, precision: str):
    """Autocast for bf16 and fp16; fp32 and fp16_fairseq (a half model, precision.py) run as they are."""
    if precision in ("fp32", "fp16_fairseq"):
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


# ----------------------------------------------------------------------------- the run


@torch.no_grad()
def evaluate(model, wav, codes, mask, device, precision, chunk: int = 16) -> np.ndarray:
    """Per-codebook masked loss in bits on a fixed set, weighted by masked frames."""
    model.eval()
    total, count = None, 0
    for i in range(0, wav.shape[0], chunk):
        with autocast(device, precision):
            out = model(wav[i : i + chunk].to(device), codes[i : i + chunk].to(device), mask[i : i + chunk].to(device))
        n = float(out.n_masked)
        bits = out.bits.float().cpu().numpy() * n
        total = bits if total is None else total + bits
        count += n
    model.train()
    return total / count


def optimizer_step(model: torch.nn.Module, opt, scaler, clip: float) -> tuple[float, bool, bool]:
    """Clip the total gradient norm to `clip` (0: no clipping) and step; gradients must be in place.

    Returns (norm before clipping, whether clipping changed the gradients, whether the fp16 loss
    scaler skipped the update because gradients overflowed).
    """
    max_norm = clip if clip > 0 else math.inf  # the norm is measured even when clipping is off
    scaler.unscale_(opt)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    clipped = math.isfinite(grad_norm) and grad_norm > max_norm
    scale_before = scaler.get_scale() if scaler.is_enabled() else 1.0
    scaler.step(opt)  # skips the update itself when fp16 gradients overflowed
    scaler.update()
    skipped = scaler.is_enabled() and scaler.get_scale() < scale_before
    return grad_norm, clipped, skipped


# ----------------------------------------------------------------------------- the training step
#
# One builder and one update, used by `amlm train`, `amlm preflight` and
# benchmarks/train_throughput.py: what they time is what trains.


@dataclass
class Trainer:
    """What an update needs: built by `build_trainer`, stepped by `update`."""

    model: torch.nn.Module  # the parameters (saved, evaluated); half under fp16_fairseq
    step_model: torch.nn.Module  # what a micro-batch calls: the model, wrapped in DDP and/or compiled
    ddp: torch.nn.parallel.DistributedDataParallel | None  # the DDP wrapper (no_sync), None on one process
    opt: torch.optim.Optimizer  # AdamW over the parameters, or over fp16's fp32 master weights
    scaler: torch.amp.GradScaler  # precision fp16's loss scaler (disabled otherwise)
    fp16: FP16Optimizer | None  # precision fp16_fairseq: fp32 master weights and fairseq's loss scaler
    device: torch.device
    precision: str
    clip: float  # max total gradient norm; 0: no clipping
    world: int = 1  # DDP processes

    @property
    def loss_scale(self) -> float:
        """The fp16 loss scale now (NaN without one), as fairseq logs `loss_scale`."""
        if self.fp16 is not None:
            return self.fp16.loss_scale
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else float("nan")

    def grad_bytes(self) -> int:
        """Bytes of the gradients one update all-reduces (those of the parameters DDP syncs)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)


def build_trainer(m: C.ModelConfig, t: C.TrainConfig, device: torch.device, rank: int = 0, world: int = 1,
                  model: torch.nn.Module | None = None) -> Trainer:
    """The model (seeded with t.seed; or `model`, built already), half with fp32 master weights under
    fp16_fairseq, wrapped in DDP on several processes and compiled with t.compile, and its optimizer
    and loss scaler, for t.precision and t.clip."""
    if model is None:
        torch.manual_seed(t.seed)
        model = AcousticMLM(m)
    model = model.to(device)
    if t.precision == "fp16_fairseq":
        half_model(model)  # as fairseq's trainer under common.fp16 (precision.py)
    step_model, ddp = model, None
    if world > 1:  # gradients are averaged over processes: with equal rows each, the global-batch mean
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        step_model = ddp
        torch.manual_seed(t.seed + 1_000_003 * rank)  # distinct dropout streams per process
    step_model = torch.compile(step_model) if t.compile else step_model  # same parameters, compiled forward

    def adamw(params):
        return torch.optim.AdamW(params, lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay)

    fp16 = None
    if t.precision == "fp16_fairseq":  # the scale window from the processes and micro-batches per update
        fp16 = FP16Optimizer(model.named_parameters(), adamw, LossScaler(scale_window(world, t.accum_steps)))
    opt = fp16.optimizer if fp16 else adamw(model.parameters())
    scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")
    return Trainer(model, step_model, ddp, opt, scaler, fp16, device, t.precision, t.clip, world)


class Update(NamedTuple):
    outs: list  # each micro-batch's MLMOutput
    means: torch.Tensor  # (K + 2,) on the device: bits per codebook, loss, feature penalty; mean over micro-batches and processes
    finite: bool  # every micro-batch's loss was finite in every process
    grad_norm: float  # total norm before clipping (NaN when no step was tried)
    clipped: bool
    overflow: bool  # the loss scaler skipped the step (precision fp16 or fp16_fairseq; under fp16_fairseq a non-finite loss too)
    probe: object = None  # diagnostics.UpdateProbe taken before the step, when asked for and a step was tried


def update(tr: Trainer, micro_batches, lr: float, probe: bool = False, on_phase=None) -> Update:
    """One update: the learning rate `lr`; forward and backward of each micro-batch of
    `micro_batches` (an iterable of (wav, codes, mask[, clean wav]) on the device, drained whole);
    then, unless a loss was not finite, clip and step.

    Gradients are all-reduced once per update, as fairseq: every backward but the last runs under
    DDP's `no_sync()`. The non-finite check costs one synchronisation per update: each micro-batch
    adds its verdict on the device, and one all-reduce of K + 4 scalars (non-finite micro-batches,
    masked frames, the metrics' means) follows the last backward. So, per update and process: one
    all-reduce of the gradients, one of those scalars, and (train.diagnostics, at metrics rows only)
    the probe's reads. A non-finite micro-batch does not stop the others being run (their
    gradients are dropped with the update): every process runs every backward, as DDP needs.

    fp16_fairseq: the backward runs on the loss summed over masked frames and the step multiplies by
    processes / masked frames of all processes (fairseq/trainer.py, see precision.py); a non-finite
    loss is an overflow (the scale halves); MinLossScaleError passes to the caller.
    `on_phase(name)`, if given, is called at "start", after each "micro" batch's backward and after
    the "step" (preflight times the phases); `probe` takes diagnostics.UpdateProbe before the step.
    """
    for group in tr.opt.param_groups:
        group["lr"] = lr
    tr.opt.zero_grad(set_to_none=True)
    if tr.fp16 is not None:
        tr.fp16.zero_grad()
    batches = list(micro_batches)
    n = len(batches)
    outs, bad, sample_size = [], None, None
    if on_phase is not None:
        on_phase("start")
    for i, batch in enumerate(batches):
        sync = tr.ddp is None or i == n - 1  # the gradients are all-reduced on the last backward only
        with contextlib.nullcontext() if sync else tr.ddp.no_sync():
            with autocast(tr.device, tr.precision):
                out = tr.step_model(*batch)
            outs.append(out)
            nonfinite = (~torch.isfinite(out.loss.detach())).float().reshape(1)
            bad = nonfinite if bad is None else bad + nonfinite
            if tr.fp16 is not None:  # fairseq's criterion sums over masked frames; the step divides by their count
                tr.fp16.scale(out.loss * out.n_masked).backward()
                sample_size = out.n_masked if sample_size is None else sample_size + out.n_masked
            else:
                tr.scaler.scale(out.loss / n).backward()
        if on_phase is not None:
            on_phase("micro")
    means = torch.stack([torch.cat([o.bits.float(), o.loss.detach().float().reshape(1),
                                    o.feature_penalty.float().reshape(1)]) for o in outs]).mean(0)
    masked = (sample_size if sample_size is not None else torch.zeros((), device=bad.device)).float().reshape(1)
    stats = torch.cat([bad, masked, means])  # one collective and one host read per update
    if tr.world > 1:
        dist.all_reduce(stats)
    bad_all, total = stats[:2].tolist()
    means = stats[2:] / tr.world if tr.world > 1 else stats[2:]
    finite = bad_all == 0
    nan = float("nan")
    taken_probe = None
    if tr.fp16 is not None:
        if finite:
            if probe:
                masters = diagnostics.param_blocks(zip(tr.fp16.names, tr.fp16.master))
                taken_probe = diagnostics.UpdateProbe(tr.model, scale=tr.fp16.loss_scale * total / tr.world,
                                                      weights=masters)
            grad_norm, clipped, overflow = tr.fp16.step(tr.clip, multiplier=tr.world / total)
        else:
            tr.fp16.zero_grad()
            grad_norm, clipped, overflow = nan, False, True
            tr.fp16.scaler.overflow()  # may raise MinLossScaleError
    elif finite:
        taken_probe = diagnostics.UpdateProbe(tr.model, tr.scaler) if probe else None  # before clipping
        grad_norm, clipped, overflow = optimizer_step(tr.model, tr.opt, tr.scaler, tr.clip)
    else:
        grad_norm, clipped, overflow = nan, False, False  # skipped: no update from a non-finite loss
    if on_phase is not None:
        on_phase("step")
    return Update(outs, means, finite, grad_norm, clipped, overflow, taken_probe)


def check_codes(codes_dir: Path, corpus, m: C.ModelConfig) -> None:
    """The codes suit the model and cover every shard of the corpus (headers only: no scan of the codes)."""
    summary = Path(codes_dir) / "tokenizer.json"
    meta = readers.read_tokenizer_summary(summary)
    if meta.get("n_codebooks", 0) < m.codebooks:
        raise UserError(f"{summary}: {meta.get('n_codebooks')} codebooks, 'model.codebooks' asks for {m.codebooks}")
    if max(meta["max_code"][: m.codebooks]) >= m.codebook_size:
        raise UserError(f"{summary}: codes up to {max(meta['max_code'][: m.codebooks])} exceed "
                         f"'model.codebook_size' ({m.codebook_size})")
    for k in corpus.shards:  # every code in range: an edited or damaged shard is refused, not trained on
        readers.read_codes(Path(codes_dir) / shard_name(k) / "codes.npy", len(corpus.audio(k)) // encodec.HOP,
                           m.codebooks, m.codebook_size)


# ----------------------------------------------------------------------------- resumable state

STATE_DIR = "state"  # <run>/state/seed<S>/: not a pipeline output, so no engine deletes it
KEEP_STATES = 2  # the latest and the one before it, in case the latest is damaged


def save_state(state_dir: Path, step: int, state: dict) -> None:
    """Write the resumable state atomically with its sha256 beside it (step-N.pt.sha256, in place
    before the state appears), then drop all but the newest KEEP_STATES."""
    path = Path(state_dir) / f"step-{step:09d}.pt"
    tensors, stack = [], [state]
    while stack:  # the bytes its tensors hold: what a full disk or a size limit is told it needs
        node = stack.pop()
        if isinstance(node, torch.Tensor):
            tensors.append(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    with atomic_path(path, needed=sum(t.numel() * t.element_size() for t in tensors)) as tmp:
        torch.save(state, tmp)
        with atomic_path(path.with_name(path.name + ".sha256")) as side:
            side.write_text(f"{file_sha256(tmp)}  {path.name}\n")  # sha256sum's format: `sha256sum -c` checks it
    for old in sorted(path.parent.glob("step-*.pt"))[:-KEEP_STATES]:
        old.unlink()
        old.with_name(old.name + ".sha256").unlink(missing_ok=True)


def load_latest_state(state_dir: Path, fingerprint: dict) -> dict | None:
    """The newest intact state in state_dir, or None. A state whose content does not match the
    sha256 written beside it (a bad copy, a flipped bit), that has none, or that cannot be read is
    skipped with a warning and the previous one is used."""
    for path in sorted(Path(state_dir).glob("step-*.pt"), reverse=True):
        side = path.with_name(path.name + ".sha256")
        try:
            expected, actual = side.read_text().split()[0], file_sha256(path)
        except (OSError, IndexError) as exc:
            log.warning("resume: %s has no readable checksum (%s); trying the previous state", path,
                        str(exc).splitlines()[0] if str(exc) else "empty")
            continue
        if actual != expected:
            log.warning("resume: %s does not match its checksum %s (damaged); trying the previous state", path, side.name)
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file means: try the previous one
            log.warning("resume: %s is unreadable (%s); trying the previous state", path, str(exc).splitlines()[0])
            continue
        if state.get("fingerprint") != fingerprint:
            raise UserError(
                f"{path}: resumable state of a run with other settings; delete {path.parent} to start afresh"
            )
        return state
    return None


def _rng_state(device: torch.device) -> dict:
    st = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def _set_rng_state(st: dict, device: torch.device) -> None:
    torch.set_rng_state(st["cpu"])
    if device.type == "cuda" and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


# ----------------------------------------------------------------------------- several processes (DDP)


def world_info() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) for a plain process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def init_distributed(device_name: str) -> tuple[int, int]:
    rank, world = world_info()
    if world > 1 and not dist.is_initialized():
        cuda = device_name in ("cuda", "auto") and torch.cuda.is_available()
        dist.init_process_group("nccl" if cuda else "gloo")
    return rank, world


def run(cfg: dict, run_name: str, prepared_dir: Path, codes_dir: Path, out_dir: Path, threads: int | None = None) -> dict:
    """Train one arm, once per seed; write the arm's metrics.csv (a `seed` column) and summary.json.

    Each seed's own metrics, summary and final checkpoint land in out_dir/seeds/seed<S>/, its
    resumable state in out_dir/state/seed<S>/. A seed already completed with the same settings
    is not trained again.
    """
    rc = C.run_config(cfg, run_name)
    out_dir = Path(out_dir)
    rank, world = init_distributed(cfg["train"]["device"])
    planned = cfg["train"]["processes"] * cfg["train"].get("nodes", 1)
    if world != planned and rank == 0:  # the same global batch either way; only memory and speed differ
        log.warning("train %s: %d processes, where train.nodes x train.processes is %d (launch it with the "
                    "workflow or torchrun); the global batch is the same", run_name, world, planned)
    if cfg["train"]["batch_size"] % world:
        raise UserError(f"'train.batch_size' ({cfg['train']['batch_size']}) must be divisible by the {world} processes")
    summaries = [train_seed(cfg, run_name, seed, prepared_dir, codes_dir, out_dir / "seeds" / f"seed{seed}",
                            out_dir / STATE_DIR / f"seed{seed}", threads, rank=rank, world=world)
                 for seed in rc.seeds]
    if rank != 0:  # only the first process writes
        return summaries[0]
    shutil.rmtree(out_dir / STATE_DIR, ignore_errors=True)  # every seed is complete: nothing to resume
    frames = [readers.read_metrics(out_dir / "seeds" / f"seed{seed}" / "metrics.csv").assign(seed=seed)
              for seed in rc.seeds]
    metrics = pd.concat(frames, ignore_index=True)
    metrics = metrics[["seed"] + [c for c in metrics.columns if c != "seed"]]
    finals = [s["final_train_loss_cb0"] for s in summaries]
    summary = {
        "run": rc.name, "label": rc.label, "seeds": list(rc.seeds),
        "status": run_status([s["status"] for s in summaries]),
        "nonfinite_steps": int(sum(s["nonfinite_steps"] for s in summaries)),
        "final_train_loss_cb0": float(np.mean(finals)),
        "final_valid_loss_cb0": float(np.mean([s["final_valid_loss_cb0"] for s in summaries])),
        "final_train_loss_cb0_spread": float(np.max(finals) - np.min(finals)),
        "per_seed": {str(s["seed"]): {k: v for k, v in s.items() if k != "fingerprint"} for s in summaries},
    }
    write_json(out_dir / "summary.json", summary)
    with atomic_path(out_dir / "metrics.csv") as tmp:
        metrics.to_csv(tmp, index=False)
    return summary


def fingerprint(cfg: dict, run_name: str, world: int) -> dict:
    """Everything that shapes one arm's numbers: the settings the train stage and every stage before
    it depend on (config.result_keys), and the process count. A resumable state or a completed
    seed (its folder names the seed) made under another fingerprint is not reused."""
    keys = C.result_keys("train", cfg, run_name, upstream=True)
    keys.remove(f"runs.{run_name}.seeds")  # one seed's numbers do not depend on which other seeds the arm has
    return json.loads(json.dumps({"settings": C.settings(cfg, keys), "processes": world}))


# ----------------------------------------------------------------------------- one seed, in named steps
#
#   train_seed = build -> restore -> (train_step -> record -> checkpoint)* -> finish


@dataclass
class Setup:
    """What stays fixed during one seed's run: settings, model, optimizer, data."""

    run_name: str
    seed: int
    rc: C.RunConfig
    m: C.ModelConfig
    t: C.TrainConfig
    device: torch.device
    rank: int
    world: int
    fingerprint: dict
    tr: Trainer  # model, optimizer, loss scaler: what `update` steps
    train_data: CropData
    valid: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # fixed held-out (wav, codes, mask)
    rows_at: set[int]  # steps that get a metrics row
    out_dir: Path
    state_dir: Path

    @property
    def writer(self) -> bool:  # with several processes only the first writes files
        return self.rank == 0

    @property
    def model(self) -> torch.nn.Module:  # the parameters (saved, evaluated)
        return self.tr.model

    @property
    def opt(self) -> torch.optim.Optimizer:
        return self.tr.opt

    @property
    def scaler(self) -> torch.amp.GradScaler:
        return self.tr.scaler

    @property
    def fp16(self) -> FP16Optimizer | None:  # precision fp16_fairseq: fp32 master weights; opt steps them
        return self.tr.fp16


@dataclass
class Loop:
    """What changes as the seed trains; all of it is in the resumable state."""

    acc: "_Accumulator"
    step: int = 0  # the last completed step (fp16_fairseq: the last update; overflowing steps are not counted)
    batches: int = 0  # micro-batches drawn so far (each step draws accum_steps, counted or not)
    rows: list = field(default_factory=list)
    nonfinite: int = 0  # updates skipped for a non-finite loss
    streak: int = 0  # ... in a row
    overflow: int = 0  # fp16 updates skipped by the loss scaler
    clipped: int = 0  # updates whose gradient norm was clipped
    elapsed: float = 0.0  # seconds of training before this process started
    diverged_at: int | None = None
    stop_reason: str | None = None  # why the seed stopped early: nonfinite | min_loss_scale

    def state(self) -> dict:
        return {"step": self.step, "batches": self.batches, "rows": self.rows, "nonfinite": self.nonfinite, "streak": self.streak,
                "overflow": self.overflow, "clipped": self.clipped, "elapsed": self.elapsed,
                "accumulator": self.acc.state()}


class StepResult(NamedTuple):
    lr: float
    grad_norm: float  # total norm before clipping (NaN when the update was skipped)
    clipped: bool
    counted: bool = True  # a step of train.steps (fp16_fairseq: False for an overflow, as fairseq)
    diagnostics: dict | None = None  # at row steps with train.diagnostics: diagnostics.UpdateProbe's row


def train_seed(cfg: dict, run_name: str, seed: int, prepared_dir: Path, codes_dir: Path, out_dir: Path,
               state_dir: Path, threads: int | None = None, rank: int = 0, world: int = 1) -> dict:
    """Train one arm with one seed; write metrics.csv, checkpoint.pt and summary.json into out_dir."""
    set_threads(threads if threads is not None else cfg["train"]["threads"])
    out_dir = Path(out_dir)
    done = _completed(out_dir, fingerprint(cfg, run_name, world))
    if done is not None:
        log.info("train %s seed %d: already complete in %s", run_name, seed, out_dir)
        return done
    s = build(cfg, run_name, seed, prepared_dir, codes_dir, out_dir, state_dir, rank, world)
    loop = restore(s)
    t = s.t
    t0 = time.monotonic() - loop.elapsed
    # fp16_fairseq: overflowing steps draw micro-batches without counting, so the loader is open-ended
    last = 2**62 if s.fp16 is not None else t.steps * t.accum_steps
    loader = iter(batches(s.train_data, loop.batches, last, t.workers, pin=s.device.type == "cuda"))
    with (Progress(t.steps, f"train {run_name}", unit="step", stream=None if s.writer else open(os.devnull, "w")) as bar,
          Trackers(cfg, run_name, seed, out_dir, enabled=s.writer) as trackers):  # train.loggers beside the CSV
        bar.update(loop.step)
        while loop.step < t.steps:
            result = train_step(s, loop, loader, loop.step + 1)
            step = loop.diverged_at or loop.step
            bar.update(int(result.counted))
            if (result.counted and step in s.rows_at) or loop.diverged_at:
                row = record(s, loop, step, result, time.monotonic() - t0)
                if row is not None:
                    trackers.log(row)  # at metrics rows only (trackers.py)
                    bar.update(0, cb0=row["train_loss_cb0"])  # shown between rows: no per-step host copy
            if loop.diverged_at:
                break
            if (result.counted and t.checkpoint_interval and step % t.checkpoint_interval == 0 and step < t.steps
                    and s.writer):
                loop.elapsed = time.monotonic() - t0
                save_state(s.state_dir, step, {"fingerprint": s.fingerprint, **loop.state(), "model": s.model.state_dict(),
                                               "optimizer": s.opt.state_dict(), "scaler": s.scaler.state_dict(),
                                               "fp16": s.fp16.state_dict() if s.fp16 else None,
                                               "rng": _rng_state(s.device)})
    return finish(s, loop)


def _completed(out_dir: Path, fp: dict) -> dict | None:
    """The summary of a seed already completed under the same fingerprint, else None."""
    done = out_dir / "summary.json"
    if done.is_file() and (out_dir / "metrics.csv").is_file() and (out_dir / "checkpoint.pt").is_file():
        try:
            previous = readers.read_seed_summary(done)
            readers.read_metrics(out_dir / "metrics.csv")
        except readers.ReadError as exc:  # the stage's own output, damaged: train the seed again
            log.warning("train: %s; training this seed again", exc)
            return None
        if previous.get("fingerprint") == fp:
            return previous
    return None


def build(cfg: dict, run_name: str, seed: int, prepared_dir: Path, codes_dir: Path, out_dir: Path,
          state_dir: Path, rank: int = 0, world: int = 1) -> Setup:
    """Settings, data (training crops and the fixed validation set), model, optimizer and scaler."""
    rc, m, t = C.run_config(cfg, run_name), C.model_config(cfg, run_name), C.train_config(cfg, run_name, seed)
    device = pick_device(t.device)
    corpus = load_prepared(prepared_dir)
    check_codes(codes_dir, corpus, m)
    crop_frames = C.crop_frames(cfg)
    train_data = CropData(corpus, codes_dir, "train", crop_frames, t.batch_size, m, t.seed, rank, world,
                          t.crop_unit, t.mask_group, mixture=True)
    # The validation set is fixed (crops and masks) and shared by every arm.
    valid = CropData(corpus, codes_dir, "valid", crop_frames, t.valid_crops, m, VALID_SEED)[0]

    tr = build_trainer(m, t, device, rank, world)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    log.info(
        "train %s: %s, %d params, %d steps of %d x %d x %d frames on %s (%s)",
        run_name, rc.label, sum(p.numel() for p in tr.model.parameters()), t.steps, t.accum_steps,
        t.batch_size, crop_frames, device, t.precision,
    )
    return Setup(run_name, seed, rc, m, t, device, rank, world, fingerprint(cfg, run_name, world), tr,
                 train_data, valid, set(log_steps(t.steps, t.log_interval, t.log_powers_of_two)), Path(out_dir),
                 Path(state_dir))


def restore(s: Setup) -> Loop:
    """A fresh loop, or the newest resumable state of this seed (model, optimizer, scaler, RNG, rows)."""
    loop = Loop(acc=_Accumulator(s.m.codebooks))
    state = load_latest_state(s.state_dir, s.fingerprint) if s.t.checkpoint_interval else None
    if state is None:
        return loop
    s.model.load_state_dict(state["model"])
    s.opt.load_state_dict(state["optimizer"])
    s.scaler.load_state_dict(state["scaler"])
    if s.fp16 is not None:
        s.fp16.load_state_dict(state["fp16"])
    _set_rng_state(state["rng"], s.device)
    loop.acc.load(state["accumulator"], s.device)
    loop.step, loop.rows, loop.elapsed = state["step"], list(state["rows"]), state["elapsed"]
    loop.batches = state.get("batches", loop.step * s.t.accum_steps)
    loop.nonfinite, loop.streak, loop.overflow, loop.clipped = (state["nonfinite"], state["streak"],
                                                                state["overflow"], state["clipped"])
    log.info("train %s seed %d: resuming after step %d from %s", s.run_name, s.seed, loop.step, s.state_dir)
    return loop


def train_step(s: Setup, loop: Loop, loader, step: int) -> StepResult:
    """One update (`update`): the schedule's lr, accum_steps micro-batches from the loader, clip, step.

    A non-finite loss on any micro-batch (in any process) skips the update, whose micro-batches are
    drawn all the same (micro-batch n is the same after a skip as after a resume); under fp32, bf16
    and fp16, train.max_nonfinite of them in a row end the seed as diverged. fp16_fairseq, as
    fairseq/trainer.py: an overflow (a non-finite loss, whose gradients would overflow, included) is
    not an update: the step counter, the schedule and the metrics' means skip it, the loss scale
    halves, and when it would reach min_loss_scale the seed stops as diverged (stop_reason
    min_loss_scale); train.max_nonfinite does not apply.

    With train.diagnostics, at a metrics row: the per-block gradient norms as the update sees them
    (before clipping; fp16_fairseq: the update ratios on the fp32 master weights) and the masked share.
    """
    t = s.t
    lr = lr_at(step, t)
    at_row = bool(t.diagnostics and step in s.rows_at and s.writer)
    micro = []
    for _ in range(t.accum_steps):
        micro.append([x.to(s.device, non_blocking=True) for x in next(loader)])  # wav, codes, mask[, clean wav]
        loop.batches += 1
    nan = float("nan")
    try:
        u = update(s.tr, micro, lr, probe=at_row)
    except MinLossScaleError as exc:
        loop.overflow += 1
        loop.diverged_at, loop.stop_reason = step, "min_loss_scale"
        log.warning("train %s seed %d: %s (update %d); stopped as diverged", s.run_name, s.seed, exc, step)
        return StepResult(lr, nan, False, counted=False)
    if s.fp16 is not None:
        if u.overflow:
            loop.overflow += 1
            return StepResult(lr, u.grad_norm, False, counted=False)
    else:
        loop.step = step
        if not u.finite:
            loop.nonfinite += 1  # skipped: no update from a non-finite loss
            loop.streak += 1
            if t.max_nonfinite and loop.streak >= t.max_nonfinite:
                loop.diverged_at, loop.stop_reason = step, "nonfinite"  # divergence is a result: record it, stop
                log.warning("train %s seed %d: diverged, %d non-finite steps in a row at step %d",
                            s.run_name, s.seed, loop.streak, step)
            return StepResult(lr, nan, False)
        loop.streak = 0
        loop.overflow += u.overflow
    loop.step = step
    loop.clipped += int(u.clipped)
    loop.acc.add(u.means, u.grad_norm, u.clipped)
    if u.probe is None:
        return StepResult(lr, u.grad_norm, u.clipped)
    masked = diagnostics.masked_fraction(float(sum(o.n_masked for o in u.outs)),
                                         t.accum_steps * micro[0][2].numel())
    return StepResult(lr, u.grad_norm, u.clipped, diagnostics={**u.probe.finish(), "masked_frac": masked})


def record(s: Setup, loop: Loop, step: int, result: StepResult, wall_time: float) -> dict | None:
    """A metrics row: the means since the previous row, this step's values and the fixed validation
    loss; appended to the loop's rows and to metrics.partial.csv. Only the writer records; the other
    processes flush their accumulators in step with it."""
    if not s.writer:
        loop.acc.flush()
        return None
    probe = diagnostics.ValidProbe(s.model) if s.t.diagnostics else contextlib.nullcontext()
    with probe:  # attention logits and codebook-0 accuracy, hooked into the validation pass
        v_bits = evaluate(s.model, *s.valid, s.device, s.t.precision)
    row = {"step": step, **loop.acc.flush(), "lr": result.lr, "grad_norm": result.grad_norm,
           "clipped": int(result.clipped)}
    row.update({f"valid_loss_cb{k}": float(b) for k, b in enumerate(v_bits)})
    if s.t.diagnostics:
        row.update({**(result.diagnostics or {}), **probe.values()})
    row.update(clipped_steps=loop.clipped, nonfinite=loop.nonfinite, overflow_skips=loop.overflow,
               loss_scale=_loss_scale(s), diverged=int(loop.diverged_at is not None), wall_time=wall_time)
    loop.rows.append(row)
    with atomic_path(s.out_dir / PARTIAL) as tmp:  # visible progress, never the final name; a full disk: one line
        pd.DataFrame(loop.rows).to_csv(tmp, index=False)
    return row


def _loss_scale(s: Setup) -> float:
    """The fp16 loss scale now (NaN without one), as fairseq logs `loss_scale`."""
    return s.tr.loss_scale


def finish(s: Setup, loop: Loop) -> dict:
    """The seed's final checkpoint, metrics.csv and summary.json (last: it marks the seed complete)."""
    if s.world > 1:
        dist.barrier()
    if not s.writer:
        return {"seed": s.seed}
    metrics = pd.DataFrame(loop.rows)
    with atomic_path(s.out_dir / "checkpoint.pt") as tmp:
        weights = s.fp16.fp32_state_dict(s.model) if s.fp16 is not None else s.model.state_dict()  # fp32 masters
        torch.save({"model": weights, "model_config": C.to_dict(s.m), "train_config": C.to_dict(s.t),
                    "run": C.to_dict(s.rc), "step": loop.diverged_at or s.t.steps}, tmp)
    summary = {**summarize(metrics, s.rc, s.t), "stop_reason": loop.stop_reason, "fingerprint": s.fingerprint}
    with atomic_path(s.out_dir / "metrics.csv") as tmp:
        metrics.to_csv(tmp, index=False)
    write_json(s.out_dir / "summary.json", summary)
    (s.out_dir / PARTIAL).unlink(missing_ok=True)
    shutil.rmtree(s.state_dir, ignore_errors=True)  # the seed is complete: nothing to resume
    log.info("train %s: done in %.0f s, final codebook-0 loss %.3f bits", s.run_name, summary["wall_time_s"],
             summary["final_train_loss_cb0"])
    return summary


PARTIAL = "metrics.partial.csv"  # the rows so far, while a seed trains


class _Accumulator:

    """Means since the last metrics row, summed on the training device so that a step adds no
    device-to-host copy; the sums reach the host only when a row is written."""

    def __init__(self, codebooks: int):
        self.k = codebooks
        self.reset()

    def reset(self):
        self.n, self.sums, self.clipped, self.gmax = 0, None, 0, 0.0  # sums: K bits, loss, feature penalty

    def add(self, means: torch.Tensor, grad_norm: float, clipped: bool):
        # `update`'s means: K bits, the loss, the feature penalty; averaged over micro-batches and processes
        v = means.double()
        self.sums = v if self.sums is None else self.sums + v
        self.n += 1
        self.clipped += int(clipped)
        self.gmax = max(self.gmax, grad_norm) if math.isfinite(grad_norm) else self.gmax

    def state(self) -> dict:
        return {"n": self.n, "sums": None if self.sums is None else self.sums.cpu(), "clipped": self.clipped,
                "gmax": self.gmax}

    def load(self, st: dict, device: torch.device) -> None:
        self.n, self.clipped, self.gmax = st["n"], st["clipped"], st["gmax"]
        self.sums = None if st["sums"] is None else st["sums"].to(device)

    def flush(self) -> dict:
        nan = float("nan")
        means = (self.sums / self.n).cpu().numpy() if self.n else np.full(self.k + 2, nan)
        row = {f"train_loss_cb{k}": float(means[k]) for k in range(self.k)}
        row.update(
            train_loss=float(means[self.k]),
            feature_penalty=float(means[self.k + 1]),
            grad_norm_max=self.gmax if self.n else nan,
            clip_frac=self.clipped / self.n if self.n else nan,
        )
        self.reset()
        return row


COMPLETED_WITH_NONFINITE = "completed_with_nonfinite"  # every step ran, some updates skipped as non-finite


def run_status(statuses: list[str]) -> str:
    """An arm's status from its seeds': the worst of completed < completed_with_nonfinite < diverged."""
    order = ["completed", COMPLETED_WITH_NONFINITE, "diverged"]
    return max(statuses, key=order.index)


def summarize(metrics: pd.DataFrame, rc: C.RunConfig, t: C.TrainConfig) -> dict:
    """Scalars for `dvc metrics show`: final losses (curves.final_loss), clipping, status."""
    finite = metrics[np.isfinite(metrics["train_loss_cb0"])]  # a diverged run: its finite rows
    last = metrics.iloc[-1]
    diverged = bool(metrics["diverged"].any())
    updates = int(last["step"]) - int(last["nonfinite"])  # updates taken: skipped steps are not updates
    nonfinite = int(last["nonfinite"])
    return {
        "run": rc.name,
        "label": rc.label,
        "seed": t.seed,
        "steps": int(last["step"]),
        # a skipped non-finite update is not a clean run: say so rather than "completed"
        "status": "diverged" if diverged else (COMPLETED_WITH_NONFINITE if nonfinite else "completed"),
        "diverged_at_step": int(last["step"]) if diverged else None,
        "final_train_loss_cb0": curves.final_loss(finite["step"], finite["train_loss_cb0"]),
        "final_valid_loss_cb0": curves.final_loss(finite["step"], finite["valid_loss_cb0"]),
        "first_train_loss_cb0": float(metrics["train_loss_cb0"].iloc[0]),
        "max_grad_norm": float(metrics["grad_norm_max"].max()),
        "clipped_frac": curves.clipped_fraction(int(last["clipped_steps"]), updates),
        "nonfinite_steps": nonfinite,
        "overflow_skips": int(last["overflow_skips"]),
        "wall_time_s": float(last["wall_time"]),
    }
