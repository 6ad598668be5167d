"""benchmarks/gpu_check.sh --dry-run checks every GPU command on CPU; the benchmarks it runs work on CPU."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
from helpers import copy_repo, load_benchmark

from acoustic_mlm import config as C


def _env(root):
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(root / "src")}


@pytest.mark.slow
def test_dry_run_prints_and_checks_every_command(root):
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=root, capture_output=True, text=True, env=_env(root)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == 8 and "dry run: 8 commands checked" in proc.stdout
    assert lines[0].startswith("[smoke_cuda,") and "smoke_cuda.py" in lines[0]  # first of all: the pipeline on CUDA
    assert lines[1].startswith("[gpu_mfu,") and "--variants before,cqt_fft,after" in lines[1]
    for preset in ("gpu-small", "paper"):
        assert C.load(f"{root}/config/{preset}.yaml").train.precision == "fp16_fairseq"  # the presets' own
        assert any(
            f"preflight --config config/{preset}.yaml --device cuda --precision fp16_fairseq" in line for line in lines
        ), preset
        assert f"config/{preset}.yaml" in lines[1] and "fp16_fairseq,bf16" in lines[1]  # MFU in both precisions
    assert any(
        "train_throughput.py --config config/gpu-small.yaml --device cuda" in line and "--sequential" in line
        for line in lines
    )
    assert any("relax_fp16.py" in line for line in lines)
    assert any("tokenize_throughput.py --device cuda --batch-sizes 1,4,16" in line for line in lines)
    assert any("data_throughput.py --device cuda --encode-batch 16" in line for line in lines)
    limits = [int(line.split("limit ")[1].split("s]")[0]) for line in lines]
    assert sum(limits) < 8.5 * 60  # every step timing out still ends within 8.5 minutes
    # the script, docs/gpus.md and BENCHMARKS.md state the same sum
    said = {
        "gpu_check.sh": r"The limits add up to (\d+) s",
        "docs/gpus.md": r"time limits add up to (\d+) s",
        "BENCHMARKS.md": r"steps' limits add up to (\d+) s",
    }
    for name, pattern in said.items():
        path = root / ("benchmarks/gpu_check.sh" if name == "gpu_check.sh" else name)
        m = re.search(pattern, " ".join(path.read_text().split()))
        assert m and int(m[1]) == sum(limits), (name, m and m[1], sum(limits))


@pytest.mark.slow
def test_dry_run_fails_on_a_bad_option(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    script = repo / "benchmarks" / "gpu_check.sh"
    script.write_text(script.read_text().replace("--precision bf16 --accum-steps", "--precision bf17 --accum-steps"))
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=repo, capture_output=True, text=True, env=_env(root)
    )
    assert proc.returncode == 1
    assert "FAILED the check" in proc.stderr and "bf17" in proc.stderr


@pytest.mark.slow
def test_without_a_gpu_the_real_run_refuses(root):
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=root, capture_output=True, text=True, env=_env(root))
    if "torch sees no CUDA device" not in proc.stderr:
        pytest.skip("a CUDA device is visible: the real run is not a CPU test")
    assert proc.returncode == 2


def test_relax_fp16_benchmark_on_cpu_stays_within_fp16_rounding_of_fp32(root, tmp_path):
    relax = load_benchmark("relax_fp16")
    result = relax.main(
        [
            "--config",
            str(root / "config/smoke.yaml"),
            "--device",
            "cpu",
            "--batch-size",
            "2",
            "--crop-seconds",
            "0.4",
            "--qk-scales",
            "1,64",
            "--threads",
            "1",
        ]
    )
    rows = result["rows"]
    assert [(r["qk_scale"], r["variant"]) for r in rows] == [(1, "plain"), (1, "relax"), (64, "plain"), (64, "relax")]
    for r in rows:
        assert r["layers"] == 2 and r["loss_finite"] and math.isfinite(r["fp32_loss"])
        assert abs(r["loss_minus_fp32"]) < 0.05  # fp16 rounding on a loss of about 58 nats
    assert rows[0]["fp32_loss"] == rows[1]["fp32_loss"]  # one fp32 reference per scale, the same weights


def test_loader_benchmark_on_a_small_corpus(root, tmp_path):
    loader = load_benchmark("loader_throughput")
    result = loader.main(
        [
            "--config",
            str(root / "config/paper.yaml"),
            "--batch-sizes",
            "7",
            "--workers",
            "0",
            "--shards",
            "2",
            "--clips-per-shard",
            "2",
            "--clip-seconds",
            "6",
            "--micro-batches",
            "2",
            "--warmup",
            "1",
            "--repeats",
            "1",
            "--json",
            str(tmp_path / "loader.json"),
        ]
    )
    (row,) = result["rows"]
    assert row["batch"] == 7 and row["workers"] == 0 and row["ms_per_micro_batch"] > 0
    assert result["crop_frames"] == C.load(root / "config/paper.yaml").crop_frames == 384
    assert row["loader_over_gpu"] == pytest.approx(row["ms_per_micro_batch"] / row["gpu_ms_per_micro_batch_projected"])
    assert (tmp_path / "loader.json").is_file()


@pytest.mark.slow
def test_only_selects_steps(root):
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dry-run", "--only", "gpu_mfu,relax_fp16"],
        cwd=root,
        capture_output=True,
        text=True,
        env=_env(root),
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert [line.split(",")[0] for line in lines] == ["[gpu_mfu", "[relax_fp16"]


@pytest.mark.slow
def test_gpu_mfu_measures_before_and_after_on_cpu(root, tmp_path):
    """The MFU script's three variants run (on CPU: the front end stays on convolutions; the CQT switches)."""
    mfu = load_benchmark("gpu_mfu")
    result = mfu.main(
        [
            "--presets",
            str(root / "config/smoke.yaml"),
            "--precisions",
            "fp32",
            "--cqt-loss-weight",
            "1",
            "--crop-seconds",
            "0.4",
            "--micro-batches",
            "1",
            "--warmup",
            "1",
            "--threads",
            "1",
            "--json",
            str(tmp_path / "mfu.json"),
        ]
    )
    rows = result["rows"]
    assert [(r["variant"], r["cqt_impl"], r["front_end"]) for r in rows] == [
        ("before", "nnaudio", "conv"),
        ("cqt_fft", "fft", "conv"),
        ("after", "fft", "conv"),
    ]
    for r in rows:
        assert r["micro_batch"] == 4 and r["frames"] == 30 and r["ms_per_micro_batch"] > 0 and r["losses_finite"]
        assert r["mfu"] is None and r["micro_batches_per_update"] == 1  # no peak on a CPU
    (agree,) = result["cqt_agreement"]
    assert agree["frames"] == 30 and agree["max_abs_over_max"] < 2e-5  # the FFT CQT equals nnAudio's on this device
    assert (tmp_path / "mfu.json").is_file()


def test_smoke_cuda_copies_the_sources_and_sets_the_device(root, tmp_path, monkeypatch):
    smoke = load_benchmark("smoke_cuda")
    monkeypatch.setattr(smoke, "ROOT", root)
    repo = smoke.copy_sources(tmp_path / "repo")
    assert (repo / "Snakefile").is_file() and (repo / "src" / "acoustic_mlm" / "cli.py").is_file()
    assert not (repo / ".git").exists() and not (repo / ".venv").exists() and not (repo / "results").exists()
    cfg = C.load(smoke.device_config(repo, "cuda"))
    assert cfg.train.device == cfg.tokenizer.device == "cuda"
    assert smoke.parse_args(["--timeout", "140"]).timeout == 140
