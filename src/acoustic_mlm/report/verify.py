"""`amlm verify`: this installation's run against a shipped, known-good reference run.

A reference (data/reference/default_run/ for the default preset, data/reference/smoke_run/ for the
smoke preset) holds every arm's metrics rows as this package produced them, and reference.json: the
package version and commit, the machine, the command, the CPU kernels it ran with (`cpu_kernels`),
the sha256 of every data stage's outputs (`data_hashes`), each arm's settings
(train.state.fingerprint) and the tolerances, set from measured differences between machines
(docs/reproducibility.md).

`amlm verify` checks in the pipeline's order. First the data: the hashes of the synthetic audio,
the prepared audio and the codes, stage by stage; it names the first stage whose outputs differ.
With pinned kernels (`cpu_kernels: avx2`) a difference there is a failure: every x86-64 CPU with
AVX2 writes these files byte for byte alike (measured on Intel and AMD). With native kernels the
codes differ between CPUs (another vector width, other roundings in the tokenizer), which is said,
not failed. Then the curves: every loss column in bits (train_loss_cb<k> and valid_loss_cb<k>,
every codebook, every metrics row of every seed), in two windows of steps:

- up to `tolerance_until_step`, while the runs sit on the unigram plateau: with pinned kernels the
  largest difference over every row and column, held to `tolerance_bits` (rounding only: measured
  2.1e-5 bits between an Intel and an AMD CPU); with native kernels the targets themselves differ,
  so the statistic is the one below, held to `native_tolerance_bits`;
- after it, where a gradient burst in one run and not the other moves the curves apart for good,
  the **median over the rows** of each column's |difference|, the largest over the columns, held to
  `late_tolerance_bits`: one burst in one codebook's row moves a median by nothing, while a changed
  model or a wrong target moves every row.

A reference without `cpu_kernels` (recorded before the mode) holds every row to its tolerances as
the largest difference. `amlm verify --record DIR` writes a reference; its files are
acoustic_mlm.artifacts.reference_run's, the metrics' columns acoustic_mlm.artifacts.metrics's.
"""

from __future__ import annotations

import hashlib
import math
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import __version__
from acoustic_mlm import config as C
from acoustic_mlm.artifacts.metrics import LOSS_COLUMN, METRICS, read_metrics
from acoustic_mlm.artifacts.reference_run import META, read_reference_run, write_reference_run
from acoustic_mlm.artifacts.run_summary import SUMMARY, read_arm_summary
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import atomic_path, log

DEFAULT_TOLERANCE_BITS = 0.05  # a reference written without a measurement of its own (see reference.json)
# The data stages' outputs a reference hashes, in the pipeline's order: (stage, glob under the data folder).
# Only the arrays: the stages' reports beside them hold timings.
DATA_OUTPUTS = (
    ("fetch", "raw/**/*.flac"),
    ("prepare", "prepared/shard-*/audio.npy"),
    ("tokenize", "codes/shard-*/codes.npy"),
)
MAX_STATISTIC, MEDIAN_STATISTIC = "largest", "median"


REFERENCES = Path("data/reference")  # the shipped references, relative to the repository
PRESET_REFERENCE = {"smoke": "smoke_run"}  # a preset's file stem -> its reference; any other: default_run


def default_reference(config_path: str | Path) -> Path:
    """The shipped reference a configuration file is checked against: the smoke preset's for
    config/smoke.yaml, the default preset's for any other file."""
    return REFERENCES / PRESET_REFERENCE.get(Path(config_path).stem, "default_run")


def fingerprints(cfg: C.Config) -> dict:
    """Each arm's settings that shape its numbers, as training fingerprints a seed (one process)."""
    from acoustic_mlm.train.state import fingerprint

    return {run: fingerprint(cfg, run, 1)["settings"] for run in cfg.runs}


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
    path = Path(runs_dir) / run / METRICS
    if not path.is_file():
        raise UserError(f"{path}: not found; train the arm first (snakemake --cores all, or amlm train {run})")
    return read_metrics(path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def data_hashes(data_dir: Path) -> dict:
    """{stage: {path relative to data_dir: sha256}} of DATA_OUTPUTS present under data_dir."""
    data_dir = Path(data_dir)
    return {
        stage: {str(p.relative_to(data_dir)): _sha256(p) for p in sorted(data_dir.glob(pattern)) if p.is_file()}
        for stage, pattern in DATA_OUTPUTS
    }


def compare_data(mine: dict, theirs: dict) -> dict:
    """The data stages against the reference's hashes, in the pipeline's order: each stage 'same',
    'differs' (with its first differing file) or 'not here'; `first` names the first stage that differs."""
    stages, first = [], None
    for stage, _ in DATA_OUTPUTS:
        ref, here = theirs.get(stage, {}), mine.get(stage, {})
        if not ref:
            continue
        if not here:
            stages.append({"stage": stage, "outcome": "not here", "file": None})
            continue
        bad = sorted(f for f in set(ref) | set(here) if ref.get(f) != here.get(f))
        stages.append(
            {
                "stage": stage,
                "outcome": "differs" if bad else "same",
                "file": bad[0] if bad else None,
                "files": len(ref),
            }
        )
        if bad and first is None:
            first = stage
    return {"stages": stages, "first_differing_stage": first}


def run_kernels(cfg: C.Config, runs_dir: Path) -> str:
    """'pinned' when the config asks for avx2 and every arm's summary says its process ran pinned
    (a summary without the record counts as the config says); else 'native'."""
    if cfg.cpu_kernels != "avx2":
        return "native"
    for run in cfg.runs:
        path = Path(runs_dir) / run / SUMMARY
        if path.is_file():
            summary = read_arm_summary(path, required={})
            record = summary.get("cpu_kernels")
            if isinstance(record, dict) and record.get("pinned") is False:
                return "native"
    return "pinned"


def record(
    cfg: C.Config | dict,
    config_path: Path,
    runs_dir: Path,
    out_dir: Path,
    command: str,
    tolerance_bits: float = DEFAULT_TOLERANCE_BITS,
    measurement: dict | None = None,
    until_step: int | None = None,
    late_tolerance_bits: float | None = None,
    native_tolerance_bits: float | None = None,
    data_dir: Path | None = Path("data"),
) -> Path:
    """Write a reference: every arm's metrics (one CSV) and reference.json; with `until_step`, the
    rows after it are held to `late_tolerance_bits` (see the module's docstring)."""
    cfg = C.typed(cfg)
    if (until_step is None) != (late_tolerance_bits is None):
        raise UserError(
            "--until-step and --late-tolerance go together: the rows after the step need their own tolerance"
        )
    import torch

    arm_metrics = {run: _arm_metrics(runs_dir, run) for run in cfg.runs}
    import os
    import platform

    meta = {
        "package": "acoustic-mlm",
        "version": __version__,
        "commit": _git_commit(Path(__file__).resolve().parent),
        "command": command,
        "config": str(config_path),
        "config_sha256": hashlib.sha256(Path(config_path).read_bytes()).hexdigest(),
        "machine": {
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": int(cfg.train.threads),
            "device": cfg.train.device,
        },
        "tolerance_bits": float(tolerance_bits),
        "tolerance_until_step": until_step,
        "late_tolerance_bits": late_tolerance_bits,
        "native_tolerance_bits": native_tolerance_bits,
        "tolerance_measurement": measurement,
        "cpu_kernels": cfg.cpu_kernels,
        "kernels_used": run_kernels(cfg, runs_dir),
        "data_hashes": data_hashes(Path(data_dir)) if data_dir is not None and Path(data_dir).is_dir() else None,
        "arms": fingerprints(cfg),
    }
    out_dir = write_reference_run(out_dir, arm_metrics, meta)
    log.info("reference of %d arms written to %s", len(cfg.runs), out_dir)
    return out_dir


def load_reference(ref_dir: Path) -> tuple[pd.DataFrame, dict]:
    """A reference's metrics and reference.json, checked (artifacts.reference_run: a damaged
    reference is named as the reference's damage), each arm's settings under today's key names (a
    reference recorded before a key was renamed holds the same values under the old name)."""
    metrics, meta = read_reference_run(Path(ref_dir))
    meta["arms"] = {run: C.renamed_settings(settings) for run, settings in meta.get("arms", {}).items()}
    return metrics, meta


# Settings a run may hold otherwise than its reference: the kernels decide how it is compared, not whether.
COMPARED_ACROSS = ("cpu_kernels",)


def _settings_differ(mine: dict, theirs: dict) -> list[str]:
    keys = sorted((set(mine) | set(theirs)) - set(COMPARED_ACROSS))
    return [
        f"{k}: {mine.get(k, '(unset)')!r} here, {theirs.get(k, '(unset)')!r} in the reference"
        for k in keys
        if mine.get(k) != theirs.get(k)
    ]


def difference(
    mine: pd.DataFrame,
    ref: pd.DataFrame,
    steps: tuple[float, float] = (-math.inf, math.inf),
    statistic: str = MAX_STATISTIC,
) -> dict:
    """How far an arm's loss columns are from the reference's, in bits, over the rows (seed, step)
    with steps[0] < step <= steps[1]: per column the largest |difference| over the rows, or their
    median; the largest over the columns, with where it is.

    Rows are matched on seed and step; a row or column present in one only is an infinite difference
    (the runs did not take the same course), and so is a value finite in one and NaN in the other
    (in that row: a median of the column may still pass one such row, as it passes one burst).
    """
    lo, hi = steps
    ref = ref[(ref["step"] > lo) & (ref["step"] <= hi)]
    mine = mine[(mine["step"] > lo) & (mine["step"] <= hi)]
    if ref.empty and mine.empty:
        return {"bits": 0.0, "column": None, "step": None, "why": "no rows in this window"}
    key = [c for c in ("seed", "step") if c in ref.columns and c in mine.columns]
    columns = sorted(c for c in ref.columns if LOSS_COLUMN.match(c))  # the columns compared, all in bits
    missing = [c for c in columns if c not in mine.columns]
    if missing:
        return {"bits": math.inf, "column": missing[0], "step": None, "why": f"column {missing[0]} missing"}
    joined = ref[key + columns].merge(mine[key + columns], on=key, how="outer", suffixes=("_ref", ""), indicator=True)
    if (joined["_merge"] != "both").any():
        row = joined[joined["_merge"] != "both"].iloc[0]
        where = "the reference only" if row["_merge"] == "left_only" else "this run only"
        return {
            "bits": math.inf,
            "column": None,
            "step": int(row["step"]),
            "why": f"step {int(row['step'])} in {where} (rows at other steps: another schedule or a stop)",
        }
    best = {"bits": 0.0, "column": columns[0], "step": int(joined["step"].iloc[0]), "why": None}
    for c in columns:
        a, b = joined[c + "_ref"].to_numpy(float), joined[c].to_numpy(float)
        diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(a - b))
        diff = np.where(np.isnan(diff), np.inf, diff)  # NaN in one only
        i = int(np.argmax(diff))
        value = float(diff[i]) if statistic == MAX_STATISTIC else float(np.median(diff))
        if value > best["bits"]:
            best = {
                "bits": value,
                "column": c,
                "step": int(joined["step"].iloc[i]) if statistic == MAX_STATISTIC else None,
                "why": None if statistic == MAX_STATISTIC else f"median of {c} over {len(diff)} rows",
            }
    return best


def largest_difference(
    mine: pd.DataFrame, ref: pd.DataFrame, steps: tuple[float, float] = (-math.inf, math.inf)
) -> dict:
    """`difference` with the largest over the rows (every row held to the tolerance)."""
    return difference(mine, ref, steps, MAX_STATISTIC)


def windows(meta: dict, tolerance_bits: float | None = None, kernels: str = "pinned") -> list[dict]:
    """The reference's windows of steps, each with its statistic and tolerance (see the module's
    docstring); `kernels` is how this run computed ('pinned' or 'native'). --tolerance sets the
    first window's tolerance."""
    tol = float(meta.get("tolerance_bits", DEFAULT_TOLERANCE_BITS))
    until = meta.get("tolerance_until_step")
    legacy = "cpu_kernels" not in meta
    if until is None:
        return [
            {
                "name": "every step",
                "steps": (-math.inf, math.inf),
                "statistic": MAX_STATISTIC,
                "tolerance_bits": tol if tolerance_bits is None else tolerance_bits,
            }
        ]
    exact = legacy or (kernels == "pinned" and meta.get("cpu_kernels") == "avx2")
    early = {
        "name": f"steps <= {until}",
        "steps": (-math.inf, float(until)),
        "statistic": MAX_STATISTIC if exact else MEDIAN_STATISTIC,
        "tolerance_bits": tol if exact else float(meta.get("native_tolerance_bits", tol)),
    }
    if tolerance_bits is not None:
        early["tolerance_bits"] = tolerance_bits
    late = {
        "name": f"steps > {until}",
        "steps": (float(until), math.inf),
        "statistic": MAX_STATISTIC if legacy else MEDIAN_STATISTIC,
        "tolerance_bits": float(meta["late_tolerance_bits"]),
    }
    return [early, late]


def compare(
    cfg: C.Config | dict,
    runs_dir: Path,
    ref_dir: Path,
    tolerance_bits: float | None = None,
    data_dir: Path | None = Path("data"),
) -> dict:
    """The data stages' hashes, then per arm and window of steps: the difference in bits by the
    window's statistic, where it is, and whether it is within that window's tolerance."""
    cfg = C.typed(cfg)
    ref, meta = load_reference(ref_dir)
    kernels = run_kernels(cfg, runs_dir)
    wins = windows(meta, tolerance_bits, kernels)
    data = None
    if meta.get("data_hashes") and data_dir is not None and Path(data_dir).is_dir():
        data = compare_data(data_hashes(Path(data_dir)), meta["data_hashes"])
        # pinned on both sides: the data must be the reference's bytes; native: other codes are expected
        data["fails"] = bool(
            kernels == "pinned" and meta.get("cpu_kernels") == "avx2" and data["first_differing_stage"] is not None
        )
    mine_settings = fingerprints(cfg)
    arms = {}
    for run in cfg.runs:
        if run not in meta["arms"]:
            raise UserError(
                f"runs.{run}: no such arm in the reference {Path(ref_dir) / META} "
                f"(it has {', '.join(meta['arms'])}); compare a run of the reference's preset "
                f"({meta['config']})"
            )
        differ = _settings_differ(mine_settings[run], meta["arms"][run])
        if differ:
            raise UserError(
                f"runs.{run}: its settings differ from the reference's ({meta['config']}): {differ[0]}"
                + (f" (and {len(differ) - 1} more)" if len(differ) > 1 else "")
            )
        mine = _arm_metrics(runs_dir, run)
        parts = []
        for w in wins:
            got = difference(mine, ref[ref["run"] == run], w["steps"], w["statistic"])
            parts.append(
                {
                    **got,
                    "window": w["name"],
                    "tolerance_bits": w["tolerance_bits"],
                    "statistic": w["statistic"],
                    "within": got["bits"] <= w["tolerance_bits"],
                }
            )
        worst = max(parts, key=lambda p: (not p["within"], p["bits"]))
        arms[run] = {**worst, "within": all(p["within"] for p in parts), "windows": parts}
    return {
        "reference": str(ref_dir),
        "windows": wins,
        "kernels": kernels,
        "reference_kernels": meta.get("cpu_kernels"),
        "data": data,
        "passed": all(a["within"] for a in arms.values()) and not (data or {}).get("fails", False),
        "arms": arms,
        "reference_machine": meta.get("machine"),
        "reference_version": meta.get("version"),
    }


def draw(cfg: C.Config, runs_dir: Path, ref_dir: Path, result: dict, out: Path) -> Path:
    """One panel per arm: codebook-0 training loss of the reference (dashed) and of this run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from acoustic_mlm.report.figure import log_step_axis

    ref, _ = load_reference(ref_dir)
    runs = list(cfg.runs)
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
        ax.set_title(
            f"{cfg.runs[run].label}\nlargest difference {arm['bits']:.3g} bits "
            f"({verdict} {arm['tolerance_bits']:g} at {arm['window']})",
            fontsize=9,
        )
        ax.set_ylabel("codebook-0 loss (bits)")
        ax.set_xlabel("training step")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(runs) :]:
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
    lines = [
        f"against {result['reference']} (tolerance {tolerances}; "
        f"reference made by acoustic-mlm {result['reference_version']} on "
        f"{(result['reference_machine'] or {}).get('cpu', 'an unrecorded machine')}, CPU kernels "
        f"{result.get('reference_kernels') or 'not recorded'}; this run's: {result.get('kernels')})"
    ]
    data = result.get("data")
    if data:
        for st in data["stages"]:
            note = "" if st["outcome"] == "same" else f" ({st['file']})" if st["file"] else ""
            lines.append(f"data: {st['stage']:<9} {st['outcome']}{note}")
        first = data["first_differing_stage"]
        if first and data["fails"]:
            lines.append(
                f"data: the {first} stage computed other bytes than the reference's, with the same pinned "
                f"kernels: this installation's {first} stage is not the reference's (a broken or changed "
                "stage)"
            )
        elif first:
            lines.append(
                f"data: the {first} stage's outputs differ, as expected with native kernels (this CPU's own "
                "vector width; cpu_kernels: avx2 makes them the reference's bytes)"
            )
    for run, arm in result["arms"].items():
        for part in arm["windows"]:
            where = part["why"] or f"{part['column']} at step {part['step']}"
            window = f" at {part['window']}" if len(arm["windows"]) > 1 else ""
            largest = part.get("statistic", MAX_STATISTIC) == MAX_STATISTIC
            stat = "largest difference" if largest else "median difference"
            lines.append(
                f"{run:<{width}}  {stat}{window} {part['bits']:.3g} bits ({where})  "
                f"{'ok' if part['within'] else 'DIFFERS'}"
            )
    lines.append(
        "this installation trains as the reference"
        if result["passed"]
        else "some arm differs from the reference by more than the tolerance: see docs/reference_run.md"
    )
    return "\n".join(lines)


def run(
    cfg: C.Config | dict,
    runs_dir: Path,
    ref_dir: Path,
    out: Path | None,
    tolerance_bits: float | None = None,
    data_dir: Path | None = Path("data"),
) -> int:
    cfg = C.typed(cfg)
    result = compare(cfg, runs_dir, ref_dir, tolerance_bits, data_dir)
    print(report(result), flush=True)
    if out is not None:
        draw(cfg, runs_dir, ref_dir, result, out)
        print(f"figure: {out}")
    return 0 if result["passed"] else 1
