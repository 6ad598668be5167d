"""The smoke pipeline end to end on a device (CUDA by default): every arm, one of them killed and resumed.

In a fresh copy of the repository (its sources, none of its generated outputs), `config/smoke.yaml` with
`train.device` and `tokenizer.device` set to the device is run by Snakemake (`--resources gpu=1`: one
training job on the GPU at a time). As soon as any arm has written a resumable state past step
`--kill-after-step`, the whole Snakemake process group is killed (SIGKILL, as an out-of-memory kill or a
lost node would); Snakemake is unlocked and run again. Passes when the second run completes, every arm has
its summary, the figure exists, and the killed arm's log says it resumed. Results in `<out>/smoke_cuda.json`.

    python benchmarks/smoke_cuda.py --out results/gpu_check/smoke_cuda              # on the GPU
    python benchmarks/smoke_cuda.py --out /tmp/smoke_cpu --device cpu               # the same on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def device_config(repo: Path, device: str) -> Path:
    settings = yaml.safe_load((repo / "config" / "smoke.yaml").read_text())  # the file's mapping, edited
    settings["train"]["device"] = device
    settings["tokenizer"]["device"] = device
    path = repo / "config" / f"smoke-{device}.yaml"
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
    """(arm, step) of the furthest resumable state on disk: the step from its file name's digits."""
    best: tuple[str | None, int] = (None, -1)
    for run in runs:
        for f in (repo / "results" / "runs" / run / "state").glob("**/*"):
            digits = "".join(c for c in f.stem if c.isdigit())
            if f.is_file() and digits and int(digits) > best[1]:
                best = (run, int(digits))
    return best


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/gpu_check/smoke_cuda"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--cores", type=int, default=4)
    p.add_argument("--kill-after-step", type=int, default=20, help="kill once a state past this step exists")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds for both runs together")
    args = p.parse_args(argv)
    if args.cores < 1 or args.kill_after_step < 0 or not args.timeout > 0:
        p.error("--cores at least 1, --kill-after-step at least 0, --timeout above 0")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    try:
        import snakemake  # noqa: F401  (the pipeline's engine; the GPU image of issue 34 lacked some packages)
    except ImportError as exc:
        print(f"smoke_cuda: snakemake is not installed ({exc}); pip install 'snakemake>=9,<10' first", file=sys.stderr)
        sys.exit(2)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    repo = copy_sources(out / "repo")
    config = device_config(repo, args.device)
    runs = list(yaml.safe_load(config.read_text())["runs"])
    env = {**os.environ, "PYTHONPATH": f"{repo / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    result: dict = {"device": args.device, "config": str(config.relative_to(repo)), "runs": runs}

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
    (out / "smoke_cuda.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("ok", "first_run", "resumed", "summaries", "seconds")}))
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
