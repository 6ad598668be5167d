"""preflight.md: preflight.json as a readable page."""

from __future__ import annotations

from acoustic_mlm.preflight.data_costs import lines as data_lines
from acoustic_mlm.preflight.log_summary import number, share
from acoustic_mlm.preflight.project import GB
from acoustic_mlm.train.state import KEEP_STATES


def _yes_no(x) -> str:
    return "not tried" if x is None else ("yes" if x else "no")


def _num(x, fmt: str = ".3g") -> str:
    return "n/a" if x is None else format(x, fmt)


def _header(r: dict) -> list[str]:
    """The title, what was measured and how, and the weights measured."""
    measured_frames = r.get("measured_frames", r["crop_frames"])
    cut = f", the model cut to {r['measured_layers']} blocks" if r.get("measured_layers") else ""
    lines = [
        f"# Preflight: {r['config']}",
        "",
        f"Measured on **{r['device']}** ({r.get('measured_precision', r['precision'])}, torch {r['torch']}, "
        f"{r['threads']} CPU threads){cut}, micro-batch {r['micro_batch']} of {measured_frames} frames (the "
        f"preset's crop: {r['crop_frames']}); {r['micro_batches_measured']} timed "
        f"micro-batches, {r['optimizer_steps_measured']} optimizer steps and {r['warmup_updates']} warm-up "
        "update(s) per model, on synthetic inputs, stepped by `train.update` as `amlm train` steps them.",
        "",
    ]
    if r.get("measurement"):
        lines += [f"What was measured and what was projected: {r['measurement']}.", ""]
    if r["device_note"]:
        lines += [f"Note: {r['device_note']}.", ""]
    a0 = r["arms"][0]
    scale = (
        f"; loss scale {a0['loss_scale']:g} after {a0['updates_run']} update(s) ({a0['overflow_updates']} overflowed)"
        if a0["loss_scale"] is not None
        else ""
    )
    masters = f", {a0['master_dtype']} master weights" if a0["master_dtype"] else ""
    lines += [f"Weights measured: {a0['param_dtype']}{masters}{scale}.", ""]
    return lines


def _arms(r: dict, kind: str) -> list[str]:
    """One row per arm: measured (and projected) on this device, or its CPU times beside projected GPU memory."""
    lines = []
    if r["gpu_projection"] is None:
        lines += [
            "| arm | ms/update | from | all-reduce ms | bound | frames/s | TFLOP/s | MFU | peak memory (GB) | fits | "
            f"micro-batch x accum | hours | {kind}-hours |",
            "|---|---:|---|---:|---|---:|---:|---:|---:|---|---|---:|---:|",
        ]
    else:
        lines += [
            "| arm | CPU ms per micro-batch (measured) | peak memory here (GB) | projected GPU memory (GB) | fits "
            "80 GB (projected) | micro-batch x accum |",
            "|---|---:|---:|---:|---|---|",
        ]
    for a in r["arms"]:
        mfu = "n/a" if a["mfu"] is None else f"{100 * a['mfu']:.1f}%"
        suggestion = (
            f"{a['suggested_micro_batch']} x {a['suggested_accum_steps']}"
            if a["suggested_micro_batch"]
            else "none fits"
        )
        if r["gpu_projection"] is None:
            lines.append(
                f"| {a['run']} | {a['ms_per_update']:.1f} | {a['update_source']} | {a['exposed_allreduce_ms']:.1f} "
                f"of {a['allreduce_ms']:.1f} | {a['bound']} | {a['frames_per_s']:.0f} | "
                f"{a['tflops']:.3g} | {mfu} | {a['peak_memory_gb']:.2f} | {_yes_no(a['fits'])} | "
                f"{suggestion} | {a['hours']:.2f} | {a['gpu_hours']:.2f} |"
            )
        else:
            mem = a.get("gpu_memory") or {}
            lines.append(
                f"| {a['run']} | {a['ms_per_micro_batch']:.1f} | {a['peak_memory_gb']:.2f} | "
                f"{_num(mem.get('total_gb'), '.1f')} | {_yes_no(a['fits'])} | {suggestion} |"
            )
    return lines


def _allreduce(r: dict) -> list[str]:
    """The gradient all-reduce: bytes per update, links, how it is projected."""
    a0 = r["arms"][0]
    lines = []
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
    return lines


def _gpu_memory(r: dict) -> list[str]:
    """The projected GPU memory per process, per named GPU (when projected)."""
    lines = []
    mem = r["arms"][0].get("gpu_memory")
    if mem:
        lines += [
            f"**GPU memory per process** (a projection, not a measurement: {mem['method']}): "
            f"{mem['params']:,} parameters x {mem['bytes_per_param']} bytes = {mem['static_gb']:.1f} GB, plus "
            f"{mem['activation_gb_per_crop']:.2f} GB of activations per crop of {mem['preset_frames']} frames "
            f"(counted at {mem['counted_frames']}) x micro-batch {mem['micro_batch']}: **{mem['total_gb']:.1f} GB**.",
            "",
            "| GPU | memory (GB) | the preset's micro-batch fits | largest micro-batch |",
            "|---|---:|---|---:|",
        ]
        for g in mem["gpus"]:
            lines.append(
                f"| {g['gpu']} | {g['memory_gb']:g} | {_yes_no(g['fits'])} | {_num(g['max_micro_batch'], 'd')} |"
            )
        lines.append("")
    return lines


def _figure(r: dict, kind: str) -> list[str]:
    """The projection on named GPUs (when the preset's GPU is not here), and the whole figure's hours."""
    f = r["figure"]
    lines = []
    if r["gpu_projection"] is not None:
        lines += [
            "**Projection on GPUs** (not a measurement: counted FLOPs, `acoustic_mlm.preflight.flops.step_flops`, at "
            f"a share of each GPU's dense {r['precision']} peak, measured where a GPU measured this shape "
            "(`acoustic_mlm.preflight.measured`), else assumed, plus the exposed all-reduce; no hours are taken from "
            "the CPU times above):",
            "",
            "| GPU | peak TFLOP/s | share of the peak | ms/update | all-reduce ms | bound | the figure: wall hours | "
            "GPU-hours |",
            "|---|---:|---|---:|---:|---|---:|---:|",
        ]
        for g in r["gpu_projection"]:
            a = g["arms"][0]
            lines.append(
                f"| {g['gpu']} | {g['peak_tflops']:g} | {share(g)} | {a['ms_per_update']:.1f} | "
                f"{a['allreduce_ms']:.1f} | {a['bound']} | {g['wall_hours']:.1f} | {number(g['gpu_hours'])} |"
            )
        lines += [
            "",
            f"**The figure**: {f['arms']} arms x {f['steps']:,} steps ({f['seeds']} seed runs), "
            f"{f['processes']} process(es) per run, {f['nodes']} node(s) x {f['gpus_per_node']} GPU(s), "
            f"{f['concurrent_jobs']} job(s) at once (hours: the projection above).",
        ]
    else:
        lines += [
            f"**The figure**: {f['arms']} arms x {f['steps']:,} steps ({f['seeds']} seed runs), {f['processes']} "
            f"process(es) per run, {f['nodes']} node(s) x {f['gpus_per_node']} GPU(s), {f['concurrent_jobs']} job(s) "
            f"at once: **{f['wall_hours']:.1f} h** wall, {f['gpu_hours']:.1f} {kind}-hours.",
        ]
    return lines


def _sweep(r: dict) -> list[str]:
    """The sweep's projection and its own models, when there is a sweep."""
    lines = []
    if r.get("sweep_projection"):
        sw = r["sweep_projection"]
        lines += [
            "",
            f"**The sweep** (a projection from counted FLOPs, not a measurement): {sw['points']} points, "
            f"{sw['runs']} runs one after another on one GPU, each at a share of its own precision's peak, "
            "training updates only:",
            "",
            "| GPU | GPU-hours for the map | share of the peak | by panel |",
            "| --- | --- | --- | --- |",
        ]
        for g in sw["gpus"]:
            by = ", ".join(f"{k}: {v:.2f}" for k, v in g["panels"].items())
            lines.append(f"| {g['gpu']} | {g['gpu_hours']:.2f} | {share(g)} | {by} |")
    if r.get("sweep_models"):
        lines += [
            "",
            "**The sweep's own models** (points whose model no arm has), measured as the arms are:",
            "",
            "| model | points | parameters | fits at the preset's micro-batch | suggested micro-batch | memory (GB) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for sm in r["sweep_models"]:
            fits = "-" if sm["fits"] is None else ("yes" if sm["fits"] else "**no**")
            memory = sm["gpu_memory_gb"] if sm["gpu_memory_gb"] is not None else sm["peak_memory_gb"]
            lines.append(
                f"| {sm['layers']} layers x {sm['dim']}, {sm['norm']}, {sm['attention']} | {len(sm['points'])} "
                f"(e.g. {sm['measured_as']}) | {sm['params']:,} | {fits} | {sm['suggested_micro_batch'] or '-'} "
                f"| {_num(memory)} |"
            )
    return lines


def _disk_and_method(r: dict) -> list[str]:
    """The disk a preset takes, the data side's costs, and how the numbers were computed."""
    d = r["disk"]
    lines = []
    lines += [
        "",
        f"**Disk**: audio {_num(d['audio_gb'])} GB ({d.get('sample_format', 'float32')}, 24 kHz), "
        f"codes {_num(d['codes_gb'])} GB "
        f"(int16, {d['codebooks_stored']} x 75 Hz), checkpoints {d['checkpoints_gb']:.3g} GB "
        f"({d['checkpoint_gb_per_seed']:.3g} GB per seed; resumable states of {d['state_gb_per_file']:.3g} GB, "
        f"the last {KEEP_STATES} per running job); total {_num(d['total_gb'])} GB."
        + (f" {d['corpus_note']}." if d["corpus_note"] else ""),
        "",
        *(data_lines(r["data"]) + [""] if r.get("data") else []),
        "How: ms/update = micro-batches per update and process x median ms per micro-batch (forward, backward) + "
        "median ms per step (the once-per-update finite check, clipping, AdamW) + the exposed all-reduce; when that "
        "is under a minute one whole update is run and its time used ('measured'). Wall time = seeds x steps x "
        "ms/update; GPU-hours = wall x processes; the figure's jobs share the GPUs longest first. Model FLOPs: "
        f"acoustic_mlm.preflight.flops.step_flops. Memory: {r['memory_kind']}.",
        "",
    ]
    return lines


def markdown(r: dict) -> str:
    """preflight.json as a readable page."""
    kind = "CPU" if r["cpu_times"] else "GPU"
    lines = [
        *_header(r),
        *_arms(r, kind),
        *_allreduce(r),
        *_gpu_memory(r),
        *_figure(r, kind),
        *_sweep(r),
        *_disk_and_method(r),
    ]
    return "\n".join(lines)
