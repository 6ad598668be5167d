"""preflight.md: a hand-made preflight.json as a page, measured on a CPU and projected onto GPUs."""

from __future__ import annotations

import copy

import pytest

from acoustic_mlm.preflight.report import markdown


def _arm(run: str, ms: float, fits: bool) -> dict:
    return {
        "run": run,
        "ms_per_update": ms,
        "ms_per_micro_batch": ms / 2,
        "update_source": "measured",
        "exposed_allreduce_ms": 0.0,
        "allreduce_ms": 0.0,
        "allreduce_bytes": 0,
        "bound": "compute",
        "frames_per_s": 1234.4,
        "tflops": 0.0123,
        "mfu": None,
        "peak_memory_gb": 1.5,
        "fits": fits,
        "suggested_micro_batch": 8 if fits else None,
        "suggested_accum_steps": 1,
        "hours": 0.25,
        "gpu_hours": 0.25,
        "param_dtype": "float32",
        "master_dtype": None,
        "loss_scale": None,
        "updates_run": 3,
        "overflow_updates": 0,
    }


@pytest.fixture()
def measured() -> dict:
    """Two arms measured on a CPU: no projection, no sweep."""
    return {
        "config": "config/smoke.yaml",
        "device": "cpu",
        "precision": "fp32",
        "torch": "2.5.1",
        "threads": 2,
        "micro_batch": 8,
        "crop_frames": 150,
        "micro_batches_measured": 2,
        "optimizer_steps_measured": 1,
        "warmup_updates": 1,
        "device_note": None,
        "cpu_times": True,
        "memory_kind": "peak RSS",
        "arms": [_arm("prenorm_clip10", 52.24, True), _arm("prenorm_clip1", 61.0, False)],
        "interconnect": {"link": "NVLink", "intra_node_gb_s": 900.0, "inter_node_gb_s": 50.0},
        "gpu_projection": None,
        "sweep_projection": None,
        "figure": {
            "arms": 2,
            "steps": 1200,
            "seeds": 2,
            "processes": 1,
            "nodes": 1,
            "gpus_per_node": 0,
            "concurrent_jobs": 1,
            "wall_hours": 0.5,
            "gpu_hours": 0.5,
        },
        "disk": {
            "audio_gb": 0.0123,
            "codes_gb": None,
            "codebooks_stored": 8,
            "checkpoints_gb": 0.004,
            "checkpoint_gb_per_seed": 0.001,
            "state_gb_per_file": 0.003,
            "total_gb": None,
            "corpus_note": None,
        },
    }


def test_a_cpu_measurement_is_a_table_of_arms_the_figures_hours_and_the_disk(measured):
    md = markdown(measured)
    assert md.startswith("# Preflight: config/smoke.yaml\n")
    assert "Measured on **cpu** (fp32, torch 2.5.1, 2 CPU threads), micro-batch 8 of 150 frames" in md
    assert "Weights measured: float32." in md and "GPU memory per process" not in md
    assert "Note:" not in md and "Projection on GPUs" not in md
    assert "| CPU-hours |" in md
    assert (
        "| prenorm_clip10 | 52.2 | measured | 0.0 of 0.0 | compute | 1234 | 0.0123 | n/a | 1.50 | yes | 8 x 1 |" in md
    )
    assert "| prenorm_clip1 | 61.0 |" in md and "| no | none fits |" in md
    assert "**The figure**: 2 arms x 1,200 steps (2 seed runs)" in md and "**0.5 h** wall, 0.5 CPU-hours" in md
    assert "**Disk**: audio 0.0123 GB (float32, 24 kHz), codes n/a GB" in md and "total n/a GB." in md
    assert "the last 2 per running job" in md and "Memory: peak RSS." in md


def test_fp16_a_note_and_a_gpu_projection_with_a_sweep(measured):
    r = copy.deepcopy(measured)
    r["device_note"] = "no GPU here: CPU times stand in"
    for a in r["arms"]:
        a.update(param_dtype="float16", master_dtype="float32", loss_scale=128.0)
    r.update(
        measured_precision="fp32",
        measured_frames=40,
        measured_layers=2,
        measurement="measured on this CPU, a bounded check, not the preset's step",
    )
    r["arms"][0]["gpu_memory"] = {
        "method": "counted",
        "params": 1_000_000,
        "bytes_per_param": 20,
        "static_gb": 0.02,
        "activation_gb_per_crop": 0.5,
        "preset_frames": 150,
        "counted_frames": 40,
        "micro_batch": 8,
        "total_gb": 4.02,
        "gpus": [{"gpu": "H200 (141 GB)", "memory_gb": 141.0, "fits": True, "max_micro_batch": 281}],
    }
    r["gpu_projection"] = [
        {
            "gpu": "H200",
            "peak_tflops": 989.0,
            "utilisation": 0.4,
            "wall_hours": 12.34,
            "gpu_hours": 98.7,
            "arms": [{"ms_per_update": 210.0, "allreduce_ms": 3.5, "bound": "compute"}],
        }
    ]
    r["sweep_projection"] = {
        "points": 9,
        "runs": 18,
        "gpus": [{"gpu": "H200", "utilisation": 0.4, "gpu_hours": 1.5, "panels": {"lr": 1.0, "layers": 0.5}}],
    }
    md = markdown(r)
    assert "Note: no GPU here: CPU times stand in." in md
    assert "Weights measured: float16, float32 master weights; loss scale 128 after 3 update(s) (0 overflowed)." in md
    assert (
        "Measured on **cpu** (fp32, torch 2.5.1, 2 CPU threads), the model cut to 2 blocks, micro-batch 8 of 40 "
        "frames (the preset's crop: 150)" in md
    )
    assert "What was measured and what was projected: measured on this CPU, a bounded check" in md
    assert (
        "| arm | CPU ms per micro-batch (measured) | peak memory here (GB) | projected GPU memory (GB) | fits 80 "
        "GB (projected) | micro-batch x accum |"
    ) in md
    assert "| prenorm_clip10 | 26.1 | 1.50 | 4.0 | yes | 8 x 1 |" in md
    assert "| prenorm_clip1 | 30.5 | 1.50 | n/a | no | none fits |" in md
    assert (
        "**GPU memory per process** (a projection, not a measurement: counted): 1,000,000 parameters x 20 "
        "bytes = 0.0 GB, plus 0.50 GB of activations per crop of 150 frames (counted at 40) x micro-batch 8: "
        "**4.0 GB**." in md
    )
    assert "| H200 (141 GB) | 141 | yes | 281 |" in md
    assert "**Projection on GPUs**" in md and "at a share of each GPU's dense fp32 peak, measured where" in md
    assert "| H200 | 989 | an assumed 40 % of its peak | 210.0 | 3.5 | compute | 12.3 | 98.7 |" in md
    assert "(hours: the projection above)" in md and "CPU-hours" not in md
    assert "**The sweep** (a projection from counted FLOPs, not a measurement): 9 points, 18 runs" in md
    assert "| H200 | 1.50 | an assumed 40 % of its peak | lr: 1.00, layers: 0.50 |" in md
