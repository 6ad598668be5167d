"""`amlm verify`: this installation's run against a shipped, known-good reference run.

A preset's references (data/reference/default_run/ for the default preset, data/reference/smoke_run/
for the smoke preset) are one per CPU vendor, in subfolders named by the vendor string the CPU reports
(`GenuineIntel`, `AuthenticAMD`). Each holds every arm's metrics rows as this package produced them on
a CPU of that vendor, and reference.json: the package version and commit, the machine (its vendor
included), the command, the CPU kernels it ran with (`cpu_kernels`), the sha256 of every data stage's
outputs (`data_hashes`), each arm's settings (train.state.fingerprint) and the tolerances of the
inexact check, set from measured differences between machines (docs/reference_run.md).

`amlm verify` checks in the pipeline's order. First the data: the hashes of the synthetic audio,
the prepared audio and the codes, stage by stage; it names the first stage whose outputs differ.
With pinned kernels (`cpu_kernels: avx2`) a difference there is a failure: every x86-64 CPU with
AVX2 writes these files byte for byte alike (measured on Intel and AMD). With native kernels the
codes differ between CPUs, which is said, not failed. Then the curves: every loss column in bits
(train_loss_cb<k> and valid_loss_cb<k>, every codebook, every metrics row of every seed).

- **Exact**, a pinned run on a CPU of a vendor with a reference of its own: every row of every
  column must equal that reference's to the bit (0 bits), to the last step. Pinned runs on two CPUs
  of one vendor are identical (measured: two AMD EPYCs, AVX2 only and AVX-512, every value; the
  Intel reference's machine against itself); the vendors differ by MKL's matrix products (sgemm),
  which keep one code path for Intel and another for other CPUs (benchmarks/kernel_fingerprint.py).
- **By tolerance**, anything else (native kernels, a CPU whose vendor has no reference, a machine
  that reports no vendor), against the primary reference (GenuineIntel's), in two windows of steps:
  up to `tolerance_until_step` a pinned run is held row by row to `tolerance_bits` (the largest
  cross-vendor difference of the four arms, doubled), a native run by the median over the rows of
  each column to `native_tolerance_bits`; after it, every run by that median to
  `late_tolerance_bits` (one burst in one run and not the other moves a median by nothing, while a
  changed model or a wrong target moves every row). It prints why it is not exact and the size of
  defect it can and cannot see.

A reference without `cpu_kernels` (recorded before the mode) holds every row to its tolerances as
the largest difference. `amlm verify --record DIR` writes a reference of this machine's vendor; its
files are acoustic_mlm.artifacts.reference_run's, the metrics' columns acoustic_mlm.artifacts.metrics's.
"""

from __future__ import annotations

import hashlib
import math
import subprocess
from pathlib import Path

import pandas as pd

from acoustic_mlm import __version__
from acoustic_mlm import config as C
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.reference_run import (
    META,
    REFERENCE_RUN,
    ReferenceDamaged,
    read_reference_run,
    write_reference_run,
)
from acoustic_mlm.artifacts.run_summary import SUMMARY
from acoustic_mlm.config.differ import first_difference
from acoustic_mlm.errors import UserError
from acoustic_mlm.report.runs import arm_metrics as read_arm_metrics
from acoustic_mlm.report.runs import recorded_settings, recorded_summary
from acoustic_mlm.report.tolerance import (  # the inexact check's measure and windows, and what exactness needs
    DEFAULT_TOLERANCE_BITS,
    MAX_STATISTIC,
    difference,
    exact_windows,
    exactness,
    sees,
    windows,
)
from acoustic_mlm.utils import atomic_path, log

# The data stages' outputs a reference hashes, in the pipeline's order: (stage, glob under the data folder).
# Only the arrays: the stages' reports beside them hold timings.
DATA_OUTPUTS = (
    ("fetch", "raw/**/*.flac"),
    ("prepare", "prepared/shard-*/audio.npy"),
    ("tokenize", "codes/shard-*/codes.npy"),
)


REFERENCES = Path("data/reference")  # the shipped references, relative to the repository
PRESET_REFERENCE = {"smoke": "smoke_run"}  # a preset's file stem -> its reference; any other: default_run
# The reference a CPU without one of its own vendor is compared with, by tolerance: the first recorded.
PRIMARY_VENDOR = "GenuineIntel"


def default_reference(config_path: str | Path) -> Path:
    """The shipped references a configuration file is checked against (one per CPU vendor): the
    smoke preset's for config/smoke.yaml, the default preset's for any other file."""
    return REFERENCES / PRESET_REFERENCE.get(Path(config_path).stem, "default_run")


def cpu_vendor(cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """This CPU's vendor string as the kernel reports it (x86: `vendor_id`, e.g. GenuineIntel,
    AuthenticAMD); None where none is reported (another architecture or operating system)."""
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id" and value.strip():
                return value.strip()
    except OSError:
        pass
    return None


def reference_for(folder: str | Path, vendor: str | None) -> tuple[Path, bool]:
    """The reference in `folder` a CPU of `vendor` is checked against, and whether it is that
    vendor's own: a folder holding reference.json is one reference (a recorded one: its own vendor
    decides); a folder of vendor subfolders gives this vendor's, else the primary vendor's. This
    vendor's subfolder, once present, is its reference whatever it holds: one incomplete is refused
    by the file it lacks (read_reference_run), never passed over for another vendor's."""
    folder = Path(folder)
    if (folder / META).exists() or not folder.is_dir():
        return folder, True  # one reference (read_reference_run names what is missing)
    if vendor is not None and (folder / vendor).is_dir():
        return folder / vendor, True
    vendors = sorted(p.name for p in folder.iterdir() if p.is_dir() and (p / META).exists())
    if not vendors:
        return folder, True  # neither: read_reference_run refuses it by name
    return folder / (PRIMARY_VENDOR if PRIMARY_VENDOR in vendors else vendors[0]), False


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


def _arm_metrics(runs_dir: Path, run: str, config: str | None = None) -> pd.DataFrame:
    """An arm's metrics.csv (runs.arm_metrics); one missing is one line saying how to train it."""
    preset = f" --configfile {config}" if config and config != "config" else ""
    option = f" --config {config}" if config and config != "config" else ""
    advice = f"train the arm first (snakemake --cores all{preset}, or amlm train {run}{option})"
    return read_arm_metrics(Path(runs_dir) / run, advice)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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
        record = (recorded_summary(Path(runs_dir) / run) or {}).get("cpu_kernels")
        if isinstance(record, dict) and record.get("pinned") is False:
            return "native"
    return "pinned"


def _recorded_threads(cfg: C.Config, runs_dir: Path) -> int:
    """The torch threads the arms trained with, as their summaries record it (train.threads or
    --threads); train.threads where no arm records it. Arms trained with different counts are refused:
    a reference holds one."""
    counts = {(recorded_summary(Path(runs_dir) / run) or {}).get("torch_threads") for run in cfg.runs} - {None}
    if len(counts) > 1:
        raise UserError(
            f"{runs_dir}: the arms trained with {', '.join(map(str, sorted(counts)))} torch threads; a reference "
            "holds one count: train them again with one --threads"
        )
    return int(counts.pop()) if counts else int(cfg.train.threads)


def record(
    cfg: C.Config,
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
    if (until_step is None) != (late_tolerance_bits is None):
        raise UserError(
            "--until-step and --late-tolerance go together: the rows after the step need their own tolerance"
        )
    out_dir = Path(out_dir)
    if out_dir.is_dir() and not (out_dir / META).exists():
        held = sorted(p.name for p in out_dir.iterdir() if p.is_dir() and (p / META).exists())
        if held:
            raise UserError(
                f"{out_dir}: a folder of per-vendor references ({', '.join(held)}); a reference recorded "
                f"into it would shadow them all: name this vendor's subfolder ({out_dir / (cpu_vendor() or 'VENDOR')}) "
                "or a new folder"
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
            "vendor": cpu_vendor(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": _recorded_threads(cfg, runs_dir),
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
    hashes = meta.get("data_hashes")
    lacking = [stage for stage, _ in DATA_OUTPUTS if hashes is not None and stage not in hashes]
    if lacking:
        raise ReferenceDamaged(
            f"{Path(ref_dir) / META}: 'data_hashes' has no entry for the {lacking[0]} stage (a reference "
            f"hashes every data stage, an empty entry when it had none); {REFERENCE_RUN}"
        )
    meta["arms"] = {run: C.renamed_settings(settings) for run, settings in meta.get("arms", {}).items()}
    return metrics, meta


# Settings a run may hold otherwise than its reference: the kernels decide how it is compared, not whether.
COMPARED_ACROSS = ("cpu_kernels",)


def _settings_differ(mine: dict, theirs: dict) -> str | None:
    """The first setting that differs from the reference's (config.differ), as one clause, or None."""
    d = first_difference(mine, theirs, ignore=COMPARED_ACROSS)
    if d is None:
        return None
    return f"{d.key}: {d.mine!r} here, {d.theirs!r} in the reference{d.and_more()}"


def _check_arm(cfg: C.Config, run: str, settings: dict, meta: dict, ref_dir: Path, runs_dir: Path) -> pd.DataFrame:
    """The arm's metrics rows, once it is known to be the reference's arm, trained with the
    reference's settings (the configuration's, `settings`, and the run's own record) and trained to
    the end."""
    if run not in meta["arms"]:
        raise UserError(
            f"runs.{run}: no such arm in the reference {Path(ref_dir) / META} "
            f"(it has {', '.join(meta['arms'])}); compare a run of the reference's preset "
            f"({meta['config']})"
        )
    differ = _settings_differ(settings, meta["arms"][run])
    if differ:
        raise UserError(f"runs.{run}: its settings differ from the reference's ({meta['config']}): {differ}")
    recorded = recorded_settings(Path(runs_dir) / run)
    if recorded is not None:
        differ = _settings_differ(C.renamed_settings(recorded), meta["arms"][run])
        if differ:
            raise UserError(
                f"{Path(runs_dir) / run / SUMMARY}: this run was trained with other settings than the "
                f"reference's and the configuration's: {differ}; train it again with {cfg.source}"
            )
    threads = (recorded_summary(Path(runs_dir) / run) or {}).get("torch_threads")
    ref_threads = (meta.get("machine") or {}).get("torch_threads")
    if isinstance(threads, int) and isinstance(ref_threads, int) and threads != ref_threads:
        raise UserError(
            f"{Path(runs_dir) / run / SUMMARY}: this run trained with {threads} torch threads, the reference "
            f"with {ref_threads}: the thread count changes the bits (reductions are split otherwise), not the "
            f"installation; train it again with --threads {ref_threads} (or train.threads: {ref_threads})"
        )
    mine = _arm_metrics(runs_dir, run, cfg.source)
    steps = cfg.train.steps
    for seed, rows in mine.groupby(M.SEED, sort=False) if M.SEED in mine.columns else [(None, mine)]:
        last = rows.iloc[-1]
        diverged = M.DIVERGED in rows.columns and pd.notna(last[M.DIVERGED]) and last[M.DIVERGED] > 0
        if not diverged and int(last[M.STEP]) < steps:
            which = f", seed {seed}," if seed is not None else ""
            raise UserError(
                f"{Path(runs_dir) / run / M.METRICS}: ends{which} at step {int(last[M.STEP])}, not at train.steps "
                f"({steps}), and is not marked diverged: the run is unfinished or its file lost rows; finish "
                "or train it again, then verify"
            )
    return mine


def _check_data(data_dir: Path | None, meta: dict, strict: bool) -> dict | None:
    """The data stages' hashes against the reference's; `fails` when the bytes must be equal
    (pinned on both sides) and a stage differs or is not here to be checked."""
    if data_dir is None or not meta.get("data_hashes"):
        return None
    if not Path(data_dir).is_dir():
        raise UserError(
            f"--data {data_dir}: no such folder; name the data folder the run was trained from "
            "(its stages' outputs are checked against the reference's hashes)"
        )
    data = compare_data(data_hashes(Path(data_dir)), meta["data_hashes"])
    missing = next((st["stage"] for st in data["stages"] if st["outcome"] == "not here"), None)
    data["not_here"] = missing
    data["fails"] = bool(strict and (data["first_differing_stage"] is not None or missing is not None))
    return data


def compare(
    cfg: C.Config,
    runs_dir: Path,
    ref_dir: Path,
    tolerance_bits: float | None = None,
    data_dir: Path | None = Path("data"),
    vendor: str | None = None,
) -> dict:
    """The data stages' hashes, then per arm and window of steps: the difference in bits by the
    window's statistic, where it is, and whether it is within that window's tolerance. `ref_dir` is
    one reference or a folder of one per vendor; `vendor` is this CPU's (default: cpu_vendor())."""
    vendor = cpu_vendor() if vendor is None else vendor or None
    ref_dir, own = reference_for(ref_dir, vendor)
    ref, meta = load_reference(ref_dir)
    kernels = run_kernels(cfg, runs_dir)
    exact, why = exactness(meta, kernels, vendor, own)
    wins = exact_windows(tolerance_bits) if exact else windows(meta, tolerance_bits, kernels)
    pinned_both = kernels == "pinned" and meta.get("cpu_kernels") == "avx2"
    arms = {}
    mine = fingerprints(cfg)  # every arm's settings, computed once
    checked = {run: _check_arm(cfg, run, mine[run], meta, ref_dir, runs_dir) for run in cfg.runs}
    data = _check_data(data_dir, meta, strict=pinned_both)
    for run, mine in checked.items():
        parts = []
        for w in wins:
            got = difference(mine, ref[ref[M.RUN] == run], w["steps"], w["statistic"])
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
        "exact": exact,
        "why": why,
        "sees": None if exact else sees(wins),
        "vendor": vendor,
        "windows": wins,
        "kernels": kernels,
        "reference_kernels": meta.get("cpu_kernels"),
        "data": data,
        "passed": all(a["within"] for a in arms.values()) and not (data or {}).get("fails", False),
        "arms": arms,
        "reference_machine": meta.get("machine"),
        "reference_version": meta.get("version"),
    }


def draw(cfg: C.Config, runs_dir: Path, result: dict, out: Path) -> Path:
    """One panel per arm: codebook-0 training loss of the reference `compare` used (dashed) and of
    this run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from acoustic_mlm.report.figure import log_step_axis

    ref, _ = load_reference(Path(result["reference"]))
    runs = list(cfg.runs)
    cols = min(2, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    for ax, run in zip(axes.flat, runs):
        mine = _arm_metrics(runs_dir, run)
        theirs = ref[ref[M.RUN] == run]
        for seed, g in theirs.groupby(M.SEED):
            ax.plot(g[M.STEP], g[M.FIGURE_LOSS], "k--", lw=1.5, label=f"reference, seed {seed}")
        for seed, g in mine.groupby(M.SEED):
            ax.plot(g[M.STEP], g[M.FIGURE_LOSS], lw=1.0, label=f"this run, seed {seed}")
        steps = pd.concat([theirs[M.STEP], mine[M.STEP]])
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
    """The lines `amlm verify` prints: the reference and how it is compared, the data stages, one
    line per arm and window, then the verdict."""
    width = max(len(r) for r in result["arms"])
    tolerances = ", ".join(f"{w['tolerance_bits']:g} bits at {w['name']}" for w in result["windows"])
    lines = [
        f"against {result['reference']} (tolerance {tolerances}; "
        f"reference made by acoustic-mlm {result['reference_version']} on "
        f"{(result['reference_machine'] or {}).get('cpu', 'an unrecorded machine')}, CPU kernels "
        f"{result.get('reference_kernels') or 'not recorded'}; this run's: {result.get('kernels')})"
    ]
    if result.get("exact"):
        lines.append(f"exact: {result['why']}")
    elif result.get("why"):
        lines.append(f"not exact: {result['why']}")
        lines.append(f"by tolerance (measured between machines on all four arms): {result['sees']}")
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
        if data.get("not_here"):
            lines.append(
                f"data: the {data['not_here']} stage's outputs are not in the data folder, so they were not "
                "checked" + (": a pinned run must show every stage (--data names the folder)" if data["fails"] else "")
            )
    for run, arm in result["arms"].items():
        for part in arm["windows"]:
            where = part["why"] or f"{part['column']} at step {part['step']}"
            if part["bits"] == 0 and part.get("statistic", MAX_STATISTIC) == MAX_STATISTIC:
                where = "every row equal"
            window = f" at {part['window']}" if len(arm["windows"]) > 1 else ""
            largest = part.get("statistic", MAX_STATISTIC) == MAX_STATISTIC
            stat = "largest difference" if largest else "median difference"
            lines.append(
                f"{run:<{width}}  {stat}{window} {part['bits']:.3g} bits ({where})  "
                f"{'ok' if part['within'] else 'DIFFERS'}"
            )
    if result["passed"]:
        lines.append(
            "this installation trains as the reference"
            + (", bit for bit" if result.get("exact") else ", within the tolerances above")
        )
    else:
        lines.append("some arm differs from the reference by more than the tolerance: see docs/reference_run.md")
    return "\n".join(lines)


def run(
    cfg: C.Config,
    runs_dir: Path,
    ref_dir: Path,
    out: Path | None,
    tolerance_bits: float | None = None,
    data_dir: Path | None = Path("data"),
) -> int:
    result = compare(cfg, runs_dir, ref_dir, tolerance_bits, data_dir)
    print(report(result), flush=True)
    if out is not None:
        draw(cfg, runs_dir, result, out)
        print(f"figure: {out}")
    return 0 if result["passed"] else 1
