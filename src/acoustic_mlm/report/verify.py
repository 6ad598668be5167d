"""`amlm verify`: this installation's run against a shipped, known-good reference run.

A reference (data/reference/default_run/ for the default preset, data/reference/smoke_run/ for the
smoke preset) holds every arm's metrics rows as this package produced them, and reference.json: the
package version and commit, the machine, the command, each arm's settings (train.state.fingerprint) and
the tolerance in bits, set from measured differences between runs (docs/reference_run.md).

`amlm verify` compares every loss column in bits (train_loss_cb<k> and valid_loss_cb<k>, every
codebook, every metrics row of every seed) of results/runs/<arm>/metrics.csv with the reference,
prints per arm the largest difference (and where), draws the codebook-0 curves of both, and exits 1
when an arm differs by more than the tolerance. `amlm verify --record DIR` writes a reference.

Two windows of steps. Up to `tolerance_until_step` the runs of two machines agree to rounding
(measured: a few millionths of a bit), so `tolerance_bits` is tight there and any installation
problem shows at once. After it, rounding differences grown by training's own dynamics (a
gradient burst in one run and not the other, leaving the unigram plateau a few steps earlier)
move the curves apart by tenths of a bit (measured on the default preset: up to 0.47 bits between
two CPUs' code paths), so the later rows are held to `late_tolerance_bits`, which still catches a
divergence or a broken run. A
reference without `tolerance_until_step` holds every row to `tolerance_bits`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import __version__
from acoustic_mlm import config as C
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import atomic_path, log, write_json

METRICS = "metrics.csv"  # every arm's rows, with a `run` column
META = "reference.json"
LOSS = re.compile(r"^(train|valid)_loss_cb\d+$")  # the columns compared, all in bits
DEFAULT_TOLERANCE_BITS = 0.05  # a reference written without a measurement of its own (see reference.json)


def fingerprints(cfg: dict) -> dict:
    """Each arm's settings that shape its numbers, as training fingerprints a seed (one process)."""
    from acoustic_mlm.train.state import fingerprint

    return {run: fingerprint(cfg, run, 1)["settings"] for run in cfg["runs"]}


def _git_commit(where: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or None


def _arm_metrics(runs_dir: Path, run: str) -> pd.DataFrame:
    path = Path(runs_dir) / run / "metrics.csv"
    if not path.is_file():
        raise UserError(f"{path}: not found; train the arm first (snakemake --cores all, or amlm train {run})")
    return pd.read_csv(path)


def record(cfg: dict, config_path: Path, runs_dir: Path, out_dir: Path, command: str,
           tolerance_bits: float = DEFAULT_TOLERANCE_BITS, measurement: dict | None = None,
           until_step: int | None = None, late_tolerance_bits: float | None = None) -> Path:
    """Write a reference: every arm's metrics (one CSV) and reference.json; with `until_step`, the
    rows after it are held to `late_tolerance_bits` (see the module's docstring)."""
    if (until_step is None) != (late_tolerance_bits is None):
        raise UserError("--until-step and --late-tolerance go together: the rows after the step need their own tolerance")
    import torch

    frames = [_arm_metrics(runs_dir, run).assign(run=run) for run in cfg["runs"]]
    metrics = pd.concat(frames, ignore_index=True)
    metrics = metrics[["run"] + [c for c in metrics.columns if c != "run"]]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / METRICS) as tmp:
        metrics.to_csv(tmp, index=False)  # full precision: a deterministic rerun matches to the bit
    import os
    import platform

    meta = {
        "package": "acoustic-mlm", "version": __version__,
        "commit": _git_commit(Path(__file__).resolve().parent),
        "command": command,
        "config": str(config_path),
        "config_sha256": hashlib.sha256(Path(config_path).read_bytes()).hexdigest(),
        "machine": {"cpu": _cpu_model(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "torch_threads": int(cfg["train"]["threads"]), "device": cfg["train"]["device"]},
        "tolerance_bits": float(tolerance_bits),
        "tolerance_until_step": until_step,
        "late_tolerance_bits": late_tolerance_bits,
        "tolerance_measurement": measurement,
        "arms": fingerprints(cfg),
    }
    write_json(out_dir / META, meta)
    log.info("reference of %d arms written to %s", len(cfg["runs"]), out_dir)
    return out_dir


def load_reference(ref_dir: Path) -> tuple[pd.DataFrame, dict]:
    """A reference's metrics and reference.json, each arm's settings under today's key names (a
    reference recorded before a key was renamed holds the same values under the old name)."""
    ref_dir = Path(ref_dir)
    for name in (METRICS, META):
        if not (ref_dir / name).is_file():
            raise UserError(f"{ref_dir / name}: not found; a reference folder holds {METRICS} and {META}")
    meta = json.loads((ref_dir / META).read_text())
    meta["arms"] = {run: C.renamed_settings(settings) for run, settings in meta.get("arms", {}).items()}
    return pd.read_csv(ref_dir / METRICS), meta


def _settings_differ(mine: dict, theirs: dict) -> list[str]:
    keys = sorted(set(mine) | set(theirs))
    return [f"{k}: {mine.get(k, '(unset)')!r} here, {theirs.get(k, '(unset)')!r} in the reference"
            for k in keys if mine.get(k) != theirs.get(k)]


def largest_difference(mine: pd.DataFrame, ref: pd.DataFrame, steps: tuple[float, float] = (-math.inf, math.inf)) -> dict:
    """The largest |difference| in bits over every loss column and every (seed, step) of an arm
    with steps[0] < step <= steps[1].

    Rows are matched on seed and step; a row or column present in one only, or a value finite in
    one and NaN in the other, is an infinite difference (the runs did not take the same course).
    """
    lo, hi = steps
    ref = ref[(ref["step"] > lo) & (ref["step"] <= hi)]
    mine = mine[(mine["step"] > lo) & (mine["step"] <= hi)]
    if ref.empty and mine.empty:
        return {"bits": 0.0, "column": None, "step": None, "why": "no rows in this window"}
    key = [c for c in ("seed", "step") if c in ref.columns and c in mine.columns]
    columns = sorted(c for c in ref.columns if LOSS.match(c))
    missing = [c for c in columns if c not in mine.columns]
    if missing:
        return {"bits": math.inf, "column": missing[0], "step": None, "why": f"column {missing[0]} missing"}
    joined = ref[key + columns].merge(mine[key + columns], on=key, how="outer", suffixes=("_ref", ""), indicator=True)
    if (joined["_merge"] != "both").any():
        row = joined[joined["_merge"] != "both"].iloc[0]
        where = "the reference only" if row["_merge"] == "left_only" else "this run only"
        return {"bits": math.inf, "column": None, "step": int(row["step"]),
                "why": f"step {int(row['step'])} in {where} (rows at other steps: another schedule or a stop)"}
    best = {"bits": 0.0, "column": columns[0], "step": int(joined["step"].iloc[0]), "why": None}
    for c in columns:
        a, b = joined[c + "_ref"].to_numpy(float), joined[c].to_numpy(float)
        both_nan = np.isnan(a) & np.isnan(b)
        diff = np.where(both_nan, 0.0, np.abs(a - b))
        diff = np.where(np.isnan(diff), np.inf, diff)  # NaN in one only
        i = int(np.argmax(diff))
        if diff[i] > best["bits"]:
            best = {"bits": float(diff[i]), "column": c, "step": int(joined["step"].iloc[i]), "why": None}
    return best


def windows(meta: dict, tolerance_bits: float | None = None) -> list[dict]:
    """The reference's windows of steps, each with its tolerance: every step, or up to
    `tolerance_until_step` and after it (see the module's docstring). --tolerance sets the first."""
    tol = float(meta.get("tolerance_bits", DEFAULT_TOLERANCE_BITS)) if tolerance_bits is None else tolerance_bits
    until = meta.get("tolerance_until_step")
    if until is None:
        return [{"name": "every step", "steps": (-math.inf, math.inf), "tolerance_bits": tol}]
    return [{"name": f"steps <= {until}", "steps": (-math.inf, float(until)), "tolerance_bits": tol},
            {"name": f"steps > {until}", "steps": (float(until), math.inf),
             "tolerance_bits": float(meta["late_tolerance_bits"])}]


def compare(cfg: dict, runs_dir: Path, ref_dir: Path, tolerance_bits: float | None = None) -> dict:
    """Per arm and window of steps: the largest difference in bits, where it is, and whether it is
    within that window's tolerance."""
    ref, meta = load_reference(ref_dir)
    wins = windows(meta, tolerance_bits)
    mine_settings = fingerprints(cfg)
    arms = {}
    for run in cfg["runs"]:
        if run not in meta["arms"]:
            raise UserError(f"runs.{run}: no such arm in the reference {Path(ref_dir) / META} "
                            f"(it has {', '.join(meta['arms'])}); compare a run of the reference's preset ({meta['config']})")
        differ = _settings_differ(mine_settings[run], meta["arms"][run])
        if differ:
            raise UserError(f"runs.{run}: its settings differ from the reference's ({meta['config']}): {differ[0]}"
                            + (f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""))
        mine = _arm_metrics(runs_dir, run)
        parts = []
        for w in wins:
            got = largest_difference(mine, ref[ref["run"] == run], w["steps"])
            parts.append({**got, "window": w["name"], "tolerance_bits": w["tolerance_bits"],
                          "within": got["bits"] <= w["tolerance_bits"]})
        worst = max(parts, key=lambda p: (not p["within"], p["bits"]))
        arms[run] = {**worst, "within": all(p["within"] for p in parts), "windows": parts}
    return {"reference": str(ref_dir), "windows": wins,
            "passed": all(a["within"] for a in arms.values()), "arms": arms,
            "reference_machine": meta.get("machine"), "reference_version": meta.get("version")}


def draw(cfg: dict, runs_dir: Path, ref_dir: Path, result: dict, out: Path) -> Path:
    """One panel per arm: codebook-0 training loss of the reference (dashed) and of this run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from acoustic_mlm.report.figure import log_step_axis

    ref, _ = load_reference(ref_dir)
    runs = list(cfg["runs"])
    cols = min(2, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    for ax, run in zip(axes.flat, runs):
        mine = _arm_metrics(runs_dir, run)
        theirs = ref[ref["run"] == run]
        for seed, g in theirs.groupby("seed"):
            ax.plot(g["step"], g["train_loss_cb0"], "k--", lw=1.5, label=f"reference, seed {seed}")
        for seed, g in mine.groupby("seed"):
            ax.plot(g["step"], g["train_loss_cb0"], lw=1.0, label=f"this run, seed {seed}")
        steps = pd.concat([theirs["step"], mine["step"]])
        log_step_axis(ax, float(steps.min()), float(steps.max()))
        arm = result["arms"][run]
        verdict = "within" if arm["within"] else "OUTSIDE"
        ax.set_title(f"{cfg['runs'][run].get('label', run)}\nlargest difference {arm['bits']:.3g} bits "
                     f"({verdict} {arm['tolerance_bits']:g} at {arm['window']})", fontsize=9)
        ax.set_ylabel("codebook-0 loss (bits)")
        ax.set_xlabel("training step")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(runs):]:
        ax.set_visible(False)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=150)
    plt.close(fig)
    return out


def report(result: dict) -> str:
    """The lines `amlm verify` prints: one per arm, then the verdict."""
    width = max(len(r) for r in result["arms"])
    tolerances = ", ".join(f"{w['tolerance_bits']:g} bits at {w['name']}" for w in result["windows"])
    lines = [f"against {result['reference']} (tolerance {tolerances}; "
             f"reference made by acoustic-mlm {result['reference_version']} on "
             f"{(result['reference_machine'] or {}).get('cpu', 'an unrecorded machine')})"]
    for run, arm in result["arms"].items():
        for part in arm["windows"]:
            where = part["why"] or f"{part['column']} at step {part['step']}"
            window = f" at {part['window']}" if len(arm["windows"]) > 1 else ""
            lines.append(f"{run:<{width}}  largest difference{window} {part['bits']:.3g} bits ({where})  "
                         f"{'ok' if part['within'] else 'DIFFERS'}")
    lines.append("this installation trains as the reference" if result["passed"] else
                 "some arm differs from the reference by more than the tolerance: see docs/reference_run.md")
    return "\n".join(lines)


def run(cfg: dict, runs_dir: Path, ref_dir: Path, out: Path | None, tolerance_bits: float | None = None) -> int:
    result = compare(cfg, runs_dir, ref_dir, tolerance_bits)
    print(report(result), flush=True)
    if out is not None:
        draw(cfg, runs_dir, ref_dir, result, out)
        print(f"figure: {out}")
    return 0 if result["passed"] else 1
