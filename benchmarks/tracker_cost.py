"""Cost per metrics row of the trackers (train.loggers), against the CSV write every row already has.

At each metrics row train.loop.record rewrites metrics.partial.csv (all rows so far, atomically): that is
the baseline, timed in the same invocation on the same rows. Each tracker then gets the same rows
one at a time, as trackers.Trackers.log gets them in training:

    csv          train.loop.record's write: pandas to_csv of the rows so far, temporary name, rename
    tensorboard  trackers._TensorBoard.log: one add_scalar per column, then flush
    wandb        trackers._WandB.log under WANDB_MODE=offline (the files only; no network)

Rows: --rows rows of a shipped reference run (--metrics; default the smoke preset's, whose rows
hold every codebook's losses, the schedule, clipping and the stability diagnostics). Reported: the median time
per row of each, its ratio to the CSV write, and the time to open and close each tracker.

    python benchmarks/tracker_cost.py --metrics data/reference/smoke_run/GenuineIntel/metrics.csv --rows 60 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm.train import trackers
from acoustic_mlm.utils import atomic_path, machine_info


def make_rows(metrics: Path, n: int) -> list[dict]:
    """n metrics rows of the first arm of a reference run (its real columns and values), steps renumbered."""
    table = pd.read_csv(metrics)
    table = table[table["run"] == table["run"].iloc[0]].drop(columns=["run", "seed"], errors="ignore")
    records = table.to_dict("records")
    return [{**records[i % len(records)], "step": 50 * (i + 1)} for i in range(n)]


def time_csv(rows: list[dict], folder: Path) -> list[float]:
    """train.loop.record's write, row by row: the whole table so far, atomically."""
    times = []
    for i in range(1, len(rows) + 1):
        t0 = time.perf_counter()
        with atomic_path(folder / "metrics.partial.csv") as tmp:
            pd.DataFrame(rows[:i]).to_csv(tmp, index=False)
        times.append(time.perf_counter() - t0)
    return times


def time_tracker(name: str, cfg: C.Config, rows: list[dict], folder: Path) -> tuple[list[float], float]:
    """(seconds per row, seconds to open and close) of one tracker."""
    t0 = time.perf_counter()
    tracker = trackers._BACKENDS[name](folder, "prenorm_clip1", 1, cfg)
    opened = time.perf_counter() - t0
    times = []
    for row in rows:
        t0 = time.perf_counter()
        tracker.log(row)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    tracker.close()
    return times, opened + time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--config", default="config/config.yaml", help="the wandb run's config (default: config/config.yaml)"
    )
    ap.add_argument(
        "--metrics",
        type=Path,
        default=Path("data/reference/smoke_run/GenuineIntel/metrics.csv"),
        help="reference metrics whose rows are logged (default: the smoke preset's)",
    )
    ap.add_argument("--rows", type=int, default=60, help="metrics rows per repetition (default: 60)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions; medians over all rows of all (default: 3)")
    ap.add_argument("--loggers", default="tensorboard,wandb", help="trackers to time (default: tensorboard,wandb)")
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    cfg = C.load(args.config)
    rows = make_rows(args.metrics, args.rows)
    names = [n for n in args.loggers.split(",") if n]
    per_row = {"csv": [], **{n: [] for n in names}}
    setup = {n: [] for n in names}
    for _ in range(args.reps):
        for name in ["csv", *names]:  # the baseline and each tracker, in turn, in fresh folders
            with tempfile.TemporaryDirectory() as tmp:
                if name == "csv":
                    per_row["csv"] += time_csv(rows, Path(tmp))
                else:
                    times, opened = time_tracker(name, cfg, rows, Path(tmp))
                    per_row[name] += times
                    setup[name].append(opened)
    base = statistics.median(per_row["csv"])
    result = {
        "config": args.config,
        "rows": args.rows,
        "reps": args.reps,
        "metrics": str(args.metrics),
        "columns": len(rows[0]),
        "machine": machine_info(__import__("torch").device("cpu")),
        "per_row_ms": {n: 1e3 * statistics.median(t) for n, t in per_row.items()},
        "ratio_to_csv": {n: statistics.median(t) / base for n, t in per_row.items()},
        "open_close_s": {n: statistics.median(t) for n, t in setup.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
