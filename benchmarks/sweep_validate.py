"""Time `amlm validate` of sweeps of 100, 1,000 and 10,000 points (issue 32: validation must be linear).

Each sweep is config/smoke.yaml's four arms crossed with a grid of peak rates and depths
(N / 20 values of train.lr x 5 values of model.layers x 4 arms = N points), written to a temporary
file and validated by the CLI in a fresh process (`python -m acoustic_mlm validate --config FILE`),
one core (taskset where available), the best of --repeat runs. Prints one line per size and, with
--json, writes the numbers.

    python benchmarks/sweep_validate.py                      # 100, 1000, 10000 points
    python benchmarks/sweep_validate.py --points 500 1000 --repeat 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from acoustic_mlm.utils import write_result

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [2, 4, 6, 8, 12]


def sweep_config(points: int) -> dict:
    """config/smoke.yaml's mapping with a sweep of `points` points (written to a file, validated by the CLI)."""
    settings = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    settings.pop("sweep", None)
    per = len(settings["runs"]) * len(LAYERS)
    if points % per:
        raise SystemExit(f"--points must be a multiple of {per} (arms x depths)")
    rates = [round(1e-4 * (1 + i / 10), 8) for i in range(points // per)]  # distinct in the 6 digits a name keeps
    settings["sweep"] = [{"grid": {"train.lr": rates, "model.layers": LAYERS}}]
    return settings


def time_validate(path: Path, repeat: int) -> float:
    cmd = [sys.executable, "-m", "acoustic_mlm", "validate", "--config", str(path)]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]  # one core
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"validate failed: {proc.stderr.strip()[-500:]}")
        best = min(best, elapsed)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; the best is kept (default 3)")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.yaml"
        settings = sweep_config(args.points[0])
        settings.pop("sweep")
        base.write_text(yaml.safe_dump(settings, sort_keys=False))
        floor = time_validate(base, args.repeat)  # the same file without a sweep: start-up and one validation
        print(f"no sweep: {floor:.2f} s (interpreter start-up, imports, one validation)", flush=True)
        for n in args.points:
            path = Path(tmp) / f"sweep{n}.yaml"
            path.write_text(yaml.safe_dump(sweep_config(n), sort_keys=False))
            seconds = time_validate(path, args.repeat)
            rows.append({"points": n, "seconds": round(seconds, 3), "over_no_sweep_s": round(seconds - floor, 3)})
            print(
                f"{n:>6} points: {seconds:.2f} s ({(seconds - floor) / n * 1e6:.0f} us per point over no sweep)",
                flush=True,
            )
    info = {"cpu_count": os.cpu_count(), "loadavg": os.getloadavg(), "no_sweep_s": round(floor, 3), "sizes": rows}
    write_result(args.json, info)


if __name__ == "__main__":
    main()
