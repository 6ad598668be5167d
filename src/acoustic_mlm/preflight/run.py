"""`amlm preflight`: measure a preset before spending GPU-days on it.

For each arm, the model is built at the preset's size on the preset's device and precision and
trained for a few real micro-batches (forward, finite-loss check, backward through the loss
scaler) and optimizer steps (the precision's `unscale_and_clip` and `step`, train/precision.py:
clipping, AdamW), on synthetic audio, codes and span masks of the right shape, as
`train.train_seed` runs them; no data stage is needed. From the medians it projects one update,

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

This module is the command, in named steps (`run`); the measurements are in `preflight.measure`,
the formulas and projections in `preflight.project`, the page in `preflight.report` and the FLOP
counts in `preflight.flops`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from acoustic_mlm import config as C
from acoustic_mlm.devices import pick_device
from acoustic_mlm.errors import UserError
from acoustic_mlm.preflight.data_costs import data_costs
from acoustic_mlm.preflight.flops import step_flops
from acoustic_mlm.preflight.log_summary import log_summary
from acoustic_mlm.preflight.measure import (
    CPU_BUDGET_S,
    CUT_LAYERS,
    MemoryProbe,
    Plan,
    bounded_frames,
    cpu_matmul_gflops,
    fit_cuda,
    fit_summary,
    measure_arm,
)
from acoustic_mlm.preflight.project import (
    DEFAULT_UTILISATION,
    GB,
    INFINIBAND_GB_S,
    NVLINK_GB_S,
    allreduce_ms,
    disk_estimate,
    figure_wall_hours,
    full_params,
    gpu_memory_projection,
    gpu_projection,
    micro_batches_per_update,
    peak_tflops,
    suggest_micro_batch,
    sweep_projection,
    wall_hours,
    with_communication,
)
from acoustic_mlm.preflight.report import markdown
from acoustic_mlm.train.precision import FP32, traits
from acoustic_mlm.utils import Progress, atomic_path, log, set_threads, write_json


@dataclass(frozen=True)
class Options:
    """`amlm preflight`'s options, built from its arguments (`preflight_commands`). None: the preset's value, or the
    default for where the preset is measured (the second default: a CUDA preset measured on CPU)."""

    micro_batch: int | None = None  # crops per measured micro-batch (train.batch_size / processes; 1)
    micro_batches: int | None = None  # timed micro-batches per model (4; 1)
    optimizer_steps: int | None = None  # timed optimizer steps per model (2; 1)
    warmup: int | None = None  # untimed updates of one micro-batch first (1; 0)
    full_update: bool | None = None  # run one whole update when projected under a minute (yes; never)
    device: str | None = None  # cpu | cuda | auto, in place of train.device
    precision: str | None = None  # in place of train.precision
    peak_tflops: float | None = None  # the device's peak for MFU (PEAK_TFLOPS by its name; none on CPU)
    nodes: int | None = None  # nodes of the whole-figure projection (train.nodes)
    gpus_per_node: int | None = None  # GPUs per node of the projection (the GPUs here; on CPU train.processes)
    corpus_hours: float | None = None  # hours of audio, for a source whose size is unknown before fetching
    threads: int | None = None  # CPU threads for torch (train.threads)
    utilisation: float | None = None  # share of a GPU's peak projected at (measured MFU where known, else assumed)
    intra_node_gb_s: float = NVLINK_GB_S  # all-reduce bandwidth per GPU within a node
    inter_node_gb_s: float = INFINIBAND_GB_S  # ... and across nodes
    every_model: bool = False  # a CUDA preset measured on CPU: each distinct model, not the first only
    frames: int | None = None  # frames per measured crop (the preset's; a CUDA preset on CPU: what fits cpu_budget_s)
    cpu_budget_s: float = CPU_BUDGET_S  # a CUDA preset on CPU: seconds one measured micro-batch may take

    @classmethod
    def from_namespace(cls, args, threads: int | None) -> "Options":
        """The options of a parsed `amlm preflight` command line: each field from the argument of its
        name; an argument left out (None) keeps the field's default."""
        given = {
            f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if getattr(args, f.name, None) is not None
        }
        return cls(**{**given, "threads": threads})


@dataclass(frozen=True)
class Hardware:
    """Where the preset is measured, and the machines the figure is projected on."""

    device: torch.device
    label: str  # the CUDA device's name, or "cpu"
    note: str | None  # why the device is not the preset's, when it is not
    substitute: bool  # a CUDA preset measured on CPU: CPU times, the GPU cost projected from counted FLOPs
    precision: str  # --precision, else train.precision: the run's, projected and (on its device) measured
    measure_precision: str  # what is measured: the precision, or float32 in place of the preset's GPU
    peak: float | None  # the device's peak TFLOP/s for MFU (None: unknown)
    nodes: int  # the figure's machines
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def run(cfg: C.Config, config_path: str | Path, out_dir: Path = Path("results"), options: Options = Options()) -> dict:
    """Measure every arm of the preset; write preflight.json and preflight.md into out_dir.

    A preset for CUDA measured on CPU (no CUDA device, or --device cpu) answers in well under a
    minute (issue 32: the paper preset's fp16 micro-batch took minutes on a CPU). It measures a bounded
    float32 step (one crop of as many frames as fit `options.cpu_budget_s`, the model cut to CUT_LAYERS
    blocks, one update, no warm-up: plumbing, a finite loss, and the activations autograd saves, counted),
    reports its times as CPU times and gives no hours from them. The GPU cost is projected from the
    counted FLOPs at a share of the peaks of PROJECTION_GPUS (`options.utilisation` when given, else the MFU
    a GPU measured for this shape, `preflight.measured`, else the assumed DEFAULT_UTILISATION), with the
    gradient all-reduce at the interconnect bandwidths given; the GPU memory from the counted parameters and activations
    (`project.gpu_memory_projection`). Only the first arm's model is measured then (`every_model`: each
    distinct one).

    A CUDA preset whose `train.processes` exceed the GPUs here measures one process's micro-batch on one
    GPU and projects the preset's node (the all-reduce at the bandwidths given), unless --gpus-per-node
    says otherwise.
    """
    t0 = cfg.train  # the `train:` section, the same for every arm
    _check_projection_options(options)
    device, note = _device(t0, config_path, options)
    substitute = t0.device == "cuda" and device.type == "cpu"  # CPU times say nothing of the GPU's
    options = _with_measurement_defaults(options, substitute)
    hw = _hardware(t0, device, note, substitute, options)
    plan = _plan(cfg, t0, hw, options)
    setup = _Setup(cfg, config_path, hw, plan, MemoryProbe(device))
    groups = _model_groups(cfg, substitute, options.every_model)
    measured = _measure_models(setup, groups)
    arms = [_arm(cfg, name, measured[name], t0, hw, options) for name in cfg.runs]  # the configuration's order
    point_groups = _point_model_groups(cfg)  # a sweep's points whose models no arm has (deeper, wider)
    sweep_models = _sweep_models(_measure_models(setup, point_groups), point_groups) if point_groups else []
    slots = hw.gpus // t0.world  # runs at once on the figure's GPUs
    projection = None
    if substitute:
        projection = gpu_projection(
            cfg,
            arms,
            hw.precision,
            options.utilisation,
            t0.world,
            t0.nodes,
            slots,
            options.intra_node_gb_s,
            options.inter_node_gb_s,
        )
    result = {
        **_measured_on(setup, options),
        "arms": arms,
        "figure": _figure(arms, t0, hw, slots),
        "gpu_projection": projection,
        "sweep_projection": sweep_projection(
            cfg, options.utilisation, options.intra_node_gb_s, options.inter_node_gb_s
        ),
        "disk": disk_estimate(cfg, arms[0]["params"], arms, slots, options.corpus_hours),
        "data": data_costs(cfg, os.cpu_count() or 1, options.corpus_hours),
        "sweep_models": sweep_models,
    }
    out_dir = Path(out_dir)
    _write(result, out_dir)
    log_summary(result, out_dir)
    return result


# ----------------------------------------------------------------------------- options, device, plan


def _check_projection_options(options: Options) -> None:
    """The utilisation is a share of the peak; the bandwidths are positive."""
    for name, value, low in (
        ("--utilisation", DEFAULT_UTILISATION if options.utilisation is None else options.utilisation, 1e-9),
        ("--intra-node-gb-s", options.intra_node_gb_s, 1e-9),
        ("--inter-node-gb-s", options.inter_node_gb_s, 1e-9),
    ):
        if not value >= low:
            raise UserError(f"preflight: {name} must be above 0, got {value}")
    if options.utilisation is not None and options.utilisation > 1:
        raise UserError(f"preflight: --utilisation is a share of the peak, at most 1, got {options.utilisation}")


def _device(t0: C.TrainSection, config_path: str | Path, options: Options) -> tuple[torch.device, str | None]:
    """The device measured on (--device, else train.device; a CUDA preset without a CUDA device is
    measured on CPU) and a note when it is not the preset's. Sets torch's CPU threads."""
    wanted = options.device or t0.device
    note = None
    if options.device is None and wanted == "cuda" and not torch.cuda.is_available():  # the preset's, not asked for
        wanted = "cpu"
        note = (
            f"{config_path} sets train.device cuda but torch sees no CUDA device: a bounded float32 step "
            "measured on CPU (plumbing and the activations' bytes; the times are CPU times), the GPU time "
            "projected from counted FLOPs and the GPU memory from counted parameters and activations"
        )
    if options.device == "cpu" and t0.device == "cuda":
        note = (
            f"{config_path} sets train.device cuda, measured on CPU as asked: a bounded float32 step "
            "(plumbing and the activations' bytes; the times are CPU times), the GPU time projected from "
            "counted FLOPs and the GPU memory from counted parameters and activations"
        )
        log.warning("preflight: %s", note)
    threads = options.threads if options.threads is not None else t0.threads
    if t0.device == "cuda" and wanted == "cpu" and hasattr(os, "sched_getaffinity"):
        threads = min(threads, len(os.sched_getaffinity(0)))  # a GPU preset's threads feed loaders, not this CPU
    set_threads(threads)
    return pick_device(wanted, key="train.device" if options.device is None else "--device"), note


def _with_measurement_defaults(options: Options, substitute: bool) -> Options:
    """The options with the measurement counts' defaults filled in, checked. In place of the preset's
    GPU (`substitute`), one small micro-batch by default: seconds, not minutes."""
    defaults = (
        dict(micro_batches=1, optimizer_steps=1, warmup=0, full_update=False)
        if substitute
        else dict(micro_batches=4, optimizer_steps=2, warmup=1, full_update=True)
    )
    options = dataclasses.replace(options, **{k: v for k, v in defaults.items() if getattr(options, k) is None})
    for name, value, low in (
        ("--micro-batches", options.micro_batches, 1),
        ("--optimizer-steps", options.optimizer_steps, 1),
        ("--warmup", options.warmup, 0),
        ("--nodes", 1 if options.nodes is None else options.nodes, 1),
    ):
        if value < low:
            raise UserError(f"preflight: {name} must be at least {low}, got {value}")
    if options.optimizer_steps > options.micro_batches:
        raise UserError(
            f"preflight: --optimizer-steps ({options.optimizer_steps}) cannot exceed --micro-batches "
            f"({options.micro_batches})"
        )
    return options


def _hardware(
    t0: C.TrainSection, device: torch.device, note: str | None, substitute: bool, options: Options
) -> Hardware:
    """The device's name and peak, and the machines of the projection: by default the GPUs here (on
    CPU the preset's processes) on the preset's run's nodes."""
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    precision = options.precision or t0.precision
    peak = options.peak_tflops
    if peak is None and device.type == "cuda":
        peak = peak_tflops(label, precision)
    gpus_per_node = options.gpus_per_node
    if gpus_per_node is None:  # the GPUs here; on CPU, the preset's: the projection is for its hardware
        gpus_per_node = torch.cuda.device_count() if device.type == "cuda" else t0.processes
        if t0.processes > gpus_per_node:  # fewer GPUs here than one run's node: measure one, project the node
            node = (
                f"this machine has {gpus_per_node} GPU(s), one run takes {t0.processes} per node: one process's "
                f"micro-batch measured here, the preset's node of {t0.processes} GPUs projected (the gradient "
                "all-reduce from its bytes at the bandwidths given)"
            )
            log.info("preflight: %s", node)
            note = node if note is None else f"{note}; {node}"
            gpus_per_node = t0.processes
    if t0.processes > gpus_per_node:
        raise UserError(
            f"preflight: train.processes ({t0.processes}) exceeds --gpus-per-node ({gpus_per_node}); "
            "one run's processes on a node need a GPU each"
        )
    nodes = t0.nodes if options.nodes is None else options.nodes  # the figure's machines: by default the run's own
    measure_precision = FP32 if substitute else precision  # a half model's CPU kernels take minutes
    return Hardware(device, label, note, substitute, precision, measure_precision, peak, nodes, gpus_per_node)


def _plan(cfg: C.Config, t0: C.TrainSection, hw: Hardware, options: Options) -> Plan:
    """What to run per model: the micro-batch (--micro-batch, else the preset's share of a process;
    one crop in place of the preset's GPU), which must divide a process's crops per update. In place of
    the preset's GPU: the model cut to CUT_LAYERS blocks, as many frames as fit the CPU budget (this CPU's
    matmul rate measured first), the activations counted."""
    processes = t0.world  # DDP processes of one run: train.nodes x train.processes
    mb = options.micro_batch
    if mb is None:
        mb = 1 if hw.substitute else t0.batch_size // processes
    if mb < 1:
        raise UserError(f"preflight: --micro-batch must be at least 1, got {mb}")
    micro_batches_per_update(t0.batch_size, t0.accum_steps, processes, mb)  # refuses a micro-batch that does not divide
    frames = options.frames
    if frames is not None and not 1 <= frames <= cfg.crop_frames:
        raise UserError(f"preflight: frames must be between 1 and the preset's {cfg.crop_frames}, got {frames}")
    if not hw.substitute:
        return Plan(mb, options.micro_batches, options.optimizer_steps, options.warmup, options.full_update, frames)
    m = cfg.model_for(next(iter(cfg.runs)))
    cut = dataclasses.replace(m, layers=min(m.layers, CUT_LAYERS))
    if frames is None:
        gflops = cpu_matmul_gflops()
        frames = bounded_frames(cut, cfg.crop_frames, mb, gflops, options.cpu_budget_s)
        log.info(
            "preflight: this CPU multiplies float32 matrices at %.0f GFLOP/s: a float32 step of %d of %d blocks "
            "at %d of %d frames fits %.0f s",
            gflops,
            cut.layers,
            m.layers,
            frames,
            cfg.crop_frames,
            options.cpu_budget_s,
        )
    return Plan(
        mb,
        options.micro_batches,
        options.optimizer_steps,
        options.warmup,
        options.full_update,
        frames,
        cut_layers=CUT_LAYERS,
        count_activations=True,
    )


# ----------------------------------------------------------------------------- measuring, per model


def _model_groups(cfg: C.Config, substitute: bool, every_model: bool) -> dict:
    """The arms by model: arms whose models are identical cost the same, so each model is measured
    once. In place of the preset's GPU, only the first arm's model unless `every_model`."""
    groups: dict = {}
    for run_name in cfg.runs:
        groups.setdefault(cfg.model_for(run_name), []).append(run_name)
    if substitute and not every_model:  # plumbing and memory of one model; the projection counts each arm's FLOPs
        groups = {"all": list(cfg.runs)}
    return groups


def _point_model_groups(cfg: C.Config) -> dict:
    """A sweep's points by model, for the models no arm of the file has (a point's deeper or wider model):
    each measured once, as the arms' are, so that a point that cannot fit is found before it is queued."""
    base = {cfg.model_for(name) for name in cfg.runs}
    groups: dict = {}
    for name in cfg.points:
        m = cfg.model_for(name)
        if m not in base:
            groups.setdefault(m, []).append(name)
    return groups


def _sweep_models(measured: dict[str, dict], groups: dict) -> list[dict]:
    """One row per measured point model: its points, its size, and whether it fits (as an arm's row says)."""
    rows = []
    for m, names in groups.items():
        res = measured[names[0]]
        rows.append(
            {
                "points": names,
                "measured_as": names[0],
                "layers": m.layers,
                "dim": m.dim,
                "norm": m.norm,
                "attention": m.attention,
                "params": res["params"],
                "fits": res.get("fits"),
                "fits_at_micro_batch": res.get("fits_at_micro_batch"),
                "suggested_micro_batch": res.get("suggested_micro_batch"),
                "peak_memory_gb": res.get("peak_memory_gb"),
                "gpu_memory_gb": (res.get("gpu_memory") or {}).get("total_gb"),
            }
        )
    return rows


@dataclass(frozen=True)
class _Setup:
    """What every measurement of one preflight shares: the preset, where it is measured and how."""

    cfg: C.Config
    config_path: str | Path
    hw: Hardware
    plan: Plan
    probe: MemoryProbe


def _measure_models(setup: _Setup, groups: dict) -> dict[str, dict]:
    """Each group's first arm measured (on CUDA at the largest micro-batch that fits) with whether the
    preset fits; {arm: its group's measurement, `measured_as` the arm measured}."""
    cfg, hw, plan, probe, t0 = setup.cfg, setup.hw, setup.plan, setup.probe, setup.cfg.train
    frames = cfg.crop_frames
    crops_per_process = t0.crops_per_update // t0.world
    units = len(groups) * (plan.warmup + plan.micro_batches + plan.optimizer_steps)
    log.info(
        "preflight %s on %s (%s): %d models, micro-batch %d of %d frames",
        setup.config_path,
        hw.label,
        hw.measure_precision,
        len(groups),
        plan.micro_batch,
        plan.frames or frames,
    )
    measured: dict[str, dict] = {}
    with Progress(units, "preflight", unit="step") as bar:
        for names in groups.values():
            m, t = cfg.model_for(names[0]), cfg.train_for(names[0])
            avail = probe.available()
            if hw.device.type == "cuda":
                res, used_mb, no_fit = fit_cuda(
                    m, t, hw.device, hw.precision, frames, plan, crops_per_process, probe, bar
                )
            else:
                res = measure_arm(
                    m,
                    t,
                    hw.device,
                    hw.measure_precision,
                    frames,
                    plan,
                    crops_per_process // plan.micro_batch,
                    probe,
                    bar,
                )
                used_mb, no_fit = plan.micro_batch, []
            res.update(
                measured_micro_batch=used_mb, available_memory_gb=avail / GB, did_not_fit=no_fit, gpu_memory=None
            )
            if hw.substitute:
                res.update(_projected_fit(m, res, hw, t0, frames, crops_per_process))
            else:
                res.update(
                    fit_summary(res, hw.device, t0.batch_size // t0.world, crops_per_process, avail, hw.precision)
                )
            for name in names:
                measured[name] = {**res, "measured_as": names[0]}
            bar.update(0, model=names[0])
    return measured


def _projected_fit(
    m: C.ModelConfig, res: dict, hw: Hardware, t0: C.TrainSection, frames: int, crops_per_process: int
) -> dict:
    """In place of the preset's GPU: the whole model's counted parameters and gradient bytes, its GPU memory
    projected from counted parameters and activations, and whether the preset's micro-batch fits an 80 GB GPU."""
    params = full_params(m)
    preset_micro = t0.batch_size // t0.world
    per_crop = res["activation_bytes_counted"] / res["measured_micro_batch"]
    mem = gpu_memory_projection(params, hw.precision, per_crop, preset_micro, res["measured_frames"], frames)
    eighty = next(g for g in mem["gpus"] if g["memory_gb"] == 80.0)
    fits = eighty["fits"]
    best = (
        preset_micro
        if fits
        else suggest_micro_batch(crops_per_process, min(eighty["max_micro_batch"] or 0, crops_per_process))
    )
    return {
        "params": params,  # the whole model's (the measured cut's: measured_params)
        "grad_bytes": params * traits(hw.precision).weight_bytes,
        "gpu_memory": mem,
        "fits": fits,
        "fits_at_micro_batch": preset_micro,
        "max_micro_batch": eighty["max_micro_batch"],
        "max_micro_batch_method": "projected from counted parameters and activations on an 80 GB GPU",
        "suggested_micro_batch": best,
        "suggested_accum_steps": crops_per_process // best if best else None,
    }


# ----------------------------------------------------------------------------- arms, figure, files


def _arm(cfg: C.Config, name: str, res: dict, t0: C.TrainSection, hw: Hardware, options: Options) -> dict:
    """One arm's row: its update (measured whole, else projected from its parts) plus the exposed
    all-reduce, its throughput and MFU, and its hours unless its times are CPU times for a GPU preset."""
    rc, processes = cfg.run(name), t0.world
    frames = res["measured_frames"]  # the preset's crop, or the bounded one measured in place of its GPU
    crops_per_process = t0.crops_per_update // processes
    n_micro = crops_per_process // res["measured_micro_batch"]
    compute_ms = res["ms_per_update_measured"] or res["ms_per_update_projected"]
    comm = allreduce_ms(res["grad_bytes"], processes, t0.nodes, options.intra_node_gb_s, options.inter_node_gb_s)
    update_ms, exposed, bound = with_communication(compute_ms, res["ms_per_micro_batch"], comm)
    measured_model = dataclasses.replace(cfg.model_for(name), layers=res["measured_layers"])
    flops = n_micro * step_flops(measured_model, res["measured_micro_batch"], frames)
    tflops = flops / (compute_ms / 1000) / 1e12
    hours = None if hw.substitute else wall_hours(t0.steps, update_ms, len(rc.seeds))
    return {
        "run": name,
        "label": rc.label,
        "seeds": len(rc.seeds),
        "steps": t0.steps,
        **res,
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
        "mfu": tflops / hw.peak if hw.peak else None,
        "hours_per_seed": None if hw.substitute else wall_hours(t0.steps, update_ms),
        "hours": hours,
        "gpu_hours": None if hw.substitute else hours * processes,
    }


def _figure(arms: list[dict], t0: C.TrainSection, hw: Hardware, slots: int) -> dict:
    """The whole figure: every arm's job on the figure's GPUs, `slots` at once, longest first."""
    return {
        "arms": len(arms),
        "jobs": len(arms),
        "seeds": sum(a["seeds"] for a in arms),
        "steps": t0.steps,
        "processes": t0.world,
        "nodes": hw.nodes,
        "gpus_per_node": hw.gpus_per_node,
        "gpus": hw.gpus,
        "concurrent_jobs": min(slots, len(arms)),
        "wall_hours": None if hw.substitute else figure_wall_hours([a["hours"] for a in arms], slots),
        "gpu_hours": None if hw.substitute else sum(a["gpu_hours"] for a in arms),
    }


def _measured_on(setup: _Setup, options: Options) -> dict:
    """preflight.json's head: what was measured, where and how."""
    cfg, hw, plan, t0 = setup.cfg, setup.hw, setup.plan, setup.cfg.train
    return {
        "config": str(setup.config_path),
        "device": hw.label,
        "device_type": hw.device.type,
        "preset_device": t0.device,
        "device_note": hw.note,
        "cpu_times": hw.device.type == "cpu",
        "precision": hw.precision,
        "measured_precision": hw.measure_precision,
        "preset_precision": t0.precision,
        "compile": t0.compile,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "peak_tflops": hw.peak,
        "memory_kind": setup.probe.kind,
        "crop_frames": cfg.crop_frames,
        "batch_size": t0.batch_size,
        "accum_steps": t0.accum_steps,
        "global_batch": t0.batch_size * t0.accum_steps,
        "preset_micro_batch": t0.batch_size // t0.world,
        "micro_batch": plan.micro_batch,
        "measured_frames": plan.frames or cfg.crop_frames,
        "measured_layers": (
            None if plan.cut_layers is None else min(cfg.model_for(next(iter(cfg.runs))).layers, plan.cut_layers)
        ),
        "measurement": _what_was_measured(cfg, t0, hw, plan),
        "micro_batches_measured": plan.micro_batches,
        "optimizer_steps_measured": plan.optimizer_steps,
        "warmup_updates": plan.warmup,
        "interconnect": {
            "intra_node_gb_s": options.intra_node_gb_s,
            "inter_node_gb_s": options.inter_node_gb_s,
            "link": "none (one process)"
            if t0.world == 1
            else ("NVLink, within one node" if t0.nodes == 1 else "InfiniBand, across nodes"),
        },
    }


def _what_was_measured(cfg: C.Config, t0: C.TrainSection, hw: Hardware, plan: Plan) -> str:
    """One sentence: what this preflight measured, and what it projected."""
    frames, preset = plan.frames or cfg.crop_frames, cfg.crop_frames
    if not hw.substitute:
        return (
            f"measured on {hw.label}: the preset's step ({hw.precision}) at micro-batch {plan.micro_batch} of "
            f"{frames} frames; the update, arm and figure times projected from it"
        )
    layers = cfg.model_for(next(iter(cfg.runs))).layers
    return (
        f"measured on this CPU, a bounded check, not the preset's step: float32 (the preset: {hw.precision}), the "
        f"model cut to {min(layers, plan.cut_layers)} of its {layers} blocks, micro-batch {plan.micro_batch} of "
        f"{frames} of the preset's {preset} frames, {plan.micro_batches} micro-batch(es) and "
        f"{plan.optimizer_steps} optimizer step(s): plumbing, a finite loss and the bytes autograd saves; "
        "projected: the GPU time from counted FLOPs at the stated utilisation, the GPU memory from counted "
        "parameters and activations"
    )


def _write(result: dict, out_dir: Path) -> None:
    """preflight.json and preflight.md, each written atomically."""
    write_json(out_dir / "preflight.json", result)
    with atomic_path(out_dir / "preflight.md") as tmp:
        tmp.write_text(markdown(result))
