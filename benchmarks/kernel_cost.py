"""What pinning the CPU kernels costs: `cpu_kernels: avx2` against `native`, interleaved, one process each.

Each trial is a fresh `python -m acoustic_mlm` process (the kernels are chosen when torch loads), on
the data and codes already in --data: `train` of one arm for --steps updates (the schedule of the
preset's whole run, so the rates are the run's), its seconds per update from the metrics' wall
time, and `tokenize --shard 0` into a scratch copy of the codes' model, its wall time. The two
modes alternate (A B A B ...) so that a change of load hits both alike; the table gives each
trial and the median ratio pinned / native.

    python benchmarks/kernel_cost.py --config config/config.yaml --config config/proxy.yaml --repeat 2
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

MODES = ("avx2", "native")


def _config(base: Path, mode: str, steps: int, folder: Path) -> Path:
    """The preset's file with cpu_kernels set and a shorter run of the same schedule, written to `folder`
    (the YAML mapping edited as a user edits the file; the trial's process validates it)."""
    settings = yaml.safe_load(base.read_text())
    settings["cpu_kernels"] = mode
    train = settings["train"]
    train["total_updates"] = train.get("total_updates") or train["steps"]  # an optional key
    train.update(steps=steps, checkpoint_interval=0)
    settings.pop("sweep", None)
    path = folder / f"{base.stem}-{mode}.yaml"
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    return path


def amlm(command: str, config: Path, *args: str) -> None:
    """One amlm command with `config` on one thread, in a child process: it pins (or not) its kernels
    from the config's cpu_kernels before torch loads, as the package's stages."""
    argv = [sys.executable, "-m", "acoustic_mlm", command, *args, "--config", str(config), "--threads", "1"]
    subprocess.run(argv, check=True, capture_output=True)


def train_trial(config: Path, arm: str, data: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    amlm("train", config, arm, "--prepared", str(data / "prepared"), "--codes", str(data / "codes"), "--out", str(out))
    m = pd.read_csv(out / "metrics.csv")
    last, first = m.iloc[-1], m.iloc[0]
    return float((last["wall_time"] - first["wall_time"]) / (last["step"] - first["step"]))


def tokenize_trial(config: Path, data: Path, scratch: Path) -> float:
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    shutil.copytree(data / "codes" / "model", scratch / "model")
    t = time.perf_counter()
    amlm("tokenize", config, "--shard", "0", "--prepared", str(data / "prepared"), "--out", str(scratch))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, action="append", required=True)
    ap.add_argument("--arm", default="prenorm_clip1")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--data", type=Path, default=Path("data"))
    ap.add_argument("--no-tokenize", action="store_true")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for base in a.config:
            configs = {mode: _config(base, mode, a.steps, tmp) for mode in MODES}
            for r in range(a.repeat):
                for mode in MODES:
                    s = train_trial(configs[mode], a.arm, a.data, tmp / f"run-{mode}")
                    rows.append({"preset": base.name, "what": "train, s/update", "mode": mode, "trial": r, "value": s})
                    print(rows[-1], flush=True)
            if not a.no_tokenize and base.stem == "config":
                for r in range(a.repeat):
                    for mode in MODES:
                        s = tokenize_trial(configs[mode], a.data, tmp / f"codes-{mode}")
                        rows.append(
                            {"preset": base.name, "what": "tokenize shard 0, s", "mode": mode, "trial": r, "value": s}
                        )
                        print(rows[-1], flush=True)
    t = pd.DataFrame(rows)
    print()
    for (preset, what), g in t.groupby(["preset", "what"], sort=False):
        pinned = g[g["mode"] == "avx2"]["value"].to_numpy()
        native = g[g["mode"] == "native"]["value"].to_numpy()
        ratios = [p / n for p, n in zip(pinned, native)]
        print(
            f"| {preset} | {what} | {statistics.median(pinned):.4g} | {statistics.median(native):.4g} | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )


if __name__ == "__main__":
    main()
