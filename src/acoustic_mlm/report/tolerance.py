"""The inexact check of `amlm verify` (report.verify): how far a run's loss columns are from a reference's,
in bits, in which windows of steps and by which statistic, the tolerances measured between machines
(benchmarks/verify_tolerances.py), and when a run is held exactly instead.

    difference            per column the largest |difference| over the rows (or their median), the largest
                          over the columns, with where it is
    windows               the check's windows of steps, each with its statistic and tolerance
    measured_differences  the cross-machine differences a reference's tolerances are set from
    tolerances_from       each threshold: TOLERANCE_FACTOR times the largest measured difference, rounded up
    exactness             whether a run is held exactly (a pinned run on a vendor with its own reference)
    sees                  the size of defect the check can and cannot see, as a sentence
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts import metrics as M

DEFAULT_TOLERANCE_BITS = 0.05  # a reference written without a measurement of its own (see reference.json)
MAX_STATISTIC, MEDIAN_STATISTIC = "largest", "median"


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
    ref = ref[(ref[M.STEP] > lo) & (ref[M.STEP] <= hi)]
    mine = mine[(mine[M.STEP] > lo) & (mine[M.STEP] <= hi)]
    if ref.empty and mine.empty:
        return {"bits": 0.0, "column": None, "step": None, "why": "no rows in this window"}
    key = [c for c in (M.SEED, M.STEP) if c in ref.columns and c in mine.columns]
    columns = sorted(c for c in ref.columns if M.LOSS_COLUMN.match(c))  # the columns compared, all in bits
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
            "step": int(row[M.STEP]),
            "why": f"step {int(row['step'])} in {where} (rows at other steps: another schedule or a stop)",
        }
    best = {"bits": 0.0, "column": columns[0], "step": int(joined[M.STEP].iloc[0]), "why": None}
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
                "step": int(joined[M.STEP].iloc[i]) if statistic == MAX_STATISTIC else None,
                "why": None if statistic == MAX_STATISTIC else f"median of {c} over {len(diff)} rows",
            }
    return best


def largest_difference(
    mine: pd.DataFrame, ref: pd.DataFrame, steps: tuple[float, float] = (-math.inf, math.inf)
) -> dict:
    """`difference` with the largest over the rows (every row held to the tolerance)."""
    return difference(mine, ref, steps, MAX_STATISTIC)


def windows(meta: dict, tolerance_bits: float | None = None, kernels: str = "pinned") -> list[dict]:
    """The inexact check's windows of steps, each with its statistic and tolerance (see the module's
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
    rowwise = legacy or (kernels == "pinned" and meta.get("cpu_kernels") == "avx2")
    early = {
        "name": f"steps <= {until}",
        "steps": (-math.inf, float(until)),
        "statistic": MAX_STATISTIC if rowwise else MEDIAN_STATISTIC,
        "tolerance_bits": tol if rowwise else float(meta.get("native_tolerance_bits", tol)),
    }
    if tolerance_bits is not None:
        early["tolerance_bits"] = tolerance_bits
    plateau = []  # a pinned run of another vendor: most plateau rows must also agree to rounding
    if rowwise and not legacy and meta.get("median_tolerance_bits") is not None and tolerance_bits is None:
        plateau = [
            {
                "name": f"steps <= {until} (median)",
                "steps": early["steps"],
                "statistic": MEDIAN_STATISTIC,
                "tolerance_bits": float(meta["median_tolerance_bits"]),
            }
        ]
    late = {
        "name": f"steps > {until}",
        "steps": (float(until), math.inf),
        "statistic": MAX_STATISTIC if legacy else MEDIAN_STATISTIC,
        "tolerance_bits": float(meta["late_tolerance_bits"]),
    }
    return [early, *plateau, late]


TOLERANCE_FACTOR = 2.0  # an inexact check's threshold: twice the largest difference measured between machines


def _round_up(bits: float, digits: int = 2) -> float:
    """`bits` rounded up to `digits` significant digits (a threshold never below its measurement)."""
    if bits <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(bits)) - digits + 1)
    return round(math.ceil(round(bits / scale, 9)) * scale, 12)


def _window_bits(mine: pd.DataFrame, ref: pd.DataFrame, steps: tuple[float, float], statistic: str) -> float:
    got = difference(mine, ref, steps, statistic)
    return math.nan if got["why"] == "no rows in this window" else got["bits"]


def measured_differences(pairs: dict[str, tuple[pd.DataFrame, pd.DataFrame]], until_step: int) -> pd.DataFrame:
    """Per pair of runs of one arm (`{name: (rows, reference rows)}`): the largest difference up to
    `until_step`, the median difference (over rows, largest over columns) up to it and after it."""
    out = []
    for name, (mine, ref) in pairs.items():
        early, late = (-math.inf, float(until_step)), (float(until_step), math.inf)
        out.append(
            {
                "pair": name,
                "early_largest": _window_bits(mine, ref, early, MAX_STATISTIC),
                "early_median": _window_bits(mine, ref, early, MEDIAN_STATISTIC),
                "late_median": _window_bits(mine, ref, late, MEDIAN_STATISTIC),
            }
        )
    return pd.DataFrame(out)


def tolerances_from(pinned: pd.DataFrame, native: pd.DataFrame | None) -> dict:
    """The inexact check's thresholds from measured differences (measured_differences) of every arm:
    pinned runs of two vendors give the early tolerances (row by row, and of the median over rows),
    native runs the early median's,
    all of them the late median's; each TOLERANCE_FACTOR times the largest, rounded up. A kind of
    pair not measured gives None (the reference keeps the value it had, with its own measurement)."""
    both = pd.concat([pinned, native]) if native is not None else pinned

    def threshold(values) -> float | None:
        values = values.dropna()
        return _round_up(TOLERANCE_FACTOR * float(values.max())) if len(values) else None

    return {
        "tolerance_bits": threshold(pinned["early_largest"]),
        "median_tolerance_bits": threshold(pinned["early_median"]),
        "native_tolerance_bits": threshold(native["early_median"]) if native is not None else None,
        "late_tolerance_bits": threshold(both["late_median"]),
    }


def exact_windows(tolerance_bits: float | None = None) -> list[dict]:
    """The exact check: every row of every step, the largest difference, 0 bits (--tolerance
    loosens it)."""
    tol = 0.0 if tolerance_bits is None else float(tolerance_bits)
    return [{"name": "every step", "steps": (-math.inf, math.inf), "statistic": MAX_STATISTIC, "tolerance_bits": tol}]


def exactness(meta: dict, kernels: str, vendor: str | None, own: bool) -> tuple[bool, str]:
    """Whether this run can be held to the reference bit for bit, and why (or why not): pinned
    kernels on both sides, and the reference recorded on a CPU of this CPU's vendor."""
    ref_vendor = (meta.get("machine") or {}).get("vendor")
    if kernels != "pinned":
        return False, (
            "this run computed on native kernels (cpu_kernels: native, or a process that could not pin "
            "them): its codes and roundings are this CPU's own"
        )
    if meta.get("cpu_kernels") != "avx2":
        return False, "the reference was not recorded under pinned kernels (cpu_kernels: avx2)"
    if vendor is None:
        return False, "this machine reports no CPU vendor (not an x86-64 Linux): no reference is its own"
    if not own or ref_vendor is None:
        return False, (
            f"no reference of this CPU's vendor ({vendor}) is shipped; compared with the "
            f"{ref_vendor or 'unrecorded'} one, whose matrix products (MKL's sgemm) round otherwise"
        )
    if ref_vendor != vendor:
        return False, (
            f"the reference was recorded on a {ref_vendor} CPU and this is a {vendor} one: MKL's matrix "
            "products round otherwise"
        )
    return (
        True,
        f"pinned kernels on this CPU (vendor {vendor}) against that vendor's reference: every row must be equal",
    )


def sees(wins: list[dict]) -> str:
    """What the inexact check can and cannot see, from its windows: the size of a defect that moves
    every row of a window (smaller ones pass, and so does one confined to a few rows of a median
    window)."""
    parts = []
    for w in wins:
        how = "any row by" if w["statistic"] == MAX_STATISTIC else "most rows by"
        parts.append(f"{how} more than {w['tolerance_bits']:g} bits at {w['name']}")
    return (
        "it sees a defect that moves "
        + " or ".join(parts)
        + "; a smaller defect passes, and so do chaotic differences between machines of that size"
    )
