"""benchmarks/gpu_check.sh --dry-run checks every GPU command on CPU; the benchmarks it runs work on CPU."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest
from helpers import copy_repo

from acoustic_mlm import config as C


def _load(root, name):
    spec = importlib.util.spec_from_file_location(name, root / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _env(root):
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(root / "src")}


def test_dry_run_prints_and_checks_every_command(root):
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=root, capture_output=True, text=True,
                          env=_env(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == 9 and "dry run: 9 commands checked" in proc.stdout
    for preset in ("gpu-small", "paper"):
        assert C.load(f"{root}/config/{preset}.yaml")["train"]["precision"] == "fp16_fairseq"  # the presets' own
        for precision in ("fp16_fairseq", "bf16", "fp16"):
            assert any(f"preflight --config config/{preset}.yaml --device cuda --precision {precision}" in line
                       for line in lines), (preset, precision)
    assert any("train_throughput.py --config config/paper.yaml --device cuda" in line for line in lines)
    assert any("relax_fp16.py" in line for line in lines)
    assert any("tokenize_throughput.py --device cuda --batch-sizes 1,4,16" in line for line in lines)
    limits = [int(line.split("limit ")[1].split("s]")[0]) for line in lines]
    assert sum(limits) < 8 * 60  # every step timing out still ends within 8 minutes


def test_dry_run_fails_on_a_bad_option(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    script = repo / "benchmarks" / "gpu_check.sh"
    script.write_text(script.read_text().replace("--precision bf16,fp16", "--precision bf17"))
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=repo, capture_output=True,
                          text=True, env=_env(root))
    assert proc.returncode == 1
    assert "FAILED the check" in proc.stderr and "bf17" in proc.stderr


def test_without_a_gpu_the_real_run_refuses(root):
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=root, capture_output=True, text=True,
                          env=_env(root))
    if "torch sees no CUDA device" not in proc.stderr:
        pytest.skip("a CUDA device is visible: the real run is not a CPU test")
    assert proc.returncode == 2


def test_relax_fp16_benchmark_on_cpu_stays_within_fp16_rounding_of_fp32(root, tmp_path):
    relax = _load(root, "relax_fp16")
    result = relax.main(["--config", str(root / "config/smoke.yaml"), "--device", "cpu", "--batch-size", "2",
                         "--crop-seconds", "0.4", "--qk-scales", "1,64", "--threads", "1"])
    rows = result["rows"]
    assert [(r["qk_scale"], r["variant"]) for r in rows] == [(1, "plain"), (1, "relax"), (64, "plain"), (64, "relax")]
    for r in rows:
        assert r["layers"] == 2 and r["loss_finite"] and math.isfinite(r["fp32_loss"])
        assert abs(r["loss_minus_fp32"]) < 0.05  # fp16 rounding on a loss of about 58 nats
    assert rows[0]["fp32_loss"] == rows[1]["fp32_loss"]  # one fp32 reference per scale, the same weights


def test_loader_benchmark_on_a_small_corpus(root, tmp_path):
    loader = _load(root, "loader_throughput")
    result = loader.main(["--config", str(root / "config/paper.yaml"), "--batch-sizes", "7", "--workers", "0",
                          "--shards", "2", "--clips-per-shard", "2", "--clip-seconds", "6", "--micro-batches", "2",
                          "--warmup", "1", "--repeats", "1", "--json", str(tmp_path / "loader.json")])
    (row,) = result["rows"]
    assert row["batch"] == 7 and row["workers"] == 0 and row["ms_per_micro_batch"] > 0
    assert result["crop_frames"] == C.crop_frames(C.load(root / "config/paper.yaml")) == 384
    assert row["loader_over_gpu"] == pytest.approx(row["ms_per_micro_batch"] / row["gpu_ms_per_micro_batch_projected"])
    assert (tmp_path / "loader.json").is_file()
