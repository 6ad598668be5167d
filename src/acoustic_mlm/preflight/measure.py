"""Preflight's measurements: one arm's model built and stepped by `train.build_trainer` and
`train.update` on synthetic inputs of a training batch's shape, its micro-batches and optimizer
steps timed apart with their peak memory (`MemoryProbe`), and whether the preset's micro-batch fits
(on CUDA by trying smaller ones, on CPU estimated against the memory available).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.errors import UserError
from acoustic_mlm.model.objective import compute_mask_indices
from acoustic_mlm.preflight.project import GB, projected_update_ms, steady_bytes_per_param, suggest_micro_batch
from acoustic_mlm.train.precision import FP32, FairseqPrecision
from acoustic_mlm.train.update import build_trainer, update
from acoustic_mlm.utils import Progress, log

FULL_UPDATE_LIMIT_S = 60.0  # a whole update is run when its projection is below this
# A CUDA preset without its GPU (issue 32, class 6: the paper preset's fp16 micro-batch took minutes on a
# CPU): a bounded float32 measurement instead, of a cut of the model (its front end, heads and CUT_LAYERS
# blocks) at as many frames as fit CPU_BUDGET_S for one micro-batch, forward and backward, at
# CPU_STEP_EFFICIENCY of this CPU's float32 matmul rate (measured on this machine first). The
# activations it counts extrapolate exactly in the blocks (identical) and linearly in the frames.
CUT_LAYERS = 2
CPU_BUDGET_S = 6.0
CPU_STEP_EFFICIENCY = 0.05  # measured: gpu-small's cut step ran at 0.06 of the matmul rate on 2 cores
MIN_FRAMES = 32  # enough for a span mask of MERT's settings (mask_length 5, two spans at least)


# ----------------------------------------------------------------------------- memory


class MemoryProbe:
    """Peak memory of a phase: CUDA allocated bytes, or the process's peak RSS on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.kind = (
            "peak CUDA memory allocated by torch (torch.cuda.max_memory_allocated)"
            if self.cuda
            else "peak resident set size (RSS) of the process above its size before the arm's model was built"
        )
        self.resettable = self.cuda or self._reset_rss_peak()

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise OSError(f"/proc/self/status has no {field}")

    @staticmethod
    def _reset_rss_peak() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            return True
        except OSError:
            return False

    def current(self) -> int:
        if self.cuda:
            return torch.cuda.memory_allocated(self.device)
        try:
            return self._status("VmRSS")
        except OSError:
            return 0

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._reset_rss_peak()

    def peak(self) -> int:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        try:
            return self._status("VmHWM")
        except OSError:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB; never reset

    def available(self) -> int:
        """Bytes the measured quantity may grow to: the device's total, or the memory available to
        this process (MemAvailable, or the cgroup v2 limit minus its usage when lower)."""
        if self.cuda:
            return torch.cuda.get_device_properties(self.device).total_memory
        avail = None
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        avail = int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            if limit != "max":
                avail = min(avail or math.inf, int(limit) - used)
        except (OSError, ValueError):
            pass
        if avail is None:
            import psutil

            avail = psutil.virtual_memory().available
        return int(avail)


def _free(device: torch.device) -> None:
    """Release the previous model's memory, so that the next one's is measured from a true baseline.

    On CPU glibc keeps freed blocks in the process (a second paper-size model measured nothing
    above a baseline that still held the first one's memory); malloc_trim returns them.
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        import ctypes

        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: the baseline may include freed memory
            pass


# ----------------------------------------------------------------------------- measuring one arm


@dataclass
class Plan:
    """What to run per arm."""

    micro_batch: int  # crops per measured micro-batch (per process)
    micro_batches: int  # timed micro-batches
    optimizer_steps: int  # timed optimizer steps (the micro-batches are shared out between them)
    warmup: int  # untimed updates of one micro-batch first (compilation, kernel selection, Adam state)
    full_update: bool = True  # run one whole update when projected under FULL_UPDATE_LIMIT_S
    frames: int | None = None  # frames per measured crop (None: the preset's crop)
    cut_layers: int | None = None  # measure the model cut to this many blocks (None: the whole model)
    count_activations: bool = False  # count the bytes autograd saves per crop (CPU stand-in for a GPU)


# ----------------------------------------------------------------------------- a bounded CPU measurement


def cpu_matmul_gflops(size: int = 768, repeats: int = 4) -> float:
    """This CPU's float32 matmul rate (GFLOP/s) with torch's threads as set: a fraction of a second."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # first call: threads and kernels
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return repeats * 2 * size**3 / (time.perf_counter() - t0) / 1e9


def bounded_frames(
    m: C.ModelConfig,
    preset_frames: int,
    micro_batch: int,
    gflops: float,
    budget_s: float = CPU_BUDGET_S,
    efficiency: float = CPU_STEP_EFFICIENCY,
) -> int:
    """The most frames (at most the preset's, at least MIN_FRAMES) whose counted FLOPs for one micro-batch
    of the model (forward and backward, plus nnAudio's CQT when it is on) fit `budget_s` at `efficiency`
    of `gflops`."""
    from acoustic_mlm.preflight.flops import step_flops

    def seconds(frames: int) -> float:
        flops = step_flops(m, micro_batch, frames)
        if m.cqt_loss_weight > 0 and m.cqt_impl == "nnaudio":  # 336 bins x 2 x 65,536 taps x 2 per frame
            flops += micro_batch * frames * m.cqt_bins * 2 * 65536 * 2
        return flops / (gflops * 1e9 * efficiency)

    lo, hi = min(MIN_FRAMES, preset_frames), preset_frames
    if seconds(hi) <= budget_s:
        return hi
    while hi - lo > 1:  # seconds() grows with the frames
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if seconds(mid) <= budget_s else (lo, mid)
    return lo


class SavedBytes:
    """Bytes autograd saves for the backward during a forward (`torch.autograd.graph.saved_tensors_hooks`):
    each storage once, parameters left out (they are the weights), attributed to the encoder block that
    saved them or to the rest of the model. Counted, not a peak: what a micro-batch's activations hold
    whatever the allocator does, on any device."""

    def __init__(self, model: torch.nn.Module):
        from acoustic_mlm.model.encoder import EncoderBlock

        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.blocks: dict[int, int] = {}  # block index -> bytes
        self.rest = 0
        self._seen: set[int] = set()
        self._scope: int | None = None
        self._handles = []
        for i, block in enumerate(b for b in model.modules() if isinstance(b, EncoderBlock)):
            self.blocks[i] = 0
            self._handles.append(block.register_forward_pre_hook(lambda _m, _a, i=i: self._enter(i)))
            self._handles.append(block.register_forward_hook(lambda _m, _a, _o: self._enter(None)))
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _enter(self, scope: int | None) -> None:
        self._scope = scope

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested): not counted
            return t
        ptr = storage.data_ptr()
        if ptr and ptr not in self.params and ptr not in self._seen:
            self._seen.add(ptr)
            if self._scope is None:
                self.rest += storage.nbytes()
            else:
                self.blocks[self._scope] += storage.nbytes()
        return t

    def __enter__(self) -> "SavedBytes":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()

    def extrapolate(self, layers: int) -> int:
        """The bytes of a model with `layers` identical blocks: the rest plus the mean block's, times layers.
        The first block also saves the stack's input, so the mean block is taken over the later ones."""
        per_block = list(self.blocks.values())
        if not per_block:
            return self.rest
        later = per_block[1:] or per_block
        return int(self.rest + per_block[0] + (layers - 1) * statistics.mean(later))


def synthetic_batch(m: C.ModelConfig, batch: int, frames: int, device: torch.device, seed: int = 0):
    """Audio (B, 320 T), codes (B, K, T) and one fairseq span mask (B, T), shaped as a training batch."""
    g = torch.Generator().manual_seed(seed)
    wav = 0.1 * torch.randn(batch, frames * encodec.HOP, generator=g)
    codes = torch.randint(m.codebook_size, (batch, m.codebooks, frames), generator=g)
    mask = compute_mask_indices(
        (batch, frames), m.mask_prob, m.mask_length, m.mask_min_masks, np.random.default_rng(seed)
    )
    return wav.to(device), codes.to(device), torch.from_numpy(mask).to(device)


class _Phases:
    """`train.update`'s on_phase: time and peak memory of each micro-batch (forward, backward) and of
    the step (the once-per-update check, clipping, AdamW), the device synchronised at each phase."""

    def __init__(self, device: torch.device, probe: MemoryProbe, grad_bytes: int):
        self.device, self.probe, self.grad_bytes = device, probe, grad_bytes
        self.micro_s: list[float] = []
        self.step_s: list[float] = []
        self.micro_peak = self.activation = self.step_peak = 0

    def _mark(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _restart(self) -> None:
        self.probe.reset()
        self.start_mem = self.probe.current()
        self.t0 = self._mark()

    def __call__(self, phase: str) -> None:
        now = self._mark()
        if phase == "start":
            self.first = True  # zero_grad(set_to_none) empties the gradients between updates, as in training
        elif phase == "micro":
            self.micro_s.append(now - self.t0)
            peak = self.probe.peak()
            self.micro_peak = max(self.micro_peak, peak)
            # activations: the peak above the start, less the gradients the first micro-batch creates
            self.activation = max(self.activation, peak - self.start_mem - (self.grad_bytes if self.first else 0))
            self.first = False
        else:
            self.step_s.append(now - self.t0)
            self.step_peak = max(self.step_peak, self.probe.peak())
        self._restart()


def _split(total: int, parts: int) -> list[int]:
    """`total` micro-batches shared out between `parts` updates, the first ones taking the remainder."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def measure_arm(
    m: C.ModelConfig,
    t: C.TrainConfig,
    device: torch.device,
    precision: str,
    frames: int,
    plan: Plan,
    n_micro_update: int,
    probe: MemoryProbe,
    bar: Progress | None = None,
) -> dict:
    """Time and memory of one arm's updates, built and stepped by train.build_trainer and
    train.update as `amlm train` steps them: micro-batches and steps timed apart, and (if short) one
    whole update.

    Raises torch.OutOfMemoryError on CUDA when the micro-batch does not fit.
    """
    _free(device)
    base = probe.current()
    frames = plan.frames or frames
    built = m if plan.cut_layers is None else dataclasses.replace(m, layers=min(m.layers, plan.cut_layers))
    tr = build_trainer(built, dataclasses.replace(t, precision=precision), device)
    params = sum(p.numel() for p in tr.model.parameters())
    batch = synthetic_batch(m, plan.micro_batch, frames, device, seed=t.seed)
    losses, updates, overflows = [], 0, 0
    counter: SavedBytes | None = None
    if plan.count_activations:  # the GPU's code path: every frame scored (static shapes), as on CUDA
        tr.model.static_shapes = True

    def run(n: int, on_phase=None) -> None:
        nonlocal updates, overflows, counter
        if plan.count_activations and counter is None and n == 1:  # one micro-batch's saved tensors
            with SavedBytes(tr.model) as counter:
                u = update(tr, [batch], t.lr, on_phase=on_phase)
        else:
            u = update(tr, [batch] * n, t.lr, on_phase=on_phase)
        losses.extend(float(o.loss.detach()) for o in u.outs)
        updates += 1
        overflows += int(u.overflow)

    t0 = time.perf_counter()
    for _ in range(plan.warmup):  # untimed: compilation, kernel selection, the Adam state
        run(1)
        if bar is not None:
            bar.update(1)
    warmup_s = time.perf_counter() - t0
    phases = _Phases(device, probe, tr.grad_bytes())
    for share in _split(plan.micro_batches, plan.optimizer_steps):
        run(share, phases)
        if bar is not None:
            bar.update(share + 1)
    static = probe.current() - base  # weights, master weights and Adam state (gradients freed between updates)
    micro_ms, opt_ms = 1000 * statistics.median(phases.micro_s), 1000 * statistics.median(phases.step_s)
    projected = projected_update_ms(n_micro_update, micro_ms, opt_ms)
    micro_peak = phases.micro_peak
    full_ms = None
    if plan.full_update and projected / 1000 < FULL_UPDATE_LIMIT_S:
        probe.reset()
        t0 = phases._mark()
        run(n_micro_update)
        full_ms = 1000 * (phases._mark() - t0)
        micro_peak = max(micro_peak, probe.peak())
    first = next(tr.model.parameters())
    fairseq = tr.precision if isinstance(tr.precision, FairseqPrecision) else None  # fp32 master weights, its scaler
    precision_state = {
        "param_dtype": str(first.dtype).removeprefix("torch."),
        "master_dtype": str(fairseq.master[0].dtype).removeprefix("torch.") if fairseq is not None else None,
        "loss_scale": tr.loss_scale if math.isfinite(tr.loss_scale) else None,
        "scaler_updates": fairseq.scaler.iter if fairseq is not None else None,
        "updates_run": updates,
        "overflow_updates": overflows,
        "grad_bytes": tr.grad_bytes(),
    }
    tr = batch = None  # let go of the model and batch before _free (not `del`: run() closes over them)
    _free(device)
    return {
        # the bytes autograd saved for one micro-batch, extrapolated to the whole model (None: not counted)
        "activation_bytes_counted": None if counter is None else counter.extrapolate(m.layers),
        "params": params,
        "measured_params": params,
        "measured_frames": frames,
        "measured_layers": built.layers,
        "warmup_s": warmup_s,
        "ms_per_micro_batch": micro_ms,
        "ms_per_micro_batch_all": [1000 * x for x in phases.micro_s],
        "ms_optimizer_step": opt_ms,
        "ms_optimizer_step_all": [1000 * x for x in phases.step_s],
        "ms_per_update_projected": projected,
        "ms_per_update_measured": full_ms,
        "peak_memory_gb": (max(micro_peak, phases.step_peak) - base) / GB,
        "static_memory_gb": static / GB,
        "activation_gb_per_micro_batch": phases.activation / GB,
        "losses_finite": bool(np.all(np.isfinite(losses))),
        "first_loss": losses[0] if losses else None,
        **precision_state,
    }


# ----------------------------------------------------------------------------- whether it fits


def fit_cuda(m, t, device, precision, frames, plan, crops_per_process, probe, bar) -> tuple[dict, int, list[int]]:
    """Measure at plan.micro_batch; when it runs out of memory, at the largest divisor of the
    process's crops per update that fits (tried in descending order). Returns (measurement,
    micro-batch measured, micro-batches that did not fit)."""
    tried_out = []
    candidates = [plan.micro_batch] + sorted(
        (d for d in range(1, plan.micro_batch) if crops_per_process % d == 0), reverse=True
    )
    for mb in candidates:
        try:
            p = dataclasses.replace(plan, micro_batch=mb)
            return measure_arm(m, t, device, precision, frames, p, crops_per_process // mb, probe, bar), mb, tried_out
        except torch.OutOfMemoryError:
            tried_out.append(mb)
            log.info("preflight: micro-batch %d does not fit on %s", mb, device)
        _free(device)  # outside the except block: its traceback no longer holds the failed attempt's tensors
    raise UserError(f"preflight: the model does not fit on {device} even at micro-batch 1")


def fit_summary(
    res: dict, device: torch.device, preset_micro: int, crops_per_process: int, avail: int, precision: str = FP32
) -> dict:
    """Whether the preset's micro-batch fits, the largest that fits, and the setting that keeps the global batch.

    CUDA: decided by trying (the micro-batch measured is the largest that fitted). CPU: the peak
    grows linearly in the micro-batch from the measured one, against the memory available.
    """
    mb = res["measured_micro_batch"]
    if device.type == "cuda":
        # a smaller micro-batch asked for (--micro-batch) says nothing about the preset's: not tried
        fits = False if res["did_not_fit"] else (True if mb >= preset_micro else None)
        max_fit, how = (mb if res["did_not_fit"] else None), "tried on the device"
        best = preset_micro if fits else mb
    else:
        # A steady update holds weights, gradients and Adam state (steady_bytes_per_param: RSS after a
        # step also counts memory the allocator kept) plus the micro-batch's activations.
        per_crop = res["activation_gb_per_micro_batch"] * GB / mb
        steady = res["params"] * steady_bytes_per_param(precision)
        peak = res["peak_memory_gb"] * GB

        def peak_at(b: int) -> float:
            return max(peak, steady + b * per_crop)

        fits = peak_at(preset_micro) <= avail
        max_fit = int((avail - steady) // per_crop) if per_crop > 0 and peak_at(1) <= avail else 0
        how = (
            "estimated: weights, gradients, master weights and Adam state plus the measured activations per "
            "crop times the micro-batch, against the memory available here"
        )
        best = preset_micro if fits else suggest_micro_batch(crops_per_process, min(max_fit, crops_per_process))
    return {
        "fits": fits if fits is None else bool(fits),
        "fits_at_micro_batch": preset_micro,
        "max_micro_batch": max_fit,
        "max_micro_batch_method": how,
        "suggested_micro_batch": best,
        "suggested_accum_steps": crops_per_process // best if best else None,
    }
