"""benchmarks/gpu_check.sh --dry-run checks every GPU command on CPU; the benchmarks it runs work on CPU."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import copy_repo, load_benchmark
from packaging.utils import canonicalize_name

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
    assert len(lines) == 9 and "dry run: 8 commands checked" in proc.stdout  # the install step is no command
    assert lines[0] == "[install, limit 35s] install_wheelhouse"  # first: the wheelhouse, then everything in it
    assert lines[1].startswith("[smoke_cuda,") and "smoke_cuda.py" in lines[1]  # the pipeline on CUDA
    assert lines[2].startswith("[ddp_two_processes,") and "--ddp-only --ddp-processes 2" in lines[2]
    assert lines[3].startswith("[gpu_mfu,") and "--variants before,cqt_fft,after" in lines[3]
    for preset in ("gpu-small", "paper"):
        assert C.load(f"{root}/config/{preset}.yaml").train.precision == "fp16_fairseq"  # the presets' own
        assert any(
            f"preflight --config config/{preset}.yaml --device cuda --precision fp16_fairseq" in line for line in lines
        ), preset
        assert f"config/{preset}.yaml" in lines[3] and "fp16_fairseq,bf16" in lines[3]  # MFU in both precisions
    assert any(
        "train_throughput.py --config config/gpu-small.yaml --device cuda" in line and "--sequential" in line
        for line in lines
    )
    assert any("relax_fp16.py" in line for line in lines)
    assert any("tokenize_throughput.py --device cuda --batch-sizes 1,4,16" in line for line in lines)
    # every input travels with the checkout or is made by the check: nothing from ../shared
    script = (root / "benchmarks" / "gpu_check.sh").read_text()
    assert "../shared" not in proc.stdout and "AMLM_REAL_AUDIO" not in script and "data_throughput" not in proc.stdout
    limits = [int(line.split("limit ")[1].split("s]")[0]) for line in lines]
    assert sum(limits) + 15 <= 8 * 60  # every step timing out, plus starting them, still ends within 8 minutes
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


def _needs(root) -> dict[str, str]:
    """gpu_check.sh's NEEDS: {import name: the steps that need it}."""
    text = (root / "benchmarks" / "gpu_check.sh").read_text()
    block = re.search(r'^NEEDS="([^"]*)"', text, re.M)[1]
    return dict(item.split(":") for item in block.split())


def _third_party_imports(files) -> set[str]:
    names = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "acoustic_mlm"}


def test_the_wheelhouse_list_covers_every_import_of_the_package_and_the_checks_scripts(root):
    wheelhouse = load_benchmark("make_wheelhouse")
    pins = wheelhouse.closure(wheelhouse.roots(root / "pyproject.toml"))
    providers = importlib.metadata.packages_distributions()
    image = {"torch", "torchaudio", *wheelhouse.SCIENTIFIC}  # left to the PyTorch image
    assert not image & set(pins) and not {"dvc", "tensorboard", "triton"} & set(pins)
    for must in ("jsonschema", "encodec", "soundfile", "nnaudio", "snakemake", "pyyaml", "seaborn", "pulp"):
        assert must in pins, must
    scripts = ["smoke_cuda", "gpu_mfu", "train_throughput", "relax_fp16", "tokenize_throughput", "make_wheelhouse"]
    files = [*(root / "src" / "acoustic_mlm").rglob("*.py"), *(root / "benchmarks" / f"{n}.py" for n in scripts)]
    optional = {"wandb"}  # train.loggers wandb: the [wandb] extra, not in the check
    imports = _third_party_imports(files) | set(_needs(root)) | {"snakemake", "seaborn"}  # the pipeline's engine
    for name in sorted(imports - optional):
        dists = {canonicalize_name(d) for d in providers.get(name, [])}
        assert dists, f"{name}: no installed distribution provides it"
        assert dists & (set(pins) | image), f"{name} ({dists}) is neither in the wheelhouse nor left to the image"
    # the install step's report names every module left to the image, and the check's own names
    assert image <= {canonicalize_name(n) for n in _needs(root)} | {"torch"}
    for name in ("jsonschema", "encodec", "soundfile", "nnAudio"):
        assert name in _needs(root)


def test_make_wheelhouse_pins_the_installed_versions_and_refuses_an_unknown_include(root, capsys):
    wheelhouse = load_benchmark("make_wheelhouse")
    assert wheelhouse.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    pins = dict(line.split("==") for line in lines)
    assert pins["encodec"] == importlib.metadata.version("encodec") and pins == wheelhouse.closure(wheelhouse.roots())
    assert "numpy" not in pins and "numpy" in dict(
        line.split("==") for line in _list(wheelhouse, ["--list", "--include", "numpy"], capsys)
    )
    with pytest.raises(SystemExit) as exc:
        wheelhouse.parse_args(["--include", "torch"])
    assert exc.value.code == 2 and "--include torch" in capsys.readouterr().err


def _list(wheelhouse, argv, capsys) -> list[str]:
    assert wheelhouse.main(argv) == 0
    return capsys.readouterr().out.splitlines()


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


def test_smoke_cuda_copies_the_sources_and_takes_gpu_smalls_data_path(root, tmp_path, monkeypatch):
    smoke = load_benchmark("smoke_cuda")
    monkeypatch.setattr(smoke, "ROOT", root)
    repo = smoke.copy_sources(tmp_path / "repo")
    assert (repo / "Snakefile").is_file() and (repo / "src" / "acoustic_mlm" / "cli.py").is_file()
    assert not (repo / ".git").exists() and not (repo / ".venv").exists() and not (repo / "results").exists()
    ckpt = tmp_path / "encodec_24khz-00000000.th"
    cfg = C.load(smoke.device_config(repo, "cuda", ckpt))
    small = C.load(root / "config/gpu-small.yaml")
    assert cfg.train.device == cfg.tokenizer.device == "cuda" and cfg.train.processes == 1
    assert (
        (cfg.data.sample_format, cfg.tokenizer.mode, cfg.train.precision)
        == (
            small.data.sample_format,
            small.tokenizer.mode,
            small.train.precision,
        )
        == ("int16", "pretrained", "fp16_fairseq")
    )
    assert cfg.tokenizer.checkpoint == str(ckpt)
    ddp = C.load(smoke.device_config(repo, "cpu", ckpt, "fp32", processes=2))
    assert (ddp.train.processes, ddp.train.device, ddp.train.precision) == (2, "cpu", "fp32")
    args = smoke.parse_args(["--timeout", "140", "--ddp-only"])
    assert args.timeout == 140 and args.ddp_only and args.ddp_processes == 2
    with pytest.raises(SystemExit):
        smoke.parse_args(["--ddp-processes", "1"])


def test_two_processes_on_one_gpu_take_gloo(monkeypatch):
    smoke = load_benchmark("smoke_cuda")
    monkeypatch.setattr(smoke.torch.cuda, "device_count", lambda: 1)
    assert smoke.ddp_backend("cuda", 2) == "gloo"  # NCCL refuses two ranks on one device
    monkeypatch.setattr(smoke.torch.cuda, "device_count", lambda: 2)
    assert smoke.ddp_backend("cuda", 2) is None  # one GPU each: the default, NCCL
    assert smoke.ddp_backend("cpu", 2) is None  # gloo, the default on a CPU


@pytest.mark.slow  # about 30 s under load: EnCodec's encoder on CPU
def test_the_made_checkpoint_has_the_released_files_keys_name_and_varied_codes(tmp_path):
    import hashlib
    import warnings

    import torch
    from encodec import EncodecModel

    smoke = load_benchmark("smoke_cuda")
    path = smoke.official_format_checkpoint(tmp_path)
    assert path.name == f"encodec_24khz-{hashlib.sha256(path.read_bytes()).hexdigest()[:8]}.th"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = EncodecModel.encodec_model_24khz(pretrained=False)
    model.load_state_dict(torch.load(path, weights_only=True))  # strict: every key of the architecture
    model.set_target_bandwidth(6.0)
    t = torch.arange(24_000) / 24_000
    wav = (0.3 * torch.sin(2 * torch.pi * 220 * t) * torch.linspace(0.05, 1, 24_000))[None, None]
    with torch.no_grad():
        codes = model.encode(wav)[0][0][0]  # (codebooks, frames)
    assert codes.shape == (8, 75)
    assert all(len(torch.unique(level)) > 1 for level in codes)  # an untrained model's codebooks give code 0 only


@pytest.mark.slow
def test_cpu_rehearsal_runs_the_cpu_forms_and_skips_the_gpu_only_steps(root, tmp_path):
    repo = copy_repo(root, tmp_path / "repo")
    shutil.rmtree(repo / "wheelhouse", ignore_errors=True)  # none: the environment's packages as they are
    out = tmp_path / "out"
    env = {**_env(root), "OUT_DIR": str(out)}
    only = "install,relax_fp16,preflight_paper_fp16_fairseq"
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--cpu-rehearsal", "--only", only],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "gpu_check.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == ["install", "preflight_paper_fp16_fairseq", "relax_fp16"]  # the script's order
    assert summary["device"] == "cpu (rehearsal)"
    assert steps["install"]["rc"] == 0 and "no wheelhouse/requirements.txt" in steps["install"]["log_tail"]
    assert steps["install"]["results"]["imports.json"]["missing"] == {}
    assert steps["relax_fp16"]["rc"] == 0 and "--device cpu" in steps["relax_fp16"]["command"]
    assert [r["qk_scale"] for r in steps["relax_fp16"]["results"]["relax_fp16.json"]["rows"]] == [1, 1, 64, 64]
    assert steps["preflight_paper_fp16_fairseq"]["skipped"]  # GPU only
    assert "2 of 2 steps succeeded (1 skipped)" in proc.stdout


def test_make_wheelhouse_mode_passes_its_options_on(root):
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--make-wheelhouse", "--list"],
        cwd=root,
        capture_output=True,
        text=True,
        env=_env(root),
    )
    assert proc.returncode == 0, proc.stderr
    pins = dict(line.split("==") for line in proc.stdout.splitlines())
    assert pins["snakemake"] == importlib.metadata.version("snakemake") and "torch" not in pins
