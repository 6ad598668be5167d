"""The inexact check's thresholds of the shipped references, from measured runs of all four arms.

`amlm verify` holds a pinned run on a CPU of a vendor with a reference of its own to 0 bits; every
other run (native kernels, a vendor without a reference) is held to tolerances. This script measures
them from runs of the same preset on other machines and, with --write, stores them in every vendor's
reference.json (`tolerance_bits`, `median_tolerance_bits`, `native_tolerance_bits`,
`late_tolerance_bits`, and the numbers under `tolerance_measurement`):

- pinned, across vendors: each vendor's reference against the others', every arm;
- native: the default preset's native runs of an Intel Xeon and an AMD EPYC with AVX-512
  (tests/fixtures/native_runs/) against each vendor's reference, every arm.

Each threshold is twice the largest measured difference, rounded up (report.tolerance.tolerances_from);
a kind not measured for a preset (the smoke preset's native runs are not shipped) keeps the value its
references hold. tests/report/test_verify.py holds the shipped values equal to what this computes.

    python benchmarks/verify_tolerances.py            # the measurements and thresholds, as tables
    python benchmarks/verify_tolerances.py --write    # and into data/reference/*_run/*/reference.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from acoustic_mlm.report import tolerance, verify
from acoustic_mlm.utils import write_json

ROOT = Path(__file__).resolve().parents[1]
PRESETS = {"default_run": ROOT / "tests" / "fixtures" / "native_runs", "smoke_run": None}


def vendor_references(folder: Path) -> dict[str, tuple[pd.DataFrame, dict]]:
    """Each vendor's reference in a preset's folder: {vendor: (metrics, reference.json)}."""
    return {
        p.name: verify.load_reference(p) for p in sorted(folder.iterdir()) if p.is_dir() and (p / verify.META).exists()
    }


def _rows(metrics: pd.DataFrame, run: str) -> pd.DataFrame:
    return metrics[metrics["run"] == run]


def measure(preset: str) -> tuple[pd.DataFrame, pd.DataFrame | None, int]:
    """The pinned cross-vendor and native differences of a preset's arms, and the window's step."""
    refs = vendor_references(ROOT / "data" / "reference" / preset)
    until = {meta["tolerance_until_step"] for _, meta in refs.values()}
    if len(until) != 1:
        raise SystemExit(f"{preset}: the vendors' references disagree on tolerance_until_step: {sorted(until)}")
    until = until.pop()
    vendors = list(refs)
    pinned = {}
    for i, a in enumerate(vendors):
        for b in vendors[i + 1 :]:
            for run in refs[a][1]["arms"]:
                pinned[f"{a} against {b}, {run}"] = (_rows(refs[a][0], run), _rows(refs[b][0], run))
    native = None
    if PRESETS[preset] is not None:
        native = {}
        for machine in sorted(p for p in PRESETS[preset].iterdir() if p.is_dir()):
            for vendor, (metrics, meta) in refs.items():
                for run in meta["arms"]:
                    mine = pd.read_csv(machine / run / "metrics.csv")
                    native[f"{machine.name} native against {vendor}, {run}"] = (mine, _rows(metrics, run))
        native = tolerance.measured_differences(native, until)
    return tolerance.measured_differences(pinned, until), native, until


def _largest(frame: pd.DataFrame, column: str) -> str:
    row = frame.loc[frame[column].idxmax()]
    return f"{row[column]:.3g} bits ({row['pair']})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="store the thresholds in every vendor's reference.json")
    args = ap.parse_args(argv)
    for preset in PRESETS:
        pinned, native, until = measure(preset)
        found = tolerance.tolerances_from(pinned, native)
        print(f"## {preset} (windows split at step {until})\n")
        print(pd.concat([pinned, native], ignore_index=True).to_markdown(index=False, floatfmt=".3g"), "\n")
        print("thresholds:", json.dumps(found), "\n")
        if not args.write:
            continue
        measured = pd.concat([pinned, native], ignore_index=True).dropna(subset=["late_median"])
        measurement = {
            "pinned": f"tolerance_bits {found['tolerance_bits']:g} (largest over rows to step {until}) and "
            f"median_tolerance_bits {found['median_tolerance_bits']:g} (median over rows to step {until}): twice the "
            f"largest differences between the vendors' pinned references over the four arms, "
            f"{_largest(pinned, 'early_largest')} and {_largest(pinned, 'early_median')}",
            "late": (
                f"late_tolerance_bits {found['late_tolerance_bits']:g} (median over rows after step {until}): twice "
                f"the largest measured over the four arms, pinned and native, "
                f"{_largest(measured, 'late_median')}"
                if found["late_tolerance_bits"] is not None
                else None
            ),
        }
        if native is not None:
            measurement["native"] = (
                f"native_tolerance_bits {found['native_tolerance_bits']:g} (median over rows to step {until}): "
                f"twice the largest over the four arms of native runs (tests/fixtures/native_runs/) against each "
                f"vendor's reference, {_largest(native, 'early_median')}"
            )
        for folder in sorted((ROOT / "data" / "reference" / preset).iterdir()):
            path = folder / verify.META
            if not path.is_file():
                continue
            meta = json.loads(path.read_text())
            for key, value in found.items():
                if value is not None:
                    meta[key] = value
            old = meta.get("tolerance_measurement") or {}
            meta["tolerance_measurement"] = {
                k: (measurement.get(k) or old.get(k))
                for k in ("pinned", "native", "late")
                if measurement.get(k) or old.get(k)
            }
            write_json(path, meta)
            print(f"written: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
