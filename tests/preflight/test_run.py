"""`amlm preflight`: every field of preflight.json, and numbers that agree with each other."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from acoustic_mlm import cli
from acoustic_mlm.preflight import measure, project
from acoustic_mlm import config as C
from acoustic_mlm.preflight.flops import step_flops

ARM_FIELDS = {
    "run", "label", "seeds", "steps", "params", "measured_as", "warmup_s", "ms_per_micro_batch",
    "ms_per_micro_batch_all", "ms_optimizer_step", "ms_optimizer_step_all", "micro_batches_per_update",
    "ms_per_update_projected", "ms_per_update_measured", "ms_per_update", "update_source", "frames_per_update",
    "frames_per_s", "model_flops_per_update", "tflops", "mfu", "peak_memory_gb", "static_memory_gb",
    "activation_gb_per_micro_batch", "available_memory_gb", "fits", "fits_at_micro_batch", "max_micro_batch",
    "max_micro_batch_method", "suggested_micro_batch", "suggested_accum_steps", "measured_micro_batch",
    "did_not_fit", "hours_per_seed", "hours", "gpu_hours", "losses_finite", "first_loss",
    "ms_per_update_compute", "allreduce_bytes", "allreduce_ms", "exposed_allreduce_ms", "bound", "grad_bytes",
    "param_dtype", "master_dtype", "loss_scale", "scaler_updates", "updates_run", "overflow_updates",
}
FIGURE_FIELDS = {"arms", "jobs", "seeds", "steps", "processes", "nodes", "gpus_per_node", "gpus", "concurrent_jobs",
                 "wall_hours", "gpu_hours"}
DISK_FIELDS = {"corpus_seconds", "corpus_note", "audio_gb", "codes_gb", "codebooks_stored", "checkpoint_gb_per_seed",
               "state_gb_per_file", "checkpoints_gb", "total_gb"}
TOP_FIELDS = {"config", "device", "device_type", "preset_device", "device_note", "precision", "preset_precision",
              "compile", "torch", "threads", "peak_tflops", "memory_kind", "crop_frames", "batch_size", "accum_steps",
              "global_batch", "preset_micro_batch", "micro_batch", "micro_batches_measured",
              "optimizer_steps_measured", "warmup_updates", "arms", "figure", "disk", "cpu_times", "interconnect",
              "gpu_projection", "sweep_projection"}


def check_consistent(r: dict, cfg: dict) -> None:
    """The relations preflight's numbers must satisfy, whatever the machine measured."""
    assert set(r) == TOP_FIELDS
    assert set(r["figure"]) == FIGURE_FIELDS and set(r["disk"]) == DISK_FIELDS
    t = cfg["train"]
    frames = C.crop_frames(cfg)
    world = t["processes"] * t.get("nodes", 1)  # DDP processes of one run
    crops = t["batch_size"] * t["accum_steps"] // world
    assert [a["run"] for a in r["arms"]] == list(cfg["runs"])
    for a in r["arms"]:
        assert set(a) == ARM_FIELDS, set(a) ^ ARM_FIELDS
        mb = a["measured_micro_batch"]
        assert a["micro_batches_per_update"] * mb == crops
        assert a["ms_per_update_projected"] == pytest.approx(
            a["micro_batches_per_update"] * a["ms_per_micro_batch"] + a["ms_optimizer_step"])
        expected = a["ms_per_update_measured"] if a["update_source"] == "measured" else a["ms_per_update_projected"]
        assert a["ms_per_update_compute"] == expected
        assert a["ms_per_update"] == pytest.approx(expected + a["exposed_allreduce_ms"])
        assert (a["allreduce_bytes"] == 0) == (world == 1) and (a["allreduce_ms"] == 0) == (world == 1)
        assert a["updates_run"] == r["warmup_updates"] + r["optimizer_steps_measured"] + (a["update_source"] == "measured")
        seconds = a["ms_per_update"] / 1000
        assert a["frames_per_update"] == crops * frames
        assert a["frames_per_s"] == pytest.approx(crops * frames / seconds)
        m = C.model_config(cfg, a["run"])
        assert a["model_flops_per_update"] == a["micro_batches_per_update"] * step_flops(m, mb, frames)
        assert a["tflops"] == pytest.approx(a["model_flops_per_update"] / (a["ms_per_update_compute"] / 1000) / 1e12)
        assert (a["mfu"] is None) == (r["peak_tflops"] is None)
        if r["gpu_projection"] is not None:  # CPU times in place of the preset's GPU: no hours from them
            assert a["hours_per_seed"] is None and a["hours"] is None and a["gpu_hours"] is None
        else:
            assert a["hours_per_seed"] == pytest.approx(t["steps"] * a["ms_per_update"] / 3.6e6)
            assert a["hours"] == pytest.approx(a["seeds"] * a["hours_per_seed"])
            assert a["gpu_hours"] == pytest.approx(a["hours"] * world)
        assert a["peak_memory_gb"] > 0 and a["activation_gb_per_micro_batch"] >= 0
        assert a["losses_finite"] and math.isfinite(a["first_loss"])
        twin = next(b for b in r["arms"] if b["run"] == a["measured_as"])  # identical models are measured once
        assert twin["ms_per_micro_batch"] == a["ms_per_micro_batch"]
        if a["fits"]:
            assert (a["suggested_micro_batch"], a["suggested_accum_steps"]) == (t["batch_size"] // world,
                                                                                t["accum_steps"])
        elif a["suggested_micro_batch"]:
            assert a["suggested_micro_batch"] * a["suggested_accum_steps"] == crops
    f = r["figure"]
    if r["gpu_projection"] is not None:
        assert f["gpu_hours"] is None and f["wall_hours"] is None
    else:
        assert f["gpu_hours"] == pytest.approx(sum(a["gpu_hours"] for a in r["arms"]))
        if f["concurrent_jobs"] == 1:
            assert f["wall_hours"] == pytest.approx(sum(a["hours"] for a in r["arms"]))
    d = r["disk"]
    seconds = cfg["data"]["synthetic"]["n_clips"] * cfg["data"]["synthetic"]["clip_seconds"]
    assert d["corpus_seconds"] == seconds
    assert d["audio_gb"] == pytest.approx(seconds * 24000 * 4 / 1e9)
    assert d["codes_gb"] == pytest.approx(seconds * 75 * 8 * 2 / 1e9)
    assert d["checkpoint_gb_per_seed"] == pytest.approx(r["arms"][0]["params"] * 4 / 1e9)
    assert d["total_gb"] == pytest.approx(d["audio_gb"] + d["codes_gb"] + d["checkpoints_gb"])


def test_smoke_preset_measures_every_arm_and_writes_consistent_numbers(root, tmp_path, capsys):
    code = cli.main(["preflight", "--config", str(root / "config/smoke.yaml"), "--out", str(tmp_path),
                     "--threads", "1", "--micro-batches", "2", "--optimizer-steps", "1"])
    assert code == 0
    r = json.loads((tmp_path / "preflight.json").read_text())
    cfg = C.load(root / "config/smoke.yaml")
    check_consistent(r, cfg)
    assert r["device"] == "cpu" and r["device_note"] is None and r["micro_batch"] == cfg["train"]["batch_size"]
    assert all(a["update_source"] == "measured" for a in r["arms"])  # a smoke update takes well under a minute
    assert all(a["fits"] for a in r["arms"])
    assert r["arms"][1]["measured_as"] == "prenorm_clip10"  # same model, other clip: measured once
    assert r["figure"]["concurrent_jobs"] == 1
    md = (tmp_path / "preflight.md").read_text()
    assert all(f"| {run} |" in md for run in cfg["runs"]) and "The figure" in md and "Disk" in md
    assert not list(tmp_path.glob(".*tmp*"))  # nothing half-written left behind


def test_smoke_preset_under_fp16_fairseq_steps_a_half_model_with_fp32_master_weights(root, tmp_path):
    """--precision takes fp16_fairseq: preflight steps what `amlm train` steps (train.build_trainer),
    an fp16 model, fp32 master weights and fairseq's loss scaler, and reports the loss scale."""
    code = cli.main(["preflight", "--config", str(root / "config/smoke.yaml"), "--out", str(tmp_path),
                     "--threads", "1", "--micro-batches", "2", "--optimizer-steps", "1", "--precision", "fp16_fairseq"])
    assert code == 0
    r = json.loads((tmp_path / "preflight.json").read_text())
    check_consistent(r, C.load(root / "config/smoke.yaml"))
    assert r["precision"] == "fp16_fairseq" and r["preset_precision"] == "fp32"
    for a in r["arms"]:
        assert (a["param_dtype"], a["master_dtype"]) == ("float16", "float32")
        assert a["grad_bytes"] == 2 * a["params"]  # fp16 gradients
        # warm-up, the timed update and the whole one, each seen by the scaler; 2**7 until 16,384 clean ones
        assert a["scaler_updates"] == a["updates_run"] == 3 and a["overflow_updates"] == 0
        assert a["loss_scale"] == 128.0
    assert "float16, float32 master weights; loss scale 128 after 3 update(s)" in (tmp_path / "preflight.md").read_text()
    fp32 = measure.measure_arm(*_smoke_arm(root), "fp32", 37, measure.Plan(4, 1, 1, 0, False), 1,
                               measure.MemoryProbe(torch.device("cpu")))
    assert (fp32["param_dtype"], fp32["master_dtype"], fp32["loss_scale"]) == ("float32", None, None)


def _smoke_arm(root):
    cfg = C.load(root / "config/smoke.yaml")
    return C.model_config(cfg, "prenorm_clip1"), C.train_config(cfg, "prenorm_clip1"), torch.device("cpu")


@pytest.mark.slow
def test_paper_preset_on_cpu_at_micro_batch_1(root, tmp_path):
    """The paper's 318 M-parameter model on a machine without CUDA, as a user runs it: the preset's
    fp16_fairseq (half model, fp32 master weights, a loss scale), one crop, one update per model,
    CPU times labelled as such, and the GPU cost projected from counted FLOPs, never from CPU times.
    """
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: preflight measures the paper preset on it instead")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", "preflight", "--config", str(root / "config/paper.yaml"),
         "--micro-batch", "1", "--threads", "2", "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((out / "preflight.json").read_text())
    cfg = C.load(root / "config/paper.yaml")
    check_consistent(r, cfg)
    assert r["precision"] == "fp16_fairseq" and r["cpu_times"] and "the times are CPU times" in r["device_note"]
    assert (r["micro_batches_measured"], r["optimizer_steps_measured"], r["warmup_updates"]) == (1, 1, 0)
    assert {a["measured_as"] for a in r["arms"]} == {"prenorm_clip10"}  # one model: plumbing and memory
    a = r["arms"][0]
    assert 300e6 < a["params"] < 340e6 and a["micro_batches_per_update"] == 56  # 3,584 crops over 64 GPUs
    assert a["update_source"] == "projected"  # no whole update of a CUDA preset on a CPU
    assert (a["param_dtype"], a["master_dtype"], a["loss_scale"], a["scaler_updates"]) == ("float16", "float32",
                                                                                            128.0, 1)
    assert a["allreduce_bytes"] == 2 * a["params"] and a["allreduce_ms"] > 0  # 64 GPUs on 8 nodes: InfiniBand
    assert r["interconnect"]["link"] == "InfiniBand, across nodes"
    expected_comm = 2 * 63 / 64 * a["grad_bytes"] / 50e9 * 1000
    assert a["allreduce_ms"] == pytest.approx(expected_comm)
    for arm in r["arms"]:  # every model's memory from its own baseline (freed memory returned in between)
        assert arm["peak_memory_gb"] > 2 * arm["params"] * 2 / 1e9  # fp16 weights and gradients, at least
        assert arm["static_memory_gb"] > 2.5 * arm["params"] * 4 / 1e9  # fp32 masters and Adam state
    gpus = {g["gpu"]: g for g in r["gpu_projection"]}
    assert set(gpus) == {"H100 / H200 (SXM)", "A100 (SXM)"}
    m = C.model_config(cfg, "prenorm_clip1")
    for g in gpus.values():  # from counted FLOPs at the stated utilisation: no CPU time enters
        p = g["arms"][0]
        assert g["utilisation"] == project.DEFAULT_UTILISATION
        assert p["compute_ms"] == pytest.approx(56 * step_flops(m, 1, 384) / (g["peak_tflops"] * 1e12 * 0.35) * 1000)
        assert p["ms_per_update"] == pytest.approx(p["compute_ms"] + max(0.0, expected_comm - 2 / 3 * p["compute_ms"] / 56))
        assert g["gpu_hours"] == pytest.approx(sum(x["hours"] for x in g["arms"]) * 64)
    assert gpus["H100 / H200 (SXM)"]["peak_tflops"] == 989.0
    md = (out / "preflight.md").read_text()
    assert "CPU ms/update" in md and "Projection on GPUs" in md and "not a measurement" in md
    assert r["figure"]["steps"] == 100_000 and r["disk"]["audio_gb"] == pytest.approx(4000 * 30 * 24000 * 4 / 1e9)


# ----------------------------------------------------------------------------- refused devices and options


def test_asking_for_cuda_without_one_is_an_error(root, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: --device cuda is valid here, so there is no missing device to refuse")
    code = cli.main(["preflight", "--config", str(root / "config/smoke.yaml"), "--out", str(tmp_path), "--device", "cuda"])
    assert code == 2 and "'--device' is cuda but torch sees no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--micro-batch", "3"], "--micro-batch 3 does not divide the 4 crops per update and process"),
    (["--optimizer-steps", "3", "--micro-batches", "2"], "--optimizer-steps (3) cannot exceed --micro-batches (2)"),
    (["--gpus-per-node", "0"], "train.processes (1) exceeds --gpus-per-node (0)"),
    (["--micro-batch", "0"], "--micro-batch must be at least 1, got 0"),
    (["--warmup", "-1"], "--warmup must be at least 0, got -1"),
])
def test_bad_options_are_one_line_errors(root, tmp_path, capsys, args, message):
    code = cli.main(["preflight", "--config", str(root / "config/smoke.yaml"), "--out", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "preflight.json").exists()
