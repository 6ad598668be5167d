"""Preflight's projections: formulas from measured or counted numbers to the time of an update, of
an arm and of the whole figure, the gradient all-reduce, the peak TFLOP/s of known GPUs, and the
disk a preset takes; `gpu_projection` and `sweep_projection` cost a preset on named GPUs from its
counted FLOPs (`flops.step_flops`) when its own GPU is not here. Each is a projection, not a
measurement.
"""

from __future__ import annotations

import functools

import torch

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.errors import UserError
from acoustic_mlm.model.objective import AcousticMLM
from acoustic_mlm.preflight import measured
from acoustic_mlm.preflight.data_costs import SAMPLE_BYTES, corpus_seconds
from acoustic_mlm.preflight.flops import step_flops
from acoustic_mlm.train.precision import traits
from acoustic_mlm.train.state import KEEP_STATES

GB = 1e9  # memory and disk in decimal gigabytes
CODE_BYTES = 2  # int16 codes (tokenizer stage)
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

# Named GPUs the cost is projected on when the preset's GPU is not here (from counted FLOPs; a
# projection, not a measurement): (name, dense fp16/bf16 peak, fp32 peak) in TFLOP/s, NVIDIA's
# datasheets (SXM parts).
PROJECTION_GPUS: tuple[tuple[str, float, float], ...] = (
    ("H100 / H200 (SXM)", 989.0, 67.0),
    ("A100 (SXM)", 312.0, 19.5),
)
# Memory of the named GPUs (GB, decimal, NVIDIA's datasheets), for the projected memory of a CUDA preset
# measured without its GPU.
PROJECTION_GPU_MEMORY_GB: tuple[tuple[str, float], ...] = (
    ("H200 (141 GB)", 141.0),
    ("H100 / A100 (80 GB)", 80.0),
    ("A100 (40 GB)", 40.0),
)
HALF_ACTIVATION_SHARE = 0.5  # fp16_fairseq: a half model's activations are half the float32 ones counted
# share of the peak assumed where no GPU measured the shape (measured.py): the middle of docs/recipe.md's 30-40 %
DEFAULT_UTILISATION = 0.35
# Interconnect bandwidth per GPU and direction, GB/s, for the gradient all-reduce:
NVLINK_GB_S = 450.0  # within a node: NVLink 4 of an H100/H200 SXM, 900 GB/s bidirectional (NVIDIA H100 datasheet)
# across nodes: one 400 Gb/s NDR InfiniBand port per GPU (NVIDIA DGX H100 datasheet, 8x ConnectX-7)
INFINIBAND_GB_S = 50.0
# of a micro-batch's FLOPs (flops.py: 4 of 6 per matmul weight): what DDP overlaps the all-reduce with
BACKWARD_SHARE = 2 / 3


# ----------------------------------------------------------------------------- formulas


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The device's peak for this precision from PEAK_TFLOPS, or None when the name is unknown."""
    for key, half, fp32 in PEAK_TFLOPS:
        if key in device_name:
            tr = traits(precision)
            if not tr.tensor_cores:
                return fp32
            if key == "V100":
                return V100_FP16_TFLOPS if tr.matmul_dtype == torch.float16 else None
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
        raise UserError(
            f"--micro-batch {micro_batch} does not divide the {crops} crops per update and process "
            "(train.batch_size x train.accum_steps / train.processes)"
        )
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


def disk_estimate(cfg: C.Config, params: int, arms: list[dict], slots: int, corpus_hours: float | None = None) -> dict:
    """Disk of prepared audio (data.sample_format, 24 kHz), codes (int16, K x 75 Hz) and checkpoints.

    Checkpoints: each seed's final checkpoint holds the fp32 weights; while a job runs, its
    resumable states (weights + Adam state, the last KEEP_STATES kept) sit beside it, for as
    many jobs as run at once.
    """
    seconds = corpus_seconds(cfg, corpus_hours)
    rate = cfg.data.sample_rate
    k = encodec.codebooks(float(cfg.tokenizer.bandwidth))  # rows of every codes.npy
    final_gb = params * PARAM_BYTES / GB
    state_gb = params * (PARAM_BYTES + ADAM_STATE_BYTES) / GB
    seeds = sum(a["seeds"] for a in arms)
    out = {
        "corpus_seconds": seconds,
        "corpus_note": None
        if seconds is not None
        else f"data.source {cfg.data.source}: size unknown before fetching; pass --corpus-hours",
        "audio_gb": None if seconds is None else seconds * rate * SAMPLE_BYTES[cfg.data.sample_format] / GB,
        "sample_format": cfg.data.sample_format,
        "codes_gb": None if seconds is None else seconds * encodec.FRAME_RATE * k * CODE_BYTES / GB,
        "codebooks_stored": k,
        "checkpoint_gb_per_seed": final_gb,
        "state_gb_per_file": state_gb,
        "checkpoints_gb": seeds * final_gb + min(slots, len(arms)) * KEEP_STATES * state_gb,
    }
    out["total_gb"] = None if seconds is None else out["audio_gb"] + out["codes_gb"] + out["checkpoints_gb"]
    return out


def steady_bytes_per_param(precision: str) -> int:
    """Bytes per parameter a steady update holds: the model's weights and gradients (fp32; fp16 under
    fp16_fairseq) and Adam state, and with master weights (fp16_fairseq) their fp32 copies and gradients."""
    tr = traits(precision)
    return 2 * tr.weight_bytes + (2 * PARAM_BYTES if tr.half_model else 0) + ADAM_STATE_BYTES


# ----------------------------------------------------------------------------- on named GPUs, from counted FLOPs


def _utilisation(rec: measured.MeasuredMfu | None, gpu: str, utilisation: float | None) -> tuple[float, str]:
    """The share of `gpu`'s peak a projection uses and where it comes from: `--utilisation` when given, else the
    measured MFU where a measurement of this shape was taken on this GPU, else DEFAULT_UTILISATION (assumed)."""
    if utilisation is not None:
        return utilisation, "given (--utilisation)"
    hit = measured.on_gpu(rec, gpu)
    if hit is not None:
        return hit.mfu, f"measured: {hit.text()} on an {hit.gpu} at {hit.commit} ({hit.source})"
    return DEFAULT_UTILISATION, "assumed"


def gpu_projection(
    cfg: C.Config,
    arms: list[dict],
    precision: str,
    utilisation: float | None,
    processes: int,
    nodes: int,
    slots: int,
    intra_gb_s: float,
    inter_gb_s: float,
) -> list[dict]:
    """A projection, not a measurement: per GPU of PROJECTION_GPUS, one update of each arm from its
    counted FLOPs (flops.step_flops, per process) at a share of the GPU's peak for `precision` (`utilisation`
    when given, else the measured MFU of this shape on this GPU (`measured.MEASURED_MFU`), else
    DEFAULT_UTILISATION, assumed), plus what the gradient all-reduce leaves exposed; the figure's hours from
    those. A row at an assumed share also gives its GPU-hours at the lowest measured MFU."""
    frames = cfg.crop_frames
    rec = measured.for_config(cfg, precision)

    def at(gpu_peak: float, util: float) -> tuple[list[dict], list[float]]:
        hours, per_arm = [], []
        for a in arms:
            flops = step_flops(cfg.model_for(a["run"]), a["measured_micro_batch"], frames)
            micro_ms = update_ms_at(flops, gpu_peak, util)
            compute = a["micro_batches_per_update"] * micro_ms
            comm = allreduce_ms(a["grad_bytes"], processes, nodes, intra_gb_s, inter_gb_s)
            ms, exposed, bound = with_communication(compute, micro_ms, comm)
            per_arm.append(
                {
                    "run": a["run"],
                    "compute_ms": compute,
                    "allreduce_ms": comm,
                    "exposed_allreduce_ms": exposed,
                    "ms_per_update": ms,
                    "bound": bound,
                    "hours": wall_hours(a["steps"], ms, a["seeds"]),
                }
            )
            hours.append(per_arm[-1]["hours"])
        return per_arm, hours

    rows = []
    for gpu, half, fp32 in PROJECTION_GPUS:
        gpu_peak = half if traits(precision).tensor_cores else fp32
        util, source = _utilisation(rec, gpu, utilisation)
        per_arm, hours = at(gpu_peak, util)
        row = {
            "gpu": gpu,
            "peak_tflops": gpu_peak,
            "utilisation": util,
            "utilisation_source": source,
            "arms": per_arm,
            "wall_hours": figure_wall_hours(hours, slots),
            "gpu_hours": sum(hours) * processes,
        }
        if source == "assumed":
            low = measured.lowest()
            row["measured_mfu"] = measured.beside()
            row["gpu_hours_at_lowest_measured"] = sum(at(gpu_peak, low.mfu_low)[1]) * processes
            row["lowest_measured"] = low.mfu_low
        rows.append(row)
    return rows


def sweep_projection(cfg: C.Config, utilisation: float | None, intra_gb_s: float, inter_gb_s: float) -> dict | None:
    """A projection, not a measurement: a sweep's whole map on each GPU of PROJECTION_GPUS, every point
    from its own counted FLOPs (its model, batch and steps) at a share of the GPU's peak for its own precision
    (as `gpu_projection` chooses it, per point), plus its exposed all-reduce, its seeds one after another; None
    without a sweep. Training updates only: validation rows and start-up are not counted. Each row also gives
    its GPU-hours with every point at the lowest measured MFU (`measured.lowest`)."""
    pts = cfg.points
    if not pts:
        return None
    frames = cfg.crop_frames
    low = measured.lowest()
    rows = []
    for gpu, half, fp32 in PROJECTION_GPUS:
        gpu_hours, at_low, panels, sources = 0.0, 0.0, {}, set()
        for name, pt in pts.items():
            pc = cfg.point(name)
            m, t = pc.model_for(name), pc.train_for(name)
            util, source = _utilisation(measured.for_config(pc, t.precision), gpu, utilisation)
            sources.add(source)
            micro = t.batch_size // t.world
            flops = step_flops(m, micro, frames)
            peak = half if traits(t.precision).tensor_cores else fp32
            grad_bytes = _param_count(m) * traits(t.precision).weight_bytes
            comm = allreduce_ms(grad_bytes, t.world, t.nodes, intra_gb_s, inter_gb_s)
            point_hours = []
            for u in (util, low.mfu_low):
                micro_ms = update_ms_at(flops, peak, u)
                ms, _, _ = with_communication(t.accum_steps * micro_ms, micro_ms, comm)
                point_hours.append(wall_hours(t.steps, ms, len(pt.seeds)) * t.world)
            gpu_hours += point_hours[0]
            at_low += point_hours[1]
            key = f"{m.layers} layers, {t.precision}"
            panels[key] = panels.get(key, 0.0) + point_hours[0]
        rows.append(
            {
                "gpu": gpu,
                "utilisation": utilisation if utilisation is not None else DEFAULT_UTILISATION,
                "utilisation_source": "; ".join(sorted(sources)),
                "gpu_hours": gpu_hours,
                "gpu_hours_at_lowest_measured": at_low,
                "lowest_measured": low.mfu_low,
                "measured_mfu": measured.beside(),
                "panels": {k: round(v, 3) for k, v in panels.items()},
            }
        )
    return {"points": len(pts), "runs": sum(len(p.seeds) for p in pts.values()), "gpus": rows}


@functools.lru_cache(maxsize=None)
def _param_count(m: C.ModelConfig) -> int:
    """The parameter count of a model of this configuration, built once per configuration: a sweep's
    points share a few models (proxy-gpu: 84 points, 8 models), and building one costs about 0.5 s."""
    return sum(p.numel() for p in _param_shapes(m))


def _param_shapes(m: C.ModelConfig) -> list:
    """The parameters of a model of this configuration, built on the meta device (no memory, no time)."""
    with torch.device("meta"):
        return list(AcousticMLM(m).parameters())


def gpu_memory_projection(
    params: int,
    precision: str,
    activation_bytes_per_crop: float,
    micro_batch: int,
    counted_frames: int,
    preset_frames: int,
) -> dict:
    """A projection, not a measurement: one process's memory on a GPU from counted numbers. Weights,
    gradients, master weights and Adam state: `steady_bytes_per_param(precision)` per counted parameter;
    activations: the bytes autograd saved for one crop of `counted_frames` frames in float32 (counted
    on the CPU, `measure.SavedBytes`), linear in the frames to the preset's crop, halved for an fp16 model
    (fp16_fairseq), taken at float32 size under autocast (an upper bound: autocast saves half copies of
    matmul inputs beside float32 ones), times the micro-batch. The CUDA caching allocator, cuBLAS/cuDNN
    workspaces and the CUDA context come on top."""
    static = params * steady_bytes_per_param(precision)
    per_crop = activation_bytes_per_crop * preset_frames / counted_frames
    if traits(precision).half_model:
        per_crop *= HALF_ACTIVATION_SHARE
    total = static + micro_batch * per_crop
    return {
        "params": params,
        "bytes_per_param": steady_bytes_per_param(precision),
        "static_gb": static / GB,
        "activation_gb_per_crop": per_crop / GB,
        "micro_batch": micro_batch,
        "total_gb": total / GB,
        "counted_frames": counted_frames,
        "preset_frames": preset_frames,
        "gpus": [
            {
                "gpu": name,
                "memory_gb": mem,
                "fits": total / GB <= mem,
                "max_micro_batch": max(0, int((mem * GB - static) // per_crop)) if per_crop > 0 else None,
            }
            for name, mem in PROJECTION_GPU_MEMORY_GB
        ],
        "method": "counted: parameters x bytes per parameter for the precision, plus the float32 activations "
        "autograd saved for one crop on the CPU, linear in the frames, halved for an fp16 model, "
        "times the micro-batch; allocator overhead and workspaces not included",
    }


def full_params(m: C.ModelConfig) -> int:
    """The parameters of the whole model of this configuration, counted on the meta device."""
    return sum(p.numel() for p in _param_shapes(m))
