"""Training a round's planned runs with the package's own training (`train.loop.run`), one at a time,
each run's record appended to the round's tables as it finishes.

    runs.csv     one row per run (experiments.record.RUN_RECORD, the fp16 rounds' columns beside)
    curves.csv   every metrics row of every run: step, training and validation codebook-0 loss, largest
                 attention logit, gradient norm before clipping (and the fp16 loss scale)
    spikes.csv   every spike (curves.detect_spikes), with onset, peak and recovery steps

A planned run already in runs.csv is never trained again, so a killed round resumes where it stopped;
a run outside the plan is refused (experiments.record.check_plan). One writer of a round's tables at a
time (a file lock in the tables' folder); the tables are rewritten atomically.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import time
from pathlib import Path

import filelock
import numpy as np
import pandas as pd

from acoustic_mlm import curves
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import corpora, rules, sizing
from acoustic_mlm.experiments import declaration as D
from acoustic_mlm.experiments import judge as J
from acoustic_mlm.experiments import record as R
from acoustic_mlm.report import decisive
from acoustic_mlm.utils import atomic_path

log = logging.getLogger(__name__)
CURVE_COLUMNS = ["size", "arm", "lr", "seed", "step", "train_loss_cb0", "valid_loss_cb0", "attn_logit_max"]
CURVE_COLUMNS += ["grad_norm"]
SPIKE_COLUMNS = ["size", "arm", "lr", "seed", "onset_step", "peak_step", "peak_bits", "base_bits", "height_bits"]
SPIKE_COLUMNS += ["recovery_step"]
BLOCK_COLUMNS = ["size", "arm", "lr", "seed", "step", "block", "grad_norm", "update_ratio"]
BLOCKS_FROM = 6  # rounds from 6 on also write blocks.csv (the published rounds 1-5 kept three tables)
TRAINED_HERE = ("pairs", "fp16_gains", "pilot", "dose_response", "equivalence")  # the rules whose runs `run` trains


@contextlib.contextmanager
def locked(folder: Path):
    """One writer of a folder's tables at a time (filelock's lock on folder/.lock, waited for)."""
    folder.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(folder / ".lock"):
        yield


def append(path: Path, rows: pd.DataFrame, columns: list[str]) -> None:
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=columns)
    new = pd.concat([old, rows[columns]], ignore_index=True) if len(rows) else old
    with atomic_path(path) as tmp:
        new.to_csv(tmp, index=False)


def late_spikes(steps, loss, log_interval: int, warmup: int) -> list[dict]:
    """The spikes rules 2 count: on the averaged rows only (multiples of the log interval), onset after
    the warm-up (curves.detect_spikes, as every spike)."""
    steps, loss = np.asarray(steps, dtype=float), np.asarray(loss, dtype=float)
    averaged = np.isfinite(loss) & (steps % log_interval == 0)
    found = curves.detect_spikes(steps[averaged], loss[averaged], decisive.SPIKE_THRESHOLD, decisive.SPIKE_RECOVERY)
    return [s for s in found if s["onset_step"] > warmup]


def record_of(rnd: D.Round, cfg, size: str, arm: str, lr: float, seed: int, folder: Path, plateau: float, wall: float):
    """A finished run folder as the round's record: its runs.csv row, its curve rows and its spikes."""
    [row] = decisive.read_run(folder, plateau)
    m = pd.read_csv(folder / M.METRICS)
    steps, loss = m["step"].to_numpy(), m["train_loss_cb0"].to_numpy()
    finite = np.isfinite(loss)
    found = curves.detect_spikes(steps[finite], loss[finite], decisive.SPIKE_THRESHOLD, decisive.SPIKE_RECOVERY)
    late = late_spikes(steps, loss, cfg.train.log_interval, cfg.train.warmup_steps)
    below = np.flatnonzero(loss[finite] <= plateau - decisive.PLATEAU_MARGIN)
    crossed = int(steps[finite][below[0]]) if len(below) else None
    model = cfg.model_for(arm)
    logits = m["attn_logit_max"].dropna()
    key = {"size": size, "arm": arm, "lr": lr, "seed": seed}
    run = {
        "round": rnd.number,
        **key,
        "dim": model.dim,
        "layers": model.layers,
        "ffn_dim": model.ffn_dim,
        "steps": cfg.train.steps,
        "batch_size": cfg.train.batch_size,
        **{k: row[k] for k in ("norm", "attention", "clip")},
        "warmup_steps": cfg.train.warmup_steps,
        **{k: row[k] for k in ("status", "plateau", "first_loss", "final_loss", "lowest_loss", "lowest_step")},
        "cross_step": crossed,
        "left_plateau": crossed is not None,
        "trained": row["trained"],
        "collapsed": row["collapsed"],
        "spikes": len(found),
        "largest_spike_bits": max((s["height_bits"] for s in found), default=0.0),
        "late_spikes": len(late),
        "largest_late_spike_bits": max((s["height_bits"] for s in late), default=0.0),
        "nonfinite_steps": row["nonfinite_steps"],
        "max_grad_norm": row["max_grad_norm"],
        "attn_logit_max": row["attn_logit_max"],
        "attn_logit_final": float(logits.iloc[-1]) if len(logits) else math.nan,
        "wall_time_s": round(wall, 1),
    }
    curve = pd.DataFrame(
        {
            **{k: [v] * len(m) for k, v in key.items()},
            "step": m["step"],
            "train_loss_cb0": m["train_loss_cb0"],
            "valid_loss_cb0": m["valid_loss_cb0"],
            "attn_logit_max": m["attn_logit_max"],
            "grad_norm": m["grad_norm_max"],
        }
    )
    if fp16(rnd):
        run |= fp16_columns(folder, model.qk_gain)
        curve["loss_scale"] = m[M.LOSS_SCALE].to_numpy() if M.LOSS_SCALE in m else np.nan
    spikes = [{**key, **{k: s[k] for k in SPIKE_COLUMNS if k in s}} for s in found]
    return run, curve, spikes


def block_rows(folder: Path, size: str, arm: str, lr: float, seed: int, layers: int) -> pd.DataFrame:
    """Each metrics row's per-block gradient norm (before clipping) and update ratio ||dW|| / ||W||
    (train.diagnostics), one row per step and block, the blocks in model order."""
    m = pd.read_csv(folder / M.METRICS)
    parts = []
    for block in M.model_blocks(layers):
        g, u = M.grad_norm_column(block), M.update_ratio_column(block)
        if g not in m or u not in m:
            raise UserError(f"{folder / M.METRICS}: no '{g}' or '{u}' column: the round needs train.diagnostics on")
        part = pd.DataFrame({"step": m["step"], "block": block, "grad_norm": m[g], "update_ratio": m[u]})
        parts.append(part)
    rows = pd.concat(parts, ignore_index=True).sort_values(["step"], kind="stable")
    return rows.assign(size=size, arm=arm, lr=lr, seed=seed)[BLOCK_COLUMNS]


def fp16(rnd: D.Round) -> bool:
    return rnd.rules in ("fp16_gains", "pilot")


def fp16_columns(folder: Path, gain: float) -> dict:
    """What fp16_fairseq did in a run folder: the lowest loss scale, the overflow skips, the stop reason."""
    m = pd.read_csv(folder / M.METRICS)
    summary = json.loads((folder / "summary.json").read_text())
    (seed,) = summary["per_seed"].values()
    scale = m[M.LOSS_SCALE].dropna() if M.LOSS_SCALE in m else pd.Series(dtype=float)
    skips = m[M.OVERFLOW_SKIPS].dropna() if M.OVERFLOW_SKIPS in m else pd.Series(dtype=float)
    return {
        "qk_gain": gain,
        "updates": int(m[M.STEP].max()),
        "lowest_loss_scale": float(scale.min()) if len(scale) else math.nan,
        "overflow_skips": int(skips.iloc[-1]) if len(skips) else 0,
        "stop_reason": seed.get("stop_reason") or "",
    }


def remaining(rnd: D.Round) -> list[tuple[str, str, float, int]]:
    """The planned runs the round's tables lack, in plan order (the tables checked as judge checks them)."""
    if not (rnd.tables / "runs.csv").exists():
        return J.plan(rnd)
    done = J.read_round(rnd, partial=True)
    have = {(r.size, r.arm, f"{r.lr:.12g}", int(r.seed)) for r in done.itertuples()}
    return [(s, a, lr, seed) for s, a, lr, seed in J.plan(rnd) if (s, a, f"{lr:.12g}", seed) not in have]


def planned_run(rnd: D.Round, key: str) -> tuple[str, str, float, int]:
    """The planned run a key CELL/ARM/LR/SEED names (as run_name writes it), or one UserError line."""
    for run in J.plan(rnd):
        if run_key(*run) == key:
            return run
    raise UserError(f"{rnd.path}: --only {key!r} is not a run of the round's plan (amlm experiment plan lists them)")


def run_key(cell: str, arm: str, lr: float, seed: int) -> str:
    """A planned run as --only names it: CELL/ARM/LR/SEED."""
    return f"{cell}/{arm}/{lr:.12g}/{seed}"


def run_name(cell: str, arm: str, lr: float, seed: int) -> str:
    """A planned run's name: its folder under the work folder, and its Snakemake job's marker."""
    return f"{cell}__{arm}__lr-{lr:g}__seed-{seed}"


def train_one(rnd: D.Round, run: tuple[str, str, float, int], work: Path):
    """Train one planned run (`train.loop.run`) in work/runs/<its name>, started over if a run was cut
    there midway: its record (record_of) and its configuration."""
    from acoustic_mlm.train import loop as train

    size, arm, lr, seed = run
    prepared, codes, plateau = corpora.data_for(rnd.corpus, work)
    cell = J.cell_of(rnd, size)
    # a cell whose gain its pilot gives (fp16 rounds' low cell) trains at the pilot's gain
    gain = rules.gains(rnd)[0] if fp16(rnd) and "gain" not in rnd.cells[cell] else None
    cfg = D.settings(rnd, arm, cell, seed, lr=lr, gain=gain)
    folder = Path(work) / "runs" / run_name(*run)
    shutil.rmtree(folder, ignore_errors=True)  # a run killed midway starts over: its row was never written
    t0 = time.perf_counter()
    train.run(cfg, arm, prepared, codes, folder, threads=cfg.train.threads)
    return record_of(rnd, cfg, size, arm, lr, seed, folder, plateau, time.perf_counter() - t0), folder


def train_missing(rnd: D.Round, run: tuple[str, str, float, int], work: Path) -> dict | None:
    """One planned run, unless the round's tables hold it: trained, its record appended to the tables.
    Its runs.csv row, or None when the tables held it (another runner may have trained it meanwhile)."""
    with locked(rnd.tables):
        if run not in remaining(rnd):
            return None
    (row, curve, spikes), folder = train_one(rnd, run, work)
    tables = rnd.tables
    with locked(tables):
        append(tables / "runs.csv", pd.DataFrame([row]), [c.name for c in R.columns(fp16(rnd))])
        append(tables / "curves.csv", curve, CURVE_COLUMNS + (["loss_scale"] if fp16(rnd) else []))
        append(tables / "spikes.csv", pd.DataFrame(spikes, columns=SPIKE_COLUMNS), SPIKE_COLUMNS)
        if rnd.number >= BLOCKS_FROM:
            append(tables / "blocks.csv", block_rows(folder, *run, int(row["layers"])), BLOCK_COLUMNS)
    log.info("%s %s lr %g seed %d: final %.3f, trained %s", *run, row["final_loss"], row["trained"])
    return row


def run_round(
    path: Path,
    work: Path,
    limit: int | None = None,
    shard: tuple[int, int] | None = None,
    only: str | None = None,
) -> list[dict]:
    """Train the round's planned runs that its tables lack (at most `limit`), in plan order; each run's
    record appended as it finishes. With `shard` (k, n) only the planned runs whose place in the plan is
    k modulo n: n runners side by side, one per shard, never train one run twice. Returns the rows
    written. With `only` (CELL/ARM/LR/SEED), that one planned run (Snakemake's route: one job a run).
    A sizing round runs its procedure (experiments.sizing), which picks each run from the runs before it.
    """
    rnd = D.load(path)
    if rnd.rules == "sizing" and rnd.base is not None:
        if shard is not None or only is not None:
            raise UserError(
                f"{path}: 'rules' is sizing: its procedure picks each run from the runs before it, so "
                "--shard and --only do not apply; run it whole (amlm experiment run, --limit to stop early)"
            )
        return sizing.procedure(rnd, lambda run: train_missing(rnd, run, Path(work)), limit)
    if rnd.base is None or rnd.rules not in TRAINED_HERE:
        raise UserError(
            f"{path}: 'rules' is {rnd.rules}: its runs are trained elsewhere (the declaration says where); "
            "amlm experiment run trains the rounds of " + ", ".join(TRAINED_HERE) + " and runs the sizing procedure"
        )
    todo = remaining(rnd)
    if only is not None:
        todo = [run for run in todo if run == planned_run(rnd, only)]
    if shard is not None:
        k, n = shard
        place = {run: i for i, run in enumerate(J.plan(rnd))}
        todo = [run for run in todo if place[run] % n == k]
    written = [train_missing(rnd, run, Path(work)) for run in todo[:limit]]
    return [row for row in written if row is not None]
