"""`amlm preflight`: measure a preset before spending GPU-days on it.

For each arm, the model is built at the preset's size on the preset's device and precision and
trained for a few real micro-batches (forward, finite-loss check, backward through the loss
scaler) and optimizer steps (`train.optimizer_step`: clipping, AdamW), on synthetic audio,
codes and span masks of the right shape, as `train.train_seed` runs them; no data stage is
needed. From the medians it projects one update,

    ms/update = micro-batches per update and process x ms/micro-batch + ms/optimizer step,

runs one whole update too when that projection is under a minute (and then uses the measured
update), and reports frames/s, model TFLOP/s (`flops.step_flops`), MFU where the device's peak
is known, peak memory and whether the preset fits (if not: the largest micro-batch that fits
and the `accum_steps` that keeps the global batch), the projected wall time of every arm and of
the whole figure, GPU-hours, and the disk the corpus, codes and checkpoints take. Results go to
`preflight.json` and `preflight.md`, written atomically.

Memory: on CUDA, the peak of `torch.cuda.max_memory_allocated` (tensors; the caching allocator
reserves a little more), and fitting is decided by trying. On CPU, the peak resident set size
(RSS) of the process above its size before the arm's model was built (Linux: VmHWM, reset
through /proc/self/clear_refs), and fitting is estimated against the memory available
(MemAvailable, or the cgroup limit when lower), linear in the micro-batch.

Arms whose models are identical (they differ only in the gradient clip, which costs nothing:
`clip_grad_norm_` always computes the norm and rescales) are measured once.
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
from acoustic_mlm.devices import pick_device
from acoustic_mlm.errors import UserError
from acoustic_mlm.preflight.flops import step_flops
from acoustic_mlm.model.objective import AcousticMLM, compute_mask_indices
from acoustic_mlm.train.state import KEEP_STATES
from acoustic_mlm.train.update import build_trainer, update
from acoustic_mlm.utils import Progress, atomic_path, log, set_threads, write_json

FULL_UPDATE_LIMIT_S = 60.0  # a whole update is run when its projection is below this
GB = 1e9  # memory and disk in decimal gigabytes
CODE_BYTES = 2  # int16 codes (tokenizer stage)
AUDIO_BYTES = 4  # float32 samples (prepare stage)
ADAM_STATE_BYTES = 8  # exp_avg and exp_avg_sq in fp32, per parameter
PARAM_BYTES = 4  # fp32 master weights (autocast keeps them fp32)

# Dense tensor-core peak (bf16 = fp16) and plain fp32 peak in TFLOP/s, from NVIDIA's datasheets
# (SXM parts unless named); matched as substrings of torch.cuda.get_device_name, first match wins.
PEAK_TFLOPS: tuple[tuple[str, float | None, float], ...] = (
    ("H200", 989.0, 67.0),
    ("H100 PCIe", 756.0, 51.0),
    ("H100", 989.0, 67.0),
    ("A100", 312.0, 19.5),
    ("L40S", 362.0, 91.6),
    ("A10", 125.0, 31.2),  # after A100: "A10" is a substring of "A100"
    ("V100", None, 15.7),  # fp16 tensor cores (125) but no bf16
)
V100_FP16_TFLOPS = 125.0
HALF_PRECISIONS = ("bf16", "fp16", "fp16_fairseq")  # tensor-core precisions (fp16_fairseq: an fp16 model)

# Named GPUs the cost is projected on when the preset's GPU is not here (from counted FLOPs; a
# projection, not a measurement): (name, dense fp16/bf16 peak, fp32 peak) in TFLOP/s, NVIDIA's
# datasheets (SXM parts).
PROJECTION_GPUS: tuple[tuple[str, float, float], ...] = (
    ("H100 / H200 (SXM)", 989.0, 67.0),
    ("A100 (SXM)", 312.0, 19.5),
)
DEFAULT_UTILISATION = 0.35  # share of the peak assumed for a projection: the middle of docs/recipe.md's 30-40 %
# Interconnect bandwidth per GPU and direction, GB/s, for the gradient all-reduce:
NVLINK_GB_S = 450.0  # within a node: NVLink 4 of an H100/H200 SXM, 900 GB/s bidirectional (NVIDIA H100 datasheet)
INFINIBAND_GB_S = 50.0  # across nodes: one 400 Gb/s NDR InfiniBand port per GPU (NVIDIA DGX H100 datasheet, 8x ConnectX-7)
BACKWARD_SHARE = 2 / 3  # of a micro-batch's FLOPs (flops.py: 4 of 6 per matmul weight): what DDP overlaps the all-reduce with

# Corpus sizes of the named sources that can be known before a download (sources.py: track counts
# of github.com/mdeff/fma, 30 s clips each).
KNOWN_CORPUS_SECONDS = {"fma_small": 8_000 * 30.0, "fma_medium": 25_000 * 30.0, "fma_large": 106_574 * 30.0}


# ----------------------------------------------------------------------------- formulas


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The device's peak for this precision from PEAK_TFLOPS, or None when the name is unknown."""
    for key, half, fp32 in PEAK_TFLOPS:
        if key in device_name:
            if precision == "fp32":
                return fp32
            if key == "V100":
                return V100_FP16_TFLOPS if precision in ("fp16", "fp16_fairseq") else None
            return half
    return None


def allreduce_ms(grad_bytes: int, processes: int, nodes: int, intra_gb_s: float, inter_gb_s: float) -> float:
    """A ring all-reduce of `grad_bytes` over `processes`: each process sends and receives
    2 (n - 1) / n of the bytes (nccl-tests' bus bandwidth, doc/PERFORMANCE.md), at the slowest link's
    bandwidth per GPU: NVLink within one node, the InfiniBand port across nodes. A projection."""
    if processes <= 1:
        return 0.0
    gb_s = intra_gb_s if nodes <= 1 else inter_gb_s
    return 2 * (processes - 1) / processes * grad_bytes / (gb_s * 1e9) * 1000.0


def with_communication(compute_ms: float, micro_ms: float, comm_ms: float) -> tuple[float, float, str]:
    """(ms per update, exposed all-reduce ms, what bounds it). DDP all-reduces the gradients during the
    last micro-batch's backward (BACKWARD_SHARE of its time); what is left of the all-reduce adds on.
    Communication bounds an update when the all-reduce takes longer than its compute."""
    exposed = max(0.0, comm_ms - BACKWARD_SHARE * micro_ms)
    return compute_ms + exposed, exposed, ("communication" if comm_ms > compute_ms else "compute")


def update_ms_at(flops: float, peak: float, utilisation: float) -> float:
    """A projection, not a measurement: ms for `flops` model FLOPs at `utilisation` of a `peak` TFLOP/s device."""
    return flops / (peak * 1e12 * utilisation) * 1000.0


def micro_batches_per_update(batch_size: int, accum_steps: int, processes: int, micro_batch: int) -> int:
    """Micro-batches each process runs per update: its share of the global batch / the micro-batch."""
    crops = batch_size * accum_steps // processes
    if crops % micro_batch:
        raise UserError(f"--micro-batch {micro_batch} does not divide the {crops} crops per update and process "
                        "(train.batch_size x train.accum_steps / train.processes)")
    return crops // micro_batch


def projected_update_ms(n_micro: int, micro_ms: float, optimizer_ms: float) -> float:
    """One update from its parts: n micro-batches and one optimizer step."""
    return n_micro * micro_ms + optimizer_ms


def wall_hours(steps: int, update_ms: float, seeds: int = 1) -> float:
    """Hours of one arm's job: its seeds one after another, `steps` updates each."""
    return seeds * steps * update_ms / 3.6e6


def figure_wall_hours(job_hours: list[float], slots: int) -> float:
    """Wall time of jobs on `slots` parallel slots, longest job first onto the least loaded slot."""
    loads = [0.0] * max(1, slots)
    for h in sorted(job_hours, reverse=True):
        loads[loads.index(min(loads))] += h
    return max(loads)


def suggest_micro_batch(crops_per_process: int, max_fit: int) -> int:
    """The largest divisor of a process's crops per update that is at most `max_fit` (0: none fits)."""
    return max((d for d in range(1, crops_per_process + 1) if crops_per_process % d == 0 and d <= max_fit), default=0)


def corpus_seconds(cfg: dict, corpus_hours: float | None = None) -> float | None:
    """Seconds of audio the preset's source holds, where it can be known before fetching."""
    if corpus_hours is not None:
        return corpus_hours * 3600.0
    d = cfg["data"]
    if d["source"] == "synthetic":
        return d["synthetic"]["n_clips"] * d["synthetic"]["clip_seconds"]
    return KNOWN_CORPUS_SECONDS.get(d["source"])


def disk_estimate(cfg: dict, params: int, arms: list[dict], slots: int, corpus_hours: float | None = None) -> dict:
    """Disk of prepared audio (float32, 24 kHz), codes (int16, K x 75 Hz) and checkpoints.

    Checkpoints: each seed's final checkpoint holds the fp32 weights; while a job runs, its
    resumable states (weights + Adam state, the last KEEP_STATES kept) sit beside it, for as
    many jobs as run at once.
    """
    seconds = corpus_seconds(cfg, corpus_hours)
    rate = cfg["data"]["sample_rate"]
    k = encodec.codebooks(float(cfg["tokenizer"]["bandwidth"]))  # rows of every codes.npy
    final_gb = params * PARAM_BYTES / GB
    state_gb = params * (PARAM_BYTES + ADAM_STATE_BYTES) / GB
    seeds = sum(a["seeds"] for a in arms)
    out = {
        "corpus_seconds": seconds,
        "corpus_note": None if seconds is not None else
        f"data.source {cfg['data']['source']}: size unknown before fetching; pass --corpus-hours",
        "audio_gb": None if seconds is None else seconds * rate * AUDIO_BYTES / GB,
        "codes_gb": None if seconds is None else seconds * encodec.FRAME_RATE * k * CODE_BYTES / GB,
        "codebooks_stored": k,
        "checkpoint_gb_per_seed": final_gb,
        "state_gb_per_file": state_gb,
        "checkpoints_gb": seeds * final_gb + min(slots, len(arms)) * KEEP_STATES * state_gb,
    }
    out["total_gb"] = None if seconds is None else out["audio_gb"] + out["codes_gb"] + out["checkpoints_gb"]
    return out


# ----------------------------------------------------------------------------- memory


class MemoryProbe:
    """Peak memory of a phase: CUDA allocated bytes, or the process's peak RSS on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.kind = ("peak CUDA memory allocated by torch (torch.cuda.max_memory_allocated)" if self.cuda else
                     "peak resident set size (RSS) of the process above its size before the arm's model was built")
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

    On CPU glibc keeps freed blocks in the process (the second of two paper-size models measured
    0 GB above a baseline that still held the first one's 5.8 GB); malloc_trim returns them.
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


def synthetic_batch(m: C.ModelConfig, batch: int, frames: int, device: torch.device, seed: int = 0):
    """Audio (B, 320 T), codes (B, K, T) and one fairseq span mask (B, T), shaped as a training batch."""
    g = torch.Generator().manual_seed(seed)
    wav = 0.1 * torch.randn(batch, frames * encodec.HOP, generator=g)
    codes = torch.randint(m.codebook_size, (batch, m.codebooks, frames), generator=g)
    mask = compute_mask_indices((batch, frames), m.mask_prob, m.mask_length, m.mask_min_masks,
                                np.random.default_rng(seed))
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


def measure_arm(m: C.ModelConfig, t: C.TrainConfig, device: torch.device, precision: str, frames: int,
                plan: Plan, n_micro_update: int, probe: MemoryProbe, bar: Progress | None = None) -> dict:
    """Time and memory of one arm's updates, built and stepped by train.build_trainer and
    train.update as `amlm train` steps them: micro-batches and steps timed apart, and (if short) one
    whole update.

    Raises torch.OutOfMemoryError on CUDA when the micro-batch does not fit.
    """
    _free(device)
    base = probe.current()
    tr = build_trainer(m, dataclasses.replace(t, precision=precision), device)
    params = sum(p.numel() for p in tr.model.parameters())
    batch = synthetic_batch(m, plan.micro_batch, frames, device, seed=t.seed)
    losses, updates, overflows = [], 0, 0

    def run(n: int, on_phase=None) -> None:
        nonlocal updates, overflows
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
    precision_state = {
        "param_dtype": str(first.dtype).removeprefix("torch."),
        "master_dtype": str(tr.fp16.master[0].dtype).removeprefix("torch.") if tr.fp16 is not None else None,
        "loss_scale": tr.loss_scale if math.isfinite(tr.loss_scale) else None,
        "scaler_updates": tr.fp16.scaler.iter if tr.fp16 is not None else None,
        "updates_run": updates,
        "overflow_updates": overflows,
        "grad_bytes": tr.grad_bytes(),
    }
    del tr, batch
    _free(device)
    return {
        "params": params,
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


# ----------------------------------------------------------------------------- the whole preset


def _fit_cuda(m, t, device, precision, frames, plan, crops_per_process, probe, bar) -> tuple[dict, int, list[int]]:
    """Measure at plan.micro_batch; when it runs out of memory, at the largest divisor of the
    process's crops per update that fits (tried in descending order). Returns (measurement,
    micro-batch measured, micro-batches that did not fit)."""
    tried_out = []
    candidates = [plan.micro_batch] + sorted(
        (d for d in range(1, plan.micro_batch) if crops_per_process % d == 0), reverse=True)
    for mb in candidates:
        try:
            p = Plan(mb, plan.micro_batches, plan.optimizer_steps, plan.warmup, plan.full_update)
            return measure_arm(m, t, device, precision, frames, p, crops_per_process // mb, probe, bar), mb, tried_out
        except torch.OutOfMemoryError:
            tried_out.append(mb)
            log.info("preflight: micro-batch %d does not fit on %s", mb, device)
        _free(device)  # outside the except block: its traceback no longer holds the failed attempt's tensors
    raise UserError(f"preflight: the model does not fit on {device} even at micro-batch 1")


def run(cfg: dict, config_path: str | Path, out_dir: Path = Path("results"), *, micro_batch: int | None = None,
        micro_batches: int | None = None, optimizer_steps: int | None = None, warmup: int | None = None,
        device_name: str | None = None, precision: str | None = None, peak: float | None = None,
        nodes: int | None = None, gpus_per_node: int | None = None, corpus_hours: float | None = None,
        full_update: bool | None = None, threads: int | None = None, utilisation: float = DEFAULT_UTILISATION,
        intra_node_gb_s: float = NVLINK_GB_S, inter_node_gb_s: float = INFINIBAND_GB_S,
        every_model: bool = False) -> dict:
    """Measure every arm of the preset; write preflight.json and preflight.md into out_dir.

    A preset for CUDA measured on CPU (no CUDA device, or --device cpu) measures one small
    micro-batch by default (one crop, one update, no warm-up: memory and plumbing), reports its times
    as CPU times and gives no hours from them; the GPU cost is projected from the counted FLOPs at
    `utilisation` of the peaks of PROJECTION_GPUS, with the gradient all-reduce at the interconnect
    bandwidths given. Only the first arm's model is measured then (`every_model`: each distinct one):
    on CPU an fp16 model's convolution backward runs on a slow kernel (BENCHMARKS.md), and the
    projection needs no CPU time.
    """
    t0 = C.train_config(cfg)
    precision = precision or t0.precision
    for name, value, low in (("--utilisation", utilisation, 1e-9), ("--intra-node-gb-s", intra_node_gb_s, 1e-9),
                             ("--inter-node-gb-s", inter_node_gb_s, 1e-9)):
        if not value >= low:
            raise UserError(f"preflight: {name} must be above 0, got {value}")
    if utilisation > 1:
        raise UserError(f"preflight: --utilisation is a share of the peak, at most 1, got {utilisation}")
    wanted = device_name or t0.device
    device_note = None
    if device_name is None and wanted == "cuda" and not torch.cuda.is_available():  # the preset's, not asked for
        wanted = "cpu"
        device_note = (f"{config_path} sets train.device cuda but torch sees no CUDA device: measured on CPU "
                       "(memory and plumbing; the times are CPU times, the GPU cost a projection from counted FLOPs)")
    if device_name == "cpu" and t0.device == "cuda":
        device_note = (f"{config_path} sets train.device cuda, measured on CPU as asked (memory and plumbing; the "
                       "times are CPU times, the GPU cost a projection from counted FLOPs)")
        log.warning("preflight: %s", device_note)
    set_threads(threads if threads is not None else t0.threads)
    device = pick_device(wanted, key="train.device" if device_name is None else "--device")
    device_label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    substitute = t0.device == "cuda" and device.type == "cpu"  # CPU times say nothing of the GPU's
    # one small micro-batch by default in place of the preset's GPU: seconds, not minutes
    defaults = dict(micro_batches=1, optimizer_steps=1, warmup=0, full_update=False) if substitute else \
        dict(micro_batches=4, optimizer_steps=2, warmup=1, full_update=True)
    micro_batches = defaults["micro_batches"] if micro_batches is None else micro_batches
    optimizer_steps = defaults["optimizer_steps"] if optimizer_steps is None else optimizer_steps
    warmup = defaults["warmup"] if warmup is None else warmup
    full_update = defaults["full_update"] if full_update is None else full_update
    for name, value, low in (("--micro-batches", micro_batches, 1), ("--optimizer-steps", optimizer_steps, 1),
                             ("--warmup", warmup, 0), ("--nodes", 1 if nodes is None else nodes, 1)):
        if value < low:
            raise UserError(f"preflight: {name} must be at least {low}, got {value}")
    if optimizer_steps > micro_batches:
        raise UserError(f"preflight: --optimizer-steps ({optimizer_steps}) cannot exceed --micro-batches ({micro_batches})")
    if peak is None and device.type == "cuda":
        peak = peak_tflops(device_label, precision)
    if gpus_per_node is None:  # the GPUs here; on CPU, the preset's: the projection is for its hardware
        gpus_per_node = torch.cuda.device_count() if device.type == "cuda" else t0.processes
    if t0.processes > gpus_per_node:
        raise UserError(f"preflight: train.processes ({t0.processes}) exceeds --gpus-per-node ({gpus_per_node}); "
                        "one run's processes on a node need a GPU each")
    nodes = t0.nodes if nodes is None else nodes  # the figure's machines: by default the preset's run's own
    processes = t0.world  # DDP processes of one run: train.nodes x train.processes
    crops_per_process = t0.batch_size * t0.accum_steps // processes
    preset_micro = t0.batch_size // processes
    mb = micro_batch if micro_batch is not None else (1 if substitute else preset_micro)
    if mb < 1:
        raise UserError(f"preflight: --micro-batch must be at least 1, got {mb}")
    micro_batches_per_update(t0.batch_size, t0.accum_steps, processes, mb)  # refuses a micro-batch that does not divide
    frames = C.crop_frames(cfg)
    plan = Plan(mb, micro_batches, optimizer_steps, warmup, full_update)

    # Arms whose models are identical cost the same: measure each model once.
    groups: dict[tuple, list[str]] = {}
    for run_name in cfg["runs"]:
        mc = C.model_config(cfg, run_name)
        groups.setdefault(mc, []).append(run_name)
    if substitute and not every_model:  # plumbing and memory of one model; the projection counts each arm's FLOPs
        groups = {"all": list(cfg["runs"])}
    probe = MemoryProbe(device)
    units = len(groups) * (warmup + micro_batches + optimizer_steps)
    log.info("preflight %s on %s (%s): %d models, micro-batch %d of %d frames", config_path, device_label,
             precision, len(groups), mb, frames)
    measured: dict[str, dict] = {}
    with Progress(units, "preflight", unit="step") as bar:
        for names in groups.values():
            m, t = C.model_config(cfg, names[0]), C.train_config(cfg, names[0])
            avail = probe.available()
            if device.type == "cuda":
                res, used_mb, no_fit = _fit_cuda(m, t, device, precision, frames, plan, crops_per_process, probe, bar)
            else:
                res = measure_arm(m, t, device, precision, frames, plan, crops_per_process // mb, probe, bar)
                used_mb, no_fit = mb, []
            res.update(measured_micro_batch=used_mb, available_memory_gb=avail / GB, did_not_fit=no_fit)
            res.update(_fit_summary(res, device, preset_micro, crops_per_process, avail, precision))
            for name in names:
                measured[name] = {**res, "measured_as": names[0]}
            bar.update(0, model=names[0])

    arms = []
    for name in cfg["runs"]:  # the configuration's order, whatever order the models were measured in
        res, rc = measured[name], C.run_config(cfg, name)
        n_micro = crops_per_process // res["measured_micro_batch"]
        compute_ms = res["ms_per_update_measured"] or res["ms_per_update_projected"]
        comm = allreduce_ms(res["grad_bytes"], processes, t0.nodes, intra_node_gb_s, inter_node_gb_s)
        update_ms, exposed, bound = with_communication(compute_ms, res["ms_per_micro_batch"], comm)
        flops = n_micro * step_flops(C.model_config(cfg, name), res["measured_micro_batch"], frames)
        tflops = flops / (compute_ms / 1000) / 1e12
        hours = None if substitute else wall_hours(t0.steps, update_ms, len(rc.seeds))
        arms.append({
            "run": name, "label": rc.label, "seeds": len(rc.seeds), "steps": t0.steps, **res,
            "micro_batches_per_update": n_micro,
            "update_source": "measured" if res["ms_per_update_measured"] else "projected",
            "ms_per_update_compute": compute_ms,
            "allreduce_bytes": res["grad_bytes"] if processes > 1 else 0,
            "allreduce_ms": comm,
            "exposed_allreduce_ms": exposed,
            "bound": bound,
            "ms_per_update": update_ms,
            "frames_per_update": crops_per_process * frames,
            "frames_per_s": crops_per_process * frames / (update_ms / 1000),
            "model_flops_per_update": flops,
            "tflops": tflops,
            "mfu": tflops / peak if peak else None,
            "hours_per_seed": None if substitute else wall_hours(t0.steps, update_ms),
            "hours": hours,
            "gpu_hours": None if substitute else hours * processes,
        })
    gpus = nodes * gpus_per_node
    slots = gpus // processes
    figure = {
        "arms": len(arms), "jobs": len(arms), "seeds": sum(a["seeds"] for a in arms), "steps": t0.steps,
        "processes": processes, "nodes": nodes, "gpus_per_node": gpus_per_node, "gpus": gpus,
        "concurrent_jobs": min(slots, len(arms)),
        "wall_hours": None if substitute else figure_wall_hours([a["hours"] for a in arms], slots),
        "gpu_hours": None if substitute else sum(a["gpu_hours"] for a in arms),
    }
    projection = None
    if substitute:
        projection = gpu_projection(cfg, arms, precision, utilisation, processes, t0.nodes, slots,
                                    intra_node_gb_s, inter_node_gb_s)
    sweep = sweep_projection(cfg, utilisation, intra_node_gb_s, inter_node_gb_s)
    result = {
        "config": str(config_path),
        "device": device_label,
        "device_type": device.type,
        "preset_device": t0.device,
        "device_note": device_note,
        "cpu_times": device.type == "cpu",
        "precision": precision,
        "preset_precision": t0.precision,
        "compile": t0.compile,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "peak_tflops": peak,
        "memory_kind": probe.kind,
        "crop_frames": frames,
        "batch_size": t0.batch_size,
        "accum_steps": t0.accum_steps,
        "global_batch": t0.batch_size * t0.accum_steps,
        "preset_micro_batch": preset_micro,
        "micro_batch": mb,
        "micro_batches_measured": micro_batches,
        "optimizer_steps_measured": optimizer_steps,
        "warmup_updates": warmup,
        "interconnect": {"intra_node_gb_s": intra_node_gb_s, "inter_node_gb_s": inter_node_gb_s,
                         "link": "none (one process)" if processes == 1 else
                         ("NVLink, within one node" if t0.nodes == 1 else "InfiniBand, across nodes")},
        "arms": arms,
        "figure": figure,
        "gpu_projection": projection,
        "sweep_projection": sweep,
        "disk": disk_estimate(cfg, arms[0]["params"], arms, slots, corpus_hours),
    }
    out_dir = Path(out_dir)
    write_json(out_dir / "preflight.json", result)
    with atomic_path(out_dir / "preflight.md") as tmp:
        tmp.write_text(markdown(result))
    if sweep is not None:
        g = sweep["gpus"][0]
        log.info("preflight: the sweep's %d points (%d runs) project to %.2f GPU-hours on one %s at %.0f%% of its peak",
                 sweep["points"], sweep["runs"], g["gpu_hours"], g["gpu"], 100 * utilisation)
    if substitute:
        best = projection[0]
        log.info("preflight: measured on CPU (CPU times); projected on %s at %.0f%% of its peak: the figure takes "
                 "%.1f h on %d GPU(s) (%.0f GPU-hours); results in %s", best["gpu"], 100 * utilisation,
                 best["wall_hours"], gpus, best["gpu_hours"], out_dir / "preflight.md")
    else:
        log.info("preflight: the figure takes %.1f h on %d GPU(s) (%.0f GPU-hours); results in %s",
                 figure["wall_hours"], gpus, figure["gpu_hours"], out_dir / "preflight.md")
    return result


def gpu_projection(cfg: dict, arms: list[dict], precision: str, utilisation: float, processes: int, nodes: int,
                   slots: int, intra_gb_s: float, inter_gb_s: float) -> list[dict]:
    """A projection, not a measurement: per GPU of PROJECTION_GPUS, one update of each arm from its
    counted FLOPs (flops.step_flops, per process) at `utilisation` of the GPU's peak for `precision`,
    plus what the gradient all-reduce leaves exposed; the figure's hours from those."""
    frames = C.crop_frames(cfg)
    rows = []
    for gpu, half, fp32 in PROJECTION_GPUS:
        gpu_peak = half if precision in HALF_PRECISIONS else fp32
        hours, per_arm = [], []
        for a in arms:
            micro_ms = update_ms_at(step_flops(C.model_config(cfg, a["run"]), a["measured_micro_batch"], frames),
                                    gpu_peak, utilisation)
            compute = a["micro_batches_per_update"] * micro_ms
            comm = allreduce_ms(a["grad_bytes"], processes, nodes, intra_gb_s, inter_gb_s)
            ms, exposed, bound = with_communication(compute, micro_ms, comm)
            per_arm.append({"run": a["run"], "compute_ms": compute, "allreduce_ms": comm, "exposed_allreduce_ms": exposed,
                            "ms_per_update": ms, "bound": bound,
                            "hours": wall_hours(a["steps"], ms, a["seeds"])})
            hours.append(per_arm[-1]["hours"])
        rows.append({"gpu": gpu, "peak_tflops": gpu_peak, "utilisation": utilisation, "arms": per_arm,
                     "wall_hours": figure_wall_hours(hours, slots), "gpu_hours": sum(hours) * processes})
    return rows


def sweep_projection(cfg: dict, utilisation: float, intra_gb_s: float, inter_gb_s: float) -> dict | None:
    """A projection, not a measurement: a sweep's whole map on each GPU of PROJECTION_GPUS, every point
    from its own counted FLOPs (its model, batch and steps) at `utilisation` of the GPU's peak for its
    own precision, plus its exposed all-reduce, its seeds one after another; None without a sweep.
    Training updates only: validation rows and start-up are not counted."""
    from acoustic_mlm.config.sweep import point_config, points

    pts = points(cfg)
    if not pts:
        return None
    frames = C.crop_frames(cfg)
    rows = []
    for gpu, half, fp32 in PROJECTION_GPUS:
        gpu_hours, panels = 0.0, {}
        for name, pt in pts.items():
            pc = point_config(cfg, name)
            m, t = C.model_config(pc, name), C.train_config(pc, name)
            micro = t.batch_size // t.world
            micro_ms = update_ms_at(step_flops(m, micro, frames), half if t.precision in HALF_PRECISIONS else fp32,
                                    utilisation)
            grad_bytes = sum(p.numel() for p in _param_shapes(m)) * (2 if t.precision == "fp16_fairseq" else 4)
            comm = allreduce_ms(grad_bytes, t.world, t.nodes, intra_gb_s, inter_gb_s)
            ms, _, _ = with_communication(t.accum_steps * micro_ms, micro_ms, comm)
            hours = wall_hours(t.steps, ms, len(pt.seeds)) * t.world
            gpu_hours += hours
            key = f"{m.layers} layers, {t.precision}"
            panels[key] = panels.get(key, 0.0) + hours
        rows.append({"gpu": gpu, "utilisation": utilisation, "gpu_hours": gpu_hours,
                     "panels": {k: round(v, 3) for k, v in panels.items()}})
    return {"points": len(pts), "runs": sum(len(p.seeds) for p in pts.values()), "gpus": rows}


def _param_shapes(m: C.ModelConfig) -> list:
    """The parameters of a model of this configuration, built on the meta device (no memory, no time)."""
    with torch.device("meta"):
        return list(AcousticMLM(m).parameters())


def steady_bytes_per_param(precision: str) -> int:
    """Bytes per parameter a steady update holds: fp32 weights, gradients and Adam state; under
    fp16_fairseq fp16 weights and gradients beside fp32 master weights, their gradients and Adam state."""
    if precision == "fp16_fairseq":
        return 2 + 2 + 2 * PARAM_BYTES + ADAM_STATE_BYTES
    return 2 * PARAM_BYTES + ADAM_STATE_BYTES


def _fit_summary(res: dict, device: torch.device, preset_micro: int, crops_per_process: int, avail: int,
                 precision: str = "fp32") -> dict:
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
        how = ("estimated: weights, gradients, master weights and Adam state plus the measured activations per "
               "crop times the micro-batch, against the memory available here")
        best = preset_micro if fits else suggest_micro_batch(crops_per_process, min(max_fit, crops_per_process))
    return {
        "fits": fits if fits is None else bool(fits),
        "fits_at_micro_batch": preset_micro,
        "max_micro_batch": max_fit,
        "max_micro_batch_method": how,
        "suggested_micro_batch": best,
        "suggested_accum_steps": crops_per_process // best if best else None,
    }


# ----------------------------------------------------------------------------- report


def _yes_no(x) -> str:
    return "not tried" if x is None else ("yes" if x else "no")


def _num(x, fmt: str = ".3g") -> str:
    return "n/a" if x is None else format(x, fmt)


def markdown(r: dict) -> str:
    """preflight.json as a readable page."""
    f, d = r["figure"], r["disk"]
    kind = "CPU" if r["cpu_times"] else "GPU"
    lines = [
        f"# Preflight: {r['config']}",
        "",
        f"Measured on **{r['device']}** ({r['precision']}, torch {r['torch']}, {r['threads']} CPU threads), "
        f"micro-batch {r['micro_batch']} of {r['crop_frames']} frames; {r['micro_batches_measured']} timed "
        f"micro-batches, {r['optimizer_steps_measured']} optimizer steps and {r['warmup_updates']} warm-up "
        "update(s) per model, on synthetic inputs, stepped by `train.update` as `amlm train` steps them.",
        "",
    ]
    if r["device_note"]:
        lines += [f"Note: {r['device_note']}.", ""]
    a0 = r["arms"][0]
    scale = (f"; loss scale {a0['loss_scale']:g} after {a0['updates_run']} update(s) ({a0['overflow_updates']} overflowed)"
             if a0["loss_scale"] is not None else "")
    masters = f", {a0['master_dtype']} master weights" if a0["master_dtype"] else ""
    lines += [f"Weights: {a0['param_dtype']}{masters}{scale}.", ""]
    if r["gpu_projection"] is None:
        lines += [
            f"| arm | ms/update | from | all-reduce ms | bound | frames/s | TFLOP/s | MFU | peak memory (GB) | fits | "
            f"micro-batch x accum | hours | {kind}-hours |",
            "|---|---:|---|---:|---|---:|---:|---:|---:|---|---|---:|---:|",
        ]
    else:
        lines += [
            "| arm | CPU ms/update | from | peak memory here (GB) | fits here | micro-batch x accum |",
            "|---|---:|---|---:|---|---|",
        ]
    for a in r["arms"]:
        mfu = "n/a" if a["mfu"] is None else f"{100 * a['mfu']:.1f}%"
        suggestion = (f"{a['suggested_micro_batch']} x {a['suggested_accum_steps']}" if a["suggested_micro_batch"]
                      else "none fits")
        if r["gpu_projection"] is None:
            lines.append(
                f"| {a['run']} | {a['ms_per_update']:.1f} | {a['update_source']} | {a['exposed_allreduce_ms']:.1f} "
                f"of {a['allreduce_ms']:.1f} | {a['bound']} | {a['frames_per_s']:.0f} | "
                f"{a['tflops']:.3g} | {mfu} | {a['peak_memory_gb']:.2f} | {_yes_no(a['fits'])} | "
                f"{suggestion} | {a['hours']:.2f} | {a['gpu_hours']:.2f} |"
            )
        else:
            lines.append(f"| {a['run']} | {a['ms_per_update']:.1f} | {a['update_source']} | {a['peak_memory_gb']:.2f} | "
                         f"{_yes_no(a['fits'])} | {suggestion} |")
    ic = r["interconnect"]
    lines += [
        "",
        f"**Gradient all-reduce**: {a0['allreduce_bytes'] / GB:.3g} GB per update and process ({a0['param_dtype']} "
        f"gradients, once per update), over {ic['link']}, at {ic['intra_node_gb_s']:g} GB/s within a node and "
        f"{ic['inter_node_gb_s']:g} GB/s across nodes per GPU (defaults: NVLink of an H100/H200 SXM, 900 GB/s both "
        "ways, NVIDIA's H100 datasheet; one 400 Gb/s NDR InfiniBand port per GPU, NVIDIA's DGX H100 datasheet); a "
        "ring moves 2 (n - 1) / n of the bytes (nccl-tests' bus bandwidth). DDP overlaps it with the last "
        "micro-batch's backward; what is left adds to the update. Communication bounds an update when the "
        "all-reduce takes longer than its compute.",
        "",
    ]
    if r["gpu_projection"] is not None:
        lines += [
            f"**Projection on GPUs** (not a measurement: counted FLOPs, `acoustic_mlm.preflight.flops.step_flops`, at "
            f"{100 * r['gpu_projection'][0]['utilisation']:.0f}% of each GPU's dense {r['precision']} peak, plus the "
            "exposed all-reduce; no hours are taken from the CPU times above):",
            "",
            "| GPU | peak TFLOP/s | ms/update | all-reduce ms | bound | the figure: wall hours | GPU-hours |",
            "|---|---:|---:|---:|---|---:|---:|",
        ]
        for g in r["gpu_projection"]:
            a = g["arms"][0]
            lines.append(f"| {g['gpu']} | {g['peak_tflops']:g} | {a['ms_per_update']:.1f} | {a['allreduce_ms']:.1f} | "
                         f"{a['bound']} | {g['wall_hours']:.1f} | {g['gpu_hours']:.0f} |")
        lines += ["", f"**The figure**: {f['arms']} arms x {f['steps']:,} steps ({f['seeds']} seed runs), "
                  f"{f['processes']} process(es) per run, {f['nodes']} node(s) x {f['gpus_per_node']} GPU(s), "
                  f"{f['concurrent_jobs']} job(s) at once (hours: the projection above)."]
    else:
        lines += [
            f"**The figure**: {f['arms']} arms x {f['steps']:,} steps ({f['seeds']} seed runs), {f['processes']} "
            f"process(es) per run, {f['nodes']} node(s) x {f['gpus_per_node']} GPU(s), {f['concurrent_jobs']} job(s) "
            f"at once: **{f['wall_hours']:.1f} h** wall, {f['gpu_hours']:.1f} {kind}-hours.",
        ]
    if r.get("sweep_projection"):
        sw = r["sweep_projection"]
        lines += ["", f"**The sweep** (a projection from counted FLOPs, not a measurement): {sw['points']} points, "
                  f"{sw['runs']} runs one after another on one GPU, each at its own precision's peak x "
                  f"{100 * sw['gpus'][0]['utilisation']:.0f}%, training updates only:", "",
                  "| GPU | GPU-hours for the map | by panel |", "| --- | --- | --- |"]
        for g in sw["gpus"]:
            by = ", ".join(f"{k}: {v:.2f}" for k, v in g["panels"].items())
            lines.append(f"| {g['gpu']} | {g['gpu_hours']:.2f} | {by} |")
    lines += [
        "",
        f"**Disk**: audio {_num(d['audio_gb'])} GB (float32, 24 kHz), codes {_num(d['codes_gb'])} GB "
        f"(int16, {d['codebooks_stored']} x 75 Hz), checkpoints {d['checkpoints_gb']:.3g} GB "
        f"({d['checkpoint_gb_per_seed']:.3g} GB per seed; resumable states of {d['state_gb_per_file']:.3g} GB, "
        f"the last {KEEP_STATES} per running job); total {_num(d['total_gb'])} GB."
        + (f" {d['corpus_note']}." if d["corpus_note"] else ""),
        "",
        "How: ms/update = micro-batches per update and process x median ms per micro-batch (forward, backward) + "
        "median ms per step (the once-per-update finite check, clipping, AdamW) + the exposed all-reduce; when that "
        "is under a minute one whole update is run and its time used ('measured'). Wall time = seeds x steps x "
        "ms/update; GPU-hours = wall x processes; the figure's jobs share the GPUs longest first. Model FLOPs: "
        f"acoustic_mlm.preflight.flops.step_flops. Memory: {r['memory_kind']}.",
        "",
    ]
    return "\n".join(lines)
