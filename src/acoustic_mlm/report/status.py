"""`amlm status`: where every arm and seed of a run stands, read from results/runs/ while it trains.

It reads only files that training writes atomically (through artifacts/metrics.py and artifacts/run_summary.py:
a temporary name, then a rename), so it is safe beside running jobs, locally or under SLURM on a shared file
system:

    <run>/seeds/seed<S>/summary.json         written last when a seed ends: completed, completed_with_nonfinite,
                                             diverged
    <run>/seeds/seed<S>/metrics.csv          that seed's rows (with the summary)
    <run>/seeds/seed<S>/metrics.partial.csv  the rows so far, rewritten at every metrics row
    <run>/state/seed<S>/step-*.pt            resumable states, every train.checkpoint_interval steps

A seed with rows but no summary is running, unless neither its rows nor its states changed for
`stale_after` seconds: then it is stopped (a killed job, a lost node, a job waiting to be resumed).
One whose last row says diverged, but has no summary yet, is diverged. Nothing yet: waiting.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.checked import ReadError
from acoustic_mlm.artifacts.run_summary import DIVERGED, SUMMARY, read_seed_status
from acoustic_mlm.errors import UserError
from acoustic_mlm.report.runs import config_runs, seed_dir, seed_state_dir

STALE_AFTER_S = 1800.0  # a running seed without a new metrics row or state for this long is "stopped"


@dataclass
class SeedStatus:
    run: str
    seed: int
    step: int
    total: int
    cb0: float  # last codebook-0 training loss, bits
    rate: float  # updates per second (NaN: not known yet)
    left_s: float  # seconds to the last step at that rate (NaN when it has ended)
    loss_scale: float  # fp16 loss scale at the last row (NaN: no scaler)
    overflow_skips: int | None  # fp16 updates skipped by the loss scaler (None: no scaler)
    status: str  # waiting | running | stopped | completed | completed_with_nonfinite | diverged
    idle_s: float = math.nan  # seconds since the last sign of progress (running and stopped seeds)


def _rows(path: Path, reader=M.read_partial_metrics) -> pd.DataFrame | None:
    """A seed's rows through its checked reader (a damaged file is one ReadError line naming it);
    None when the file is gone between listing and reading (the seed just finished)."""
    if not path.is_file():
        return None
    try:
        return reader(path)
    except ReadError:
        if not path.exists():
            return None
        raise


def _rate(rows: pd.DataFrame) -> float:
    """Updates per second over the last rows (the validation pass at each row included)."""
    recent = rows.tail(4)  # rows at powers of two come close together; several even them out
    if len(recent) < 2:
        last = rows.iloc[-1]
        return float(last[M.STEP]) / float(last[M.WALL_TIME]) if last[M.WALL_TIME] > 0 else math.nan
    steps = float(recent[M.STEP].iloc[-1] - recent[M.STEP].iloc[0])
    seconds = float(recent[M.WALL_TIME].iloc[-1] - recent[M.WALL_TIME].iloc[0])
    return steps / seconds if seconds > 0 else math.nan


def _scaler(rows: pd.DataFrame) -> tuple[float, int | None]:
    last = rows.iloc[-1]
    scale = float(last.get(M.LOSS_SCALE, math.nan))
    skips = float(last.get(M.OVERFLOW_SKIPS, math.nan))
    return scale, (int(skips) if math.isfinite(scale) and math.isfinite(skips) else None)


def _last_cb0(rows: pd.DataFrame) -> float:
    finite = rows[M.FIGURE_LOSS][rows[M.FIGURE_LOSS].map(math.isfinite)]
    return float(finite.iloc[-1]) if len(finite) else math.nan


def seed_status(
    run_dir: Path, run: str, seed: int, total: int, now: float | None = None, stale_after: float = STALE_AFTER_S
) -> SeedStatus:
    """One seed's line, from its files alone."""
    now = time.time() if now is None else now
    folder = seed_dir(run_dir, seed)
    summary_path = folder / SUMMARY
    if summary_path.is_file():
        summary = read_seed_status(summary_path)  # cut, a control character, a key missing: one line
        rows = _rows(folder / M.METRICS, M.read_metrics)
        steps = int(summary["steps"])
        scale, skips = _scaler(rows) if rows is not None else (math.nan, None)
        wall = float(summary.get("wall_time_s", math.nan))
        return SeedStatus(
            run,
            seed,
            steps,
            total,
            _last_cb0(rows) if rows is not None else math.nan,
            steps / wall if wall > 0 else math.nan,
            math.nan,
            scale,
            skips,
            summary["status"],
        )
    partial = folder / M.PARTIAL
    rows = _rows(partial) if partial.is_file() else None
    if rows is None:
        return SeedStatus(run, seed, 0, total, math.nan, math.nan, math.nan, math.nan, None, "waiting")
    marks = [partial, *sorted(seed_state_dir(run_dir, seed).glob("step-*.pt"))]
    last_change = max((p.stat().st_mtime for p in marks if p.exists()), default=now)
    idle = max(0.0, now - last_change)
    step = int(rows[M.STEP].iloc[-1])
    rate = _rate(rows)
    scale, skips = _scaler(rows)
    if M.DIVERGED in rows and float(rows[M.DIVERGED].iloc[-1]) > 0:  # NaN: not marked
        status, left = DIVERGED, math.nan
    else:
        status = "stopped" if idle > stale_after else "running"
        left = (total - step) / rate if rate > 0 and status == "running" else math.nan
    return SeedStatus(run, seed, step, total, _last_cb0(rows), rate, left, scale, skips, status, idle)


def check_runs_dir(runs_dir: Path) -> bool:
    """--runs-dir names a folder (True), or nothing yet (False: before any run, every seed waits);
    a file, a broken link, a device or a FIFO is refused in one line."""
    runs_dir = Path(runs_dir)
    if runs_dir.is_dir():
        return True
    if runs_dir.exists() or runs_dir.is_symlink():
        what = "a file, not a folder" if runs_dir.is_file() else "a broken link, a device or a FIFO, not a folder"
        raise UserError(
            f"{runs_dir}: --runs-dir names {what}; name the folder training writes its runs into (default results/runs)"
        )
    return False


def collect(
    cfg: C.Config, runs_dir: Path, now: float | None = None, stale_after: float = STALE_AFTER_S
) -> list[SeedStatus]:
    """Every run (a sweep's points, else the arms) and seed of the config, in config order."""
    return [
        seed_status(Path(runs_dir) / run, run, int(seed), total, now, stale_after)
        for run, seeds, total in config_runs(cfg)
        for seed in seeds
    ]


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    seconds = int(round(seconds))
    if seconds >= 86400:
        return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _num(value: float, fmt: str) -> str:
    return format(value, fmt) if math.isfinite(value) else "-"


def table(statuses: list[SeedStatus], runs_dir: Path, stale_after: float, started: bool = True) -> str:
    """The lines `amlm status` prints; `started` False: runs_dir does not exist yet, and the first
    line says so (a mistyped --runs-dir shows there, not as a refusal)."""
    width = max([len("run")] + [len(s.run) for s in statuses])
    fp16 = any(s.overflow_skips is not None for s in statuses)
    steps = [f"{s.step}/{s.total}" for s in statuses]
    sw = max([len("step")] + [len(x) for x in steps])
    head = f"{'run':<{width}}  seed  {'step':>{sw}}  {'cb0':>6}  {'upd/s':>6}  {'left':>6}"
    head += f"  {'scale':>7}  {'skips':>5}" if fp16 else ""  # the fp16 loss scale and its overflow skips
    where = f"{runs_dir} (no such folder yet: nothing has started there)" if not started else str(runs_dir)
    lines = [
        f"{where}: {len(statuses)} seeds of {len(dict.fromkeys(s.run for s in statuses))} runs; cb0: last "
        "codebook-0 training loss (bits); stopped: no new "
        f"metrics row or state for {_duration(stale_after)} (idle time shown)",
        head + "  status",
    ]
    for s, step in zip(statuses, steps):
        line = (
            f"{s.run:<{width}}  {s.seed:>4}  {step:>{sw}}  {_num(s.cb0, '.3f'):>6}  "
            f"{_num(s.rate, '.3g'):>6}  {_duration(s.left_s):>6}"
        )
        if fp16:
            line += f"  {_num(s.loss_scale, '.4g'):>7}  {'-' if s.overflow_skips is None else s.overflow_skips:>5}"
        status = s.status + (f" {_duration(s.idle_s)}" if s.status == "stopped" else "")  # idle for
        lines.append(line + "  " + status)
    return "\n".join(lines)


def run(cfg: C.Config, runs_dir: Path, stale_after: float = STALE_AFTER_S) -> list[SeedStatus]:
    started = check_runs_dir(runs_dir)
    statuses = collect(cfg, runs_dir, stale_after=stale_after)
    print(table(statuses, runs_dir, stale_after, started), flush=True)
    return statuses
