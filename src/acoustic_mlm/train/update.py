"""The training step: one builder (`build_trainer`) and one update (`update`), used by `amlm train`,
`amlm preflight` and benchmarks/train_throughput.py: what they time is what trains. Also the
autocast every forward runs under, the clip-and-step of an update and the validation pass.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from acoustic_mlm import config as C
from acoustic_mlm.model.objective import AcousticMLM
from acoustic_mlm.train import diagnostics
from acoustic_mlm.train.precision import FP16Optimizer, LossScaler, half_model, scale_window


def autocast(device: torch.device, precision: str):
    """Autocast for bf16 and fp16; fp32 and fp16_fairseq (a half model, precision.py) run as they are."""
    if precision in ("fp32", "fp16_fairseq"):
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


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
        ddp = torch.nn.parallel.DistributedDataParallel(model,
                                                        device_ids=[device.index] if device.type == "cuda" else None)
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
    # (K + 2,) on the device: bits per codebook, loss, feature penalty; mean over micro-batches and processes
    means: torch.Tensor
    finite: bool  # every micro-batch's loss was finite in every process
    grad_norm: float  # total norm before clipping (NaN when no step was tried)
    clipped: bool
    # the loss scaler skipped the step (precision fp16 or fp16_fairseq; under fp16_fairseq a non-finite loss too)
    overflow: bool
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
