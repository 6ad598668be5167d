"""`amlm preflight`: every field of preflight.json, and numbers that agree with each other."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from helpers import stoppable_by_sigint

from acoustic_mlm import cli
from acoustic_mlm import config as C
from acoustic_mlm.preflight import data_costs, measure, project
from acoustic_mlm.preflight.flops import step_flops

ARM_FIELDS = {
    "run",
    "label",
    "seeds",
    "steps",
    "params",
    "measured_as",
    "warmup_s",
    "ms_per_micro_batch",
    "ms_per_micro_batch_all",
    "ms_optimizer_step",
    "ms_optimizer_step_all",
    "micro_batches_per_update",
    "ms_per_update_projected",
    "ms_per_update_measured",
    "ms_per_update",
    "update_source",
    "frames_per_update",
    "frames_per_s",
    "model_flops_per_update",
    "tflops",
    "mfu",
    "peak_memory_gb",
    "static_memory_gb",
    "activation_gb_per_micro_batch",
    "available_memory_gb",
    "fits",
    "fits_at_micro_batch",
    "max_micro_batch",
    "max_micro_batch_method",
    "suggested_micro_batch",
    "suggested_accum_steps",
    "measured_micro_batch",
    "did_not_fit",
    "hours_per_seed",
    "hours",
    "gpu_hours",
    "losses_finite",
    "first_loss",
    "ms_per_update_compute",
    "allreduce_bytes",
    "allreduce_ms",
    "exposed_allreduce_ms",
    "bound",
    "grad_bytes",
    "param_dtype",
    "master_dtype",
    "loss_scale",
    "scaler_updates",
    "updates_run",
    "overflow_updates",
    "activation_bytes_counted",
    "measured_params",
    "measured_frames",
    "measured_layers",
    "gpu_memory",
}
FIGURE_FIELDS = {
    "arms",
    "jobs",
    "seeds",
    "steps",
    "processes",
    "nodes",
    "gpus_per_node",
    "gpus",
    "concurrent_jobs",
    "wall_hours",
    "gpu_hours",
}
DISK_FIELDS = {
    "corpus_seconds",
    "corpus_note",
    "audio_gb",
    "codes_gb",
    "codebooks_stored",
    "checkpoint_gb_per_seed",
    "state_gb_per_file",
    "checkpoints_gb",
    "total_gb",
    "sample_format",
}
TOP_FIELDS = {
    "config",
    "device",
    "device_type",
    "preset_device",
    "device_note",
    "precision",
    "preset_precision",
    "compile",
    "torch",
    "threads",
    "peak_tflops",
    "memory_kind",
    "crop_frames",
    "batch_size",
    "accum_steps",
    "global_batch",
    "preset_micro_batch",
    "micro_batch",
    "micro_batches_measured",
    "optimizer_steps_measured",
    "warmup_updates",
    "arms",
    "figure",
    "disk",
    "data",
    "cpu_times",
    "interconnect",
    "gpu_projection",
    "sweep_projection",
    "sweep_models",
    "measured_precision",
    "measured_frames",
    "measured_layers",
    "measurement",
}


def check_consistent(r: dict, cfg: C.Config) -> None:
    """The relations preflight's numbers must satisfy, whatever the machine measured."""
    assert set(r) == TOP_FIELDS
    assert set(r["figure"]) == FIGURE_FIELDS and set(r["disk"]) == DISK_FIELDS
    t = cfg.train
    frames = r["measured_frames"]  # the preset's crop, or the bounded one measured in place of its GPU
    world = t.processes * t.nodes  # DDP processes of one run
    crops = t.batch_size * t.accum_steps // world
    assert [a["run"] for a in r["arms"]] == list(cfg.runs)
    for a in r["arms"]:
        assert set(a) == ARM_FIELDS, set(a) ^ ARM_FIELDS
        mb = a["measured_micro_batch"]
        assert a["micro_batches_per_update"] * mb == crops
        assert a["ms_per_update_projected"] == pytest.approx(
            a["micro_batches_per_update"] * a["ms_per_micro_batch"] + a["ms_optimizer_step"]
        )
        expected = a["ms_per_update_measured"] if a["update_source"] == "measured" else a["ms_per_update_projected"]
        assert a["ms_per_update_compute"] == expected
        assert a["ms_per_update"] == pytest.approx(expected + a["exposed_allreduce_ms"])
        assert (a["allreduce_bytes"] == 0) == (world == 1) and (a["allreduce_ms"] == 0) == (world == 1)
        assert a["updates_run"] == (
            r["warmup_updates"] + r["optimizer_steps_measured"] + (a["update_source"] == "measured")
        )
        seconds = a["ms_per_update"] / 1000
        assert a["frames_per_update"] == crops * frames
        assert a["frames_per_s"] == pytest.approx(crops * frames / seconds)
        m = dataclasses.replace(cfg.model_for(a["run"]), layers=a["measured_layers"])  # the model measured
        assert a["model_flops_per_update"] == a["micro_batches_per_update"] * step_flops(m, mb, frames)
        assert a["tflops"] == pytest.approx(a["model_flops_per_update"] / (a["ms_per_update_compute"] / 1000) / 1e12)
        assert (a["mfu"] is None) == (r["peak_tflops"] is None)
        if r["gpu_projection"] is not None:  # CPU times in place of the preset's GPU: no hours from them
            assert a["hours_per_seed"] is None and a["hours"] is None and a["gpu_hours"] is None
        else:
            assert a["hours_per_seed"] == pytest.approx(t.steps * a["ms_per_update"] / 3.6e6)
            assert a["hours"] == pytest.approx(a["seeds"] * a["hours_per_seed"])
            assert a["gpu_hours"] == pytest.approx(a["hours"] * world)
        assert a["peak_memory_gb"] > 0 and a["activation_gb_per_micro_batch"] >= 0
        assert a["losses_finite"] and math.isfinite(a["first_loss"])
        twin = next(b for b in r["arms"] if b["run"] == a["measured_as"])  # identical models are measured once
        assert twin["ms_per_micro_batch"] == a["ms_per_micro_batch"]
        if a["fits"]:
            assert (a["suggested_micro_batch"], a["suggested_accum_steps"]) == (t.batch_size // world, t.accum_steps)
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
    seconds = data_costs.corpus_seconds(cfg)
    assert d["corpus_seconds"] == pytest.approx(seconds)
    assert d["audio_gb"] == pytest.approx(seconds * 24000 * {"float32": 4, "int16": 2}[cfg.data.sample_format] / 1e9)
    assert d["codes_gb"] == pytest.approx(seconds * 75 * 8 * 2 / 1e9)
    assert d["checkpoint_gb_per_seed"] == pytest.approx(r["arms"][0]["params"] * 4 / 1e9)
    assert d["total_gb"] == pytest.approx(d["audio_gb"] + d["codes_gb"] + d["checkpoints_gb"])


@pytest.mark.slow
def test_smoke_preset_measures_every_arm_and_writes_consistent_numbers(root, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="acoustic_mlm")
    code = cli.main(
        [
            "preflight",
            "--config",
            str(root / "config/smoke.yaml"),
            "--out",
            str(tmp_path),
            "--threads",
            "1",
            "--micro-batches",
            "2",
            "--optimizer-steps",
            "1",
        ]
    )
    assert code == 0
    r = json.loads((tmp_path / "preflight.json").read_text())
    cfg = C.load(root / "config/smoke.yaml")
    check_consistent(r, cfg)
    assert r["device"] == "cpu" and r["device_note"] is None and r["micro_batch"] == cfg.train.batch_size
    assert all(a["update_source"] == "measured" for a in r["arms"])  # a smoke update takes well under a minute
    assert all(a["fits"] for a in r["arms"])
    assert r["arms"][1]["measured_as"] == "prenorm_clip10"  # same model, other clip: measured once
    assert r["figure"]["concurrent_jobs"] == 1
    md = (tmp_path / "preflight.md").read_text()
    assert all(f"| {run} |" in md for run in cfg.runs) and "The figure" in md and "Disk" in md
    assert not list(tmp_path.glob(".*tmp*"))  # nothing half-written left behind
    summary = [r.getMessage() for r in caplog.records if "the figure takes" in r.getMessage()]
    assert len(summary) == 1 and "on this CPU (1 process(es) per run" in summary[0], summary
    assert "GPU" not in summary[0] and re.search(r"takes (\d+ s|\d+\.\d (min|h)) on", summary[0]), summary


@pytest.mark.slow
def test_smoke_preset_under_fp16_fairseq_steps_a_half_model_with_fp32_master_weights(root, tmp_path):
    """--precision takes fp16_fairseq: preflight steps what `amlm train` steps (train.build_trainer),
    an fp16 model, fp32 master weights and fairseq's loss scaler, and reports the loss scale."""
    code = cli.main(
        [
            "preflight",
            "--config",
            str(root / "config/smoke.yaml"),
            "--out",
            str(tmp_path),
            "--threads",
            "1",
            "--micro-batches",
            "2",
            "--optimizer-steps",
            "1",
            "--precision",
            "fp16_fairseq",
        ]
    )
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
    md = (tmp_path / "preflight.md").read_text()
    assert "float16, float32 master weights; loss scale 128 after 3 update(s)" in md
    fp32 = measure.measure_arm(
        *_smoke_arm(root), "fp32", 37, measure.Plan(4, 1, 1, 0, False), 1, measure.MemoryProbe(torch.device("cpu"))
    )
    assert (fp32["param_dtype"], fp32["master_dtype"], fp32["loss_scale"]) == ("float32", None, None)


def _smoke_arm(root):
    cfg = C.load(root / "config/smoke.yaml")
    return cfg.model_for("prenorm_clip1"), cfg.train_for("prenorm_clip1"), torch.device("cpu")


def _preflight_subprocess(root, tmp_path, preset: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "acoustic_mlm",
            "preflight",
            "--config",
            str(root / "config" / preset),
            "--out",
            str(tmp_path / "out"),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        preexec_fn=stoppable_by_sigint,  # SIGINT must stop it even when the suite runs as a background job
    )


@pytest.mark.slow
def test_paper_preset_without_its_gpu_answers_within_a_minute(root, tmp_path):
    """The paper's 318 M-parameter preset on a machine without CUDA, as the README runs it (issue 32,
    class 6): a bounded float32 step of a cut of the model at as many frames as fit the CPU budget, labelled
    as that; the GPU time projected from counted FLOPs (never from CPU times), the GPU memory from counted
    parameters and activations; all in well under a minute."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: preflight measures the paper preset on it instead")
    t0 = time.perf_counter()
    proc = _preflight_subprocess(root, tmp_path, "paper.yaml")
    _, err = proc.communicate(timeout=120)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, err[-3000:]
    assert elapsed < 60, f"preflight took {elapsed:.0f} s"
    r = json.loads((tmp_path / "out" / "preflight.json").read_text())
    cfg = C.load(root / "config/paper.yaml")
    check_consistent(r, cfg)
    assert (r["precision"], r["measured_precision"]) == ("fp16_fairseq", "fp32") and r["cpu_times"]
    assert "bounded float32 step" in r["device_note"] and "not the preset's step" in r["measurement"]
    assert r["measured_layers"] == measure.CUT_LAYERS and measure.MIN_FRAMES <= r["measured_frames"] <= 384
    assert (r["micro_batches_measured"], r["optimizer_steps_measured"], r["warmup_updates"]) == (1, 1, 0)
    assert {a["measured_as"] for a in r["arms"]} == {"prenorm_clip10"}  # one model: plumbing and memory
    a = r["arms"][0]
    assert 300e6 < a["params"] < 340e6 and a["measured_params"] < a["params"] / 5  # the whole model's, counted
    assert a["micro_batches_per_update"] == 56  # 3,584 crops over 64 GPUs
    assert a["update_source"] == "projected"  # no whole update of a CUDA preset on a CPU
    assert a["param_dtype"] == "float32" and a["master_dtype"] is None and a["losses_finite"]
    assert a["allreduce_bytes"] == a["grad_bytes"] == 2 * a["params"] and a["allreduce_ms"] > 0  # fp16 gradients
    assert r["interconnect"]["link"] == "InfiniBand, across nodes"
    expected_comm = 2 * 63 / 64 * a["grad_bytes"] / 50e9 * 1000
    assert a["allreduce_ms"] == pytest.approx(expected_comm)
    mem = a["gpu_memory"]  # counted: 20 bytes per parameter under fp16_fairseq, activations x 7 crops
    assert mem["static_gb"] == pytest.approx(20 * a["params"] / 1e9) and mem["micro_batch"] == 7
    assert mem["total_gb"] == pytest.approx(mem["static_gb"] + 7 * mem["activation_gb_per_crop"])
    assert 0.1 < mem["activation_gb_per_crop"] < 2 and a["fits"] is True  # H200 measured 0.51 GB per crop
    gpus = {g["gpu"]: g for g in r["gpu_projection"]}
    assert set(gpus) == {"H100 / H200 (SXM)", "A100 (SXM)"}
    m = cfg.model_for("prenorm_clip1")
    # the H200's measured 12.4 % for paper's micro-batch in fp16_fairseq (BENCHMARKS.md), the assumed 35 % elsewhere
    assert gpus["H100 / H200 (SXM)"]["utilisation"] == pytest.approx(0.124)
    assert gpus["A100 (SXM)"]["utilisation"] == project.DEFAULT_UTILISATION
    for g in gpus.values():  # from counted FLOPs at the stated utilisation: no CPU time enters
        p, u = g["arms"][0], g["utilisation"]
        assert p["compute_ms"] == pytest.approx(56 * step_flops(m, 1, 384) / (g["peak_tflops"] * 1e12 * u) * 1000)
        assert p["ms_per_update"] == pytest.approx(
            p["compute_ms"] + max(0.0, expected_comm - 2 / 3 * p["compute_ms"] / 56)
        )
        assert g["gpu_hours"] == pytest.approx(sum(x["hours"] for x in g["arms"]) * 64)
    md = (tmp_path / "out" / "preflight.md").read_text()
    assert "CPU ms per micro-batch (measured)" in md and "Projection on GPUs" in md and "not a measurement" in md
    assert "GPU memory per process" in md and "a bounded check, not the preset's step" in md
    assert r["figure"]["steps"] == 100_000 and r["disk"]["audio_gb"] == pytest.approx(8232 * 3600 * 24000 * 2 / 1e9)
    d = r["data"]  # fma_full, int16, pretrained targets: the data side from constants, offline
    assert d["source"] == "fma_full" and round(d["epochs"]) == 69 and round(d["download_gb"]) == 944
    assert "**Data** (fma_full, 8,232 h of audio" in md and "**68.8 epochs**" in md


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_preflight_exits_within_seconds_and_writes_nothing(root, tmp_path, sig):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the preset would be measured on it")
    proc = _preflight_subprocess(root, tmp_path, "gpu-small.yaml")
    time.sleep(4)  # importing, building the model or stepping it
    t0 = time.perf_counter()
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert time.perf_counter() - t0 < 10
    assert proc.returncode != 0 and not (tmp_path / "out" / "preflight.json").exists()


def test_processes_beyond_the_gpus_here_measure_one_and_project_the_node(root, monkeypatch):
    """One GPU here, a preset of 8 per node: no refusal; one process measured, the node of 8 projected
    (issue 34: the paper preflights were refused on an H200). An explicit --gpus-per-node still refuses."""
    from acoustic_mlm.preflight import run as pf

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    cfg = C.load(root / "config/paper.yaml")
    t0 = cfg.train
    hw = pf._hardware(t0, torch.device("cuda"), None, False, pf.Options())
    assert hw.gpus_per_node == 8 and hw.nodes == 8 and hw.peak == 989.0 and hw.measure_precision == "fp16_fairseq"
    assert "one process's micro-batch measured here" in hw.note
    assert pf._plan(cfg, t0, hw, pf.Options()).micro_batch == 7  # one process's share of the global micro-batch
    with pytest.raises(cli.UserError, match=r"train.processes \(8\) exceeds --gpus-per-node \(4\)"):
        pf._hardware(t0, torch.device("cuda"), None, False, pf.Options(gpus_per_node=4))


# ----------------------------------------------------------------------------- refused devices and options


def test_asking_for_cuda_without_one_is_an_error(root, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: --device cuda is valid here, so there is no missing device to refuse")
    code = cli.main(
        ["preflight", "--config", str(root / "config/smoke.yaml"), "--out", str(tmp_path), "--device", "cuda"]
    )
    assert code == 2 and "'--device' is cuda but torch sees no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--micro-batch", "3"], "--micro-batch 3 does not divide the 4 crops per update and process"),
        (["--optimizer-steps", "3", "--micro-batches", "2"], "--optimizer-steps (3) cannot exceed --micro-batches (2)"),
        (["--gpus-per-node", "0"], "--gpus-per-node 0 (it stands for 'train.processes'): 0 is less than the minimum"),
        (["--micro-batch", "0"], "--micro-batch 0: 0 is less than the minimum of 1"),  # the command line's rule
        (["--warmup", "-1"], "--warmup -1: -1 is less than the minimum of 0"),
    ],
)
def test_bad_options_are_one_line_errors(root, tmp_path, capsys, args, message):
    code = cli.main(["preflight", "--config", str(root / "config/smoke.yaml"), "--out", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "preflight.json").exists()


def test_options_come_from_the_command_line_and_left_out_ones_keep_their_defaults():
    import argparse

    from acoustic_mlm.preflight.run import Options

    args = argparse.Namespace(
        micro_batch=2,
        micro_batches=None,
        device="cpu",
        utilisation=None,
        every_model=True,
        command="preflight",
        config="config/paper.yaml",
    )
    options = Options.from_namespace(args, threads=3)
    assert (options.micro_batch, options.device, options.every_model, options.threads) == (2, "cpu", True, 3)
    assert options.micro_batches is None and options.utilisation == Options().utilisation


@pytest.mark.slow
@pytest.mark.parametrize("layers", [[3], [3, 5]])
def test_a_sweeps_deeper_points_are_measured_not_only_its_base_arms(root, tmp_path, layers):
    """A sweep whose points deepen the model: each point model no arm has is measured as an arm is (its
    parameters, whether it fits), listed in preflight.json and .md; the arms' own models are not repeated."""
    cfg = yaml.safe_load((root / "config" / "smoke.yaml").read_text())
    cfg["sweep"] = [{"grid": {"model.layers": [cfg["model"]["layers"], *layers]}, "arms": ["prenorm_clip1"]}]
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    args = ["--threads", "1", "--micro-batches", "1", "--optimizer-steps", "1", "--warmup", "0"]
    assert cli.main(["preflight", "--config", str(path), "--out", str(tmp_path / "out"), *args]) == 0
    r = json.loads((tmp_path / "out" / "preflight.json").read_text())
    rows = r["sweep_models"]
    assert [row["layers"] for row in rows] == layers and all(len(row["points"]) == 1 for row in rows)
    base = r["arms"][0]["params"]
    per_layer = (rows[0]["params"] - base) / (layers[0] - cfg["model"]["layers"])
    assert per_layer > 0 and all(
        row["params"] == base + per_layer * (row["layers"] - cfg["model"]["layers"]) for row in rows
    )
    assert all(row["fits"] is True and row["peak_memory_gb"] > 0 for row in rows)
    md = (tmp_path / "out" / "preflight.md").read_text()
    assert "The sweep's own models" in md and all(f"| {n} layers x " in md for n in layers)
