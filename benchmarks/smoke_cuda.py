"""The smoke pipeline end to end on a device (CUDA by default) on gpu-small's own data path, every arm, one
of them killed and resumed; then one arm trained by two DDP processes.

In a fresh copy of the repository (its sources, none of its generated outputs), `config/smoke.yaml` is
run by Snakemake (`--resources gpu=1`: one training job on the GPU at a time) with what gpu-small takes
in its place: `train.device` and `tokenizer.device` set to the device, prepared audio stored as int16
(`data.sample_format`), codes from EnCodec in pretrained mode (`tokenizer.mode`) with a checkpoint in the
official format made here (an untrained 24 kHz model whose RVQ codebooks are filled with frames of
synthetic tones, level by level on residuals; named encodec_24khz-<sha256 prefix>.th as torch.hub names
the released file), and `train.precision: fp16_fairseq` (`--precision`). Every input is made here: the
synthetic corpus by the pipeline's fetch stage, the checkpoint by this script.

As soon as any arm has written a resumable state past step `--kill-after-step`, the whole Snakemake
process group is killed (SIGKILL, as an out-of-memory kill or a lost node would); Snakemake is unlocked
and run again. Passes when the second run completes, every arm has its summary, the figure exists, and
the killed arm's log says it resumed. Results in `<out>/smoke_cuda.json`.

`--ddp`: afterwards (or alone, on the prepared audio and codes a former run left in `<out>/repo`), one
arm trained by `--ddp-processes` processes under torchrun, `train.processes` set to match. With fewer
GPUs than processes they share the GPUs over gloo (AMLM_DIST_BACKEND=gloo; NCCL refuses two processes
on one GPU), else NCCL; on a CPU, gloo. Passes when the run writes its summary. Results in
`<out>/ddp.json`.

    python benchmarks/smoke_cuda.py --out results/gpu_check/smoke_cuda              # on the GPU
    python benchmarks/smoke_cuda.py --out results/gpu_check/smoke_cuda --ddp-only   # the DDP step alone
    python benchmarks/smoke_cuda.py --out /tmp/smoke_cpu --device cpu               # the same on a CPU
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".snakemake", ".venv", "__pycache__", ".pytest_cache", ".dvc/cache", ".dvc/tmp"}
GENERATED = ("data/raw", "data/prepared", "data/codes", "data/downloads", "results")


def copy_sources(dest: Path) -> Path:
    """The repository without its generated outputs, virtual environments or caches."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        rel = Path(folder).relative_to(ROOT)
        return {n for n in names if n in SKIP or str(rel / n) in SKIP or str(rel / n) in GENERATED}

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)
    return dest


def official_format_checkpoint(folder: Path, seed: int = 0) -> Path:
    """EnCodec's 24 kHz model in the released file's format (its whole state dict, torch.save), named
    encodec_24khz-<first 8 hex digits of its sha256>.th. Untrained codebooks are zero (every frame gets
    code 0), so each level's 1024 codewords are set to frames of what that level quantises: the
    encoder's output for 20 s of tones of random pitch and level, then each level's residual."""
    import warnings

    from encodec import EncodecModel

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = EncodecModel.encodec_model_24khz(pretrained=False)
    t = np.arange(12_000) / 24_000  # half a second per tone
    tones = [rng.uniform(0.02, 0.5) * np.sin(2 * np.pi * rng.uniform(60, 2000) * t) for _ in range(40)]
    with torch.no_grad():
        frames = model.encoder(torch.from_numpy(np.concatenate(tones).astype(np.float32))[None, None])[0].T
        x = frames[torch.from_numpy(rng.choice(len(frames), 1024, replace=len(frames) < 1024))]  # (1024, 128)
        for layer in model.quantizer.vq.layers:
            book = layer._codebook
            book.embed.copy_(x + 1e-3 * torch.randn_like(x))
            book.embed_avg.copy_(book.embed)
            book.cluster_size.fill_(1.0)
            book.inited.fill_(1.0)
            x = x - book.embed[torch.cdist(x, book.embed).argmin(1)]  # what the next level quantises
            x = x[torch.randperm(len(x))] + 1e-3 * torch.randn_like(x)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".state.th.tmp-{os.getpid()}"
    torch.save(model.state_dict(), tmp)
    with open(tmp, "rb") as f:
        prefix = hashlib.file_digest(f, "sha256").hexdigest()[:8]
    return tmp.replace(folder / f"encodec_24khz-{prefix}.th")


def device_config(
    repo: Path, device: str, checkpoint: Path | None = None, precision: str = "fp16_fairseq", processes: int = 1
) -> Path:
    """config/smoke.yaml on gpu-small's data path (int16, pretrained EnCodec with `checkpoint`, the
    precision) on `device`, written beside it; without a checkpoint the smoke's own calibrated tokenizer."""
    settings = yaml.safe_load((repo / "config" / "smoke.yaml").read_text())  # the file's mapping, edited
    settings["train"].update(device=device, precision=precision, processes=processes)
    settings["tokenizer"]["device"] = device
    if checkpoint is not None:
        settings["data"]["sample_format"] = "int16"
        settings["tokenizer"].update(mode="pretrained", checkpoint=str(checkpoint))
    suffix = "" if processes == 1 else f"-ddp{processes}"
    path = repo / "config" / f"smoke-{device}{suffix}.yaml"
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    return path


def snakemake(repo: Path, config: Path, cores: int, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--cores",
        str(cores),
        "--resources",
        "gpu=1",
        "--configfile",
        str(config.relative_to(repo)),
        *extra,
    ]


def newest_state_step(repo: Path, runs: list[str]) -> tuple[str | None, int]:
    """(arm, step) of the furthest resumable state on disk: complete states only (step-<N>.pt, as
    acoustic_mlm.train.state writes them; not a temporary file still being written)."""
    best: tuple[str | None, int] = (None, -1)
    for run in runs:
        for f in (repo / "results" / "runs" / run / "state").glob("**/step-*.pt"):
            m = re.fullmatch(r"step-(\d+)\.pt", f.name)
            if m and int(m[1]) > best[1]:
                best = (run, int(m[1]))
    return best


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/gpu_check/smoke_cuda"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--precision", default="fp16_fairseq", help="train.precision (gpu-small's: fp16_fairseq)")
    p.add_argument("--cores", type=int, default=4)
    p.add_argument("--kill-after-step", type=int, default=20, help="kill once a state past this step exists")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds for the pipeline's two runs together")
    p.add_argument("--ddp", action="store_true", help="then train one arm with --ddp-processes processes")
    p.add_argument("--ddp-only", action="store_true", help="the DDP run alone, on a former run's data in --out")
    p.add_argument("--ddp-processes", type=int, default=2)
    p.add_argument("--ddp-steps", type=int, default=30, help="train.steps of the DDP run")
    p.add_argument("--ddp-timeout", type=float, default=120.0, help="seconds for the DDP run")
    args = p.parse_args(argv)
    if args.cores < 1 or args.kill_after_step < 0 or not args.timeout > 0 or not args.ddp_timeout > 0:
        p.error("--cores at least 1, --kill-after-step at least 0, --timeout and --ddp-timeout above 0")
    if args.ddp_processes < 2 or args.ddp_steps < 1:
        p.error("--ddp-processes at least 2, --ddp-steps at least 1")
    return args


def child_env(repo: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{repo / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def pipeline(args: argparse.Namespace, out: Path) -> dict:
    t_start = time.perf_counter()
    repo = copy_sources(out / "repo")
    checkpoint = official_format_checkpoint(out / "checkpoint")
    config = device_config(repo, args.device, checkpoint, args.precision)
    runs = list(yaml.safe_load(config.read_text())["runs"])
    env = child_env(repo)
    result: dict = {
        "device": args.device,
        "config": str(config.relative_to(repo)),
        "runs": runs,
        "checkpoint": checkpoint.name,
        "precision": args.precision,
        "sample_format": "int16",
        "tokenizer_mode": "pretrained",
    }

    # 1. run until an arm has a resumable state past the step, then kill everything
    with open(out / "first_run.log", "w") as log:
        proc = subprocess.Popen(
            snakemake(repo, config, args.cores, []),
            cwd=repo,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        killed = None
        while proc.poll() is None and time.perf_counter() - t_start < args.timeout:
            arm, step = newest_state_step(repo, runs)
            if step > args.kill_after_step:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = (arm, step)
                break
            time.sleep(0.2)
        if proc.poll() is None:  # out of time before any state: stop it, the second run gets no time either
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    result["first_run"] = {
        "killed": killed is not None,
        "arm": killed and killed[0],
        "state_step": killed and killed[1],
        "returncode": proc.returncode,
        "seconds": time.perf_counter() - t_start,
    }
    # 2. unlock and run to the end
    subprocess.run(snakemake(repo, config, args.cores, ["--unlock"]), cwd=repo, env=env, capture_output=True)
    t1 = time.perf_counter()
    with open(out / "second_run.log", "w") as log:
        try:
            rc = subprocess.run(
                snakemake(repo, config, args.cores, ["--rerun-incomplete"]),
                cwd=repo,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=max(1.0, args.timeout - (t1 - t_start)),
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    summaries = {run: (repo / "results" / "runs" / run / "summary.json").is_file() for run in runs}
    resumed = None
    if killed:
        train_log = repo / "results" / "logs" / "train" / f"{killed[0]}.log"
        resumed = train_log.is_file() and "resuming after step" in train_log.read_text(errors="replace")
    figures = (
        sorted(str(f.relative_to(repo)) for f in (repo / "results" / "figures").glob("*"))
        if (repo / "results" / "figures").is_dir()
        else []
    )
    result["second_run"] = {"returncode": rc, "seconds": time.perf_counter() - t1}
    result.update(summaries=summaries, resumed=resumed, figures=figures, seconds=time.perf_counter() - t_start)
    result["ok"] = bool(rc == 0 and killed and all(summaries.values()) and resumed and figures)
    return result


def ddp_backend(device: str, processes: int) -> str | None:
    """AMLM_DIST_BACKEND for the DDP run: gloo where processes would share a GPU, else the default."""
    if device == "cuda" and torch.cuda.device_count() < processes:
        return "gloo"
    return None


def ddp(args: argparse.Namespace, out: Path) -> dict:
    """One arm trained by several processes under torchrun, on the prepared audio and codes in out/repo."""
    t0 = time.perf_counter()
    repo = out / "repo"
    data = [repo / "data" / "prepared" / "manifest.csv", repo / "data" / "codes" / "tokenizer.json"]
    result: dict = {"processes": args.ddp_processes, "device": args.device, "ok": False}
    missing = [str(p.relative_to(out)) for p in data if not p.is_file()]
    if missing:
        result["error"] = f"no prepared audio or codes from the pipeline run: {', '.join(missing)} missing"
        return result
    (checkpoint,) = sorted((out / "checkpoint").glob("encodec_24khz-*.th"))
    config = device_config(repo, args.device, checkpoint, args.precision, args.ddp_processes)
    settings = yaml.safe_load(config.read_text())
    settings["train"]["steps"] = args.ddp_steps
    settings["train"]["warmup_steps"] = min(settings["train"]["warmup_steps"], args.ddp_steps // 2)  # below steps
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    run = next(iter(settings["runs"]))
    env = child_env(repo)
    backend = ddp_backend(args.device, args.ddp_processes)
    if backend:
        env["AMLM_DIST_BACKEND"] = backend
    run_dir = repo / "results" / "ddp" / run
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    command += [str(args.ddp_processes), "-m", "acoustic_mlm", "train", run, "--config"]
    command += [str(config.relative_to(repo)), "--threads", "1", "--out", str(run_dir.relative_to(repo))]
    with open(out / "ddp.log", "w") as log:
        try:
            rc = subprocess.run(
                command, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.ddp_timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    summary = run_dir / "summary.json"
    steps = None
    if (run_dir / "metrics.csv").is_file():
        import pandas as pd

        steps = int(pd.read_csv(run_dir / "metrics.csv")["step"].max())
    result.update(
        run=run,
        backend=backend or ("nccl" if args.device == "cuda" else "gloo"),
        gpus=torch.cuda.device_count() if args.device == "cuda" else 0,
        command=" ".join(command),
        returncode=rc,
        last_step=steps,
        summary=summary.is_file(),
        seconds=time.perf_counter() - t0,
    )
    result["ok"] = bool(rc == 0 and summary.is_file() and steps == args.ddp_steps)
    return result


def write_json(path: Path, result: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)


def main(argv=None) -> dict:
    args = parse_args(argv)
    try:
        import snakemake  # noqa: F401  (the pipeline's engine; the GPU image of issue 34 lacked some packages)
    except ImportError as exc:
        print(f"smoke_cuda: snakemake is not installed ({exc}); pip install 'snakemake>=9,<10' first", file=sys.stderr)
        sys.exit(2)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"ok": True}
    if not args.ddp_only:
        result = pipeline(args, out)
        write_json(out / "smoke_cuda.json", result)
        print(json.dumps({k: result[k] for k in ("ok", "first_run", "resumed", "summaries", "seconds")}))
    if args.ddp or args.ddp_only:
        parallel = ddp(args, out)
        write_json(out / "ddp.json", parallel)
        print(json.dumps({k: parallel.get(k) for k in ("ok", "backend", "processes", "last_step", "seconds")}))
        result = {**result, "ok": result["ok"] and parallel["ok"]}
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
