"""The training step: one builder (`build_trainer`) and one update (`update`), used by `amlm train`,
`amlm preflight` and benchmarks/train_throughput.py: what they time is what trains. Also the
validation pass. Every difference between precisions (autocast, loss scaling, master weights,
unscaling, overflows) is the trainer's `Precision` object's (precision.py): nothing here asks
which precision it is.
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
from acoustic_mlm.train.precision import Precision, make_precision


@torch.no_grad()
def evaluate(model, wav, codes, mask, precision: Precision, chunk: int = 16) -> np.ndarray:
    """Per-codebook masked loss in bits on a fixed set, weighted by masked frames; each chunk's forward
    on the precision's device, in its autocast."""
    model.eval()
    device = precision.device
    total, count = None, 0
    for i in range(0, wav.shape[0], chunk):
        with precision.autocast():
            out = model(wav[i : i + chunk].to(device), codes[i : i + chunk].to(device), mask[i : i + chunk].to(device))
        n = float(out.n_masked)
        bits = out.bits.float().cpu().numpy() * n
        total = bits if total is None else total + bits
        count += n
    model.train()
    return total / count


@dataclass
class Trainer:
    """What an update needs: built by `build_trainer`, stepped by `update`."""

    model: torch.nn.Module  # the parameters (saved, evaluated), as the precision computes (precision.prepare)
    step_model: torch.nn.Module  # what a micro-batch calls: the model, wrapped in DDP and/or compiled
    ddp: torch.nn.parallel.DistributedDataParallel | None  # the DDP wrapper (no_sync), None on one process
    opt: torch.optim.Optimizer  # AdamW over what the precision updates (the parameters, or master weights)
    precision: Precision  # autocast, loss scaling, unscale-clip-step, overflows: the one loss scaler
    device: torch.device
    clip: float  # max total gradient norm; 0: no clipping
    world: int = 1  # DDP processes

    @property
    def loss_scale(self) -> float:
        """The loss scale now (NaN without one), as fairseq logs `loss_scale`."""
        return self.precision.loss_scale

    def grad_bytes(self) -> int:
        """Bytes of the gradients one update all-reduces (those of the parameters DDP syncs)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)


def build_trainer(
    m: C.ModelConfig,
    t: C.TrainConfig,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
    model: torch.nn.Module | None = None,
) -> Trainer:
    """The model (seeded with t.seed; or `model`, built already) as t.precision computes, wrapped in
    DDP on several processes and compiled with t.compile, its optimizer and its precision (the loss
    scaler among it), for t.precision and t.clip."""
    if model is None:
        torch.manual_seed(t.seed)
        model = AcousticMLM(m)
    precision = make_precision(t.precision, device, world, t.accum_steps)  # the scale window: processes, micro
    model = precision.prepare(model.to(device))
    step_model, ddp = model, None
    if world > 1:  # gradients are averaged over processes: with equal rows each, the global-batch mean
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
        step_model = ddp
        torch.manual_seed(t.seed + 1_000_003 * rank)  # distinct dropout streams per process
    step_model = torch.compile(step_model) if t.compile else step_model  # same parameters, compiled forward

    def adamw(params):
        return torch.optim.AdamW(params, lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay)

    opt = precision.build_optimizer(model, adamw)
    return Trainer(model, step_model, ddp, opt, precision, device, t.clip, world)


class Update(NamedTuple):
    outs: list  # each micro-batch's MLMOutput
    # (K + 2,) on the device: bits per codebook, loss, feature penalty; mean over micro-batches and processes
    means: torch.Tensor
    finite: bool  # every micro-batch's loss, and (without a loss scaler) the gradient norm, was finite
    grad_norm: float  # total norm before clipping (NaN when no step was tried)
    clipped: bool
    # the loss scaler skipped the step (where the precision retries overflows, a non-finite loss too)
    overflow: bool
    probe: object = None  # diagnostics.UpdateProbe taken before the step, when asked for and a step was tried


def update(tr: Trainer, micro_batches, lr: float, probe: bool = False, on_phase=None) -> Update:
    """One update: the learning rate `lr`; forward and backward of each micro-batch of
    `micro_batches` (an iterable of (wav, codes, mask[, clean wav]) on the device, drained whole);
    then, unless a loss was not finite, unscale, clip and step, as the trainer's precision does them.

    Gradients are all-reduced once per update, as fairseq: every backward but the last runs under
    DDP's `no_sync()`. The non-finite check costs one synchronisation per update: each micro-batch
    adds its verdict on the device, and one all-reduce of K + 4 scalars (non-finite micro-batches,
    masked frames, the metrics' means) follows the last backward. So, per update and process: one
    all-reduce of the gradients, one of those scalars, and (train.diagnostics, at metrics rows only)
    the probe's reads. A non-finite micro-batch does not stop the others being run (their
    gradients are dropped with the update): every process runs every backward, as DDP needs.

    The precision may scale the loss by the masked frames and divide the gradients by those of all
    processes (fairseq's, see precision.py), and may count a non-finite loss as an overflow;
    MinLossScaleError passes to the caller.
    `on_phase(name)`, if given, is called at "start", after each "micro" batch's backward and after
    the "step" (preflight times the phases); `probe` takes diagnostics.UpdateProbe before the step.
    """
    precision = tr.precision
    for group in tr.opt.param_groups:
        group["lr"] = lr
    precision.zero_grad()
    batches = list(micro_batches)
    n = len(batches)
    outs, bad, masked = [], None, None
    if on_phase is not None:
        on_phase("start")
    for i, batch in enumerate(batches):
        sync = tr.ddp is None or i == n - 1  # the gradients are all-reduced on the last backward only
        with contextlib.nullcontext() if sync else tr.ddp.no_sync():
            with precision.autocast():
                out = tr.step_model(*batch)
            outs.append(out)
            nonfinite = (~torch.isfinite(out.loss.detach())).float().reshape(1)
            bad = nonfinite if bad is None else bad + nonfinite
            masked = out.n_masked if masked is None else masked + out.n_masked
            precision.backward(out.loss, out.n_masked, n)
        if on_phase is not None:
            on_phase("micro")
    means = torch.stack(
        [
            torch.cat([o.bits.float(), o.loss.detach().float().reshape(1), o.feature_penalty.float().reshape(1)])
            for o in outs
        ]
    ).mean(0)
    stats = torch.cat([bad, masked.float().reshape(1), means])  # one collective and one host read per update
    if tr.world > 1:
        dist.all_reduce(stats)
    bad_all, total = stats[:2].tolist()
    means = stats[2:] / tr.world if tr.world > 1 else stats[2:]
    finite = bad_all == 0
    taken_probe = None
    if finite:
        if probe:  # before unscaling and clipping
            taken_probe = diagnostics.UpdateProbe(
                tr.model,
                precision.grad_scale(total, tr.world),
                weights=diagnostics.param_blocks(precision.named_weights()),
            )
        grad_norm, clipped, overflow = precision.unscale_and_clip(tr.clip, total, tr.world)
        if not math.isfinite(grad_norm) and math.isnan(precision.loss_scale):
            # finite losses, gradients not: without a loss scaler to skip it, the step would write NaN
            # into every weight. Skipped and counted as a non-finite update, as a non-finite loss is.
            finite, clipped, overflow = False, False, precision.skip_nonfinite()
        else:
            overflow = overflow or precision.step()
    else:  # skipped: no update from a non-finite loss (may raise MinLossScaleError)
        grad_norm, clipped, overflow = float("nan"), False, precision.skip_nonfinite()
    if on_phase is not None:
        on_phase("step")
    return Update(outs, means, finite, grad_norm, clipped, overflow, taken_probe)
