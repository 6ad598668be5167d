"""Where a run's gradients vanish: each block's gradient norm late in the run against its first one, from
a round's blocks.csv (experiments.runner.block_rows: every metrics row's per-block gradient norm before
clipping and update ratio, blocks conv, embed, block0..N-1, heads).

    vanishing   per run and block: `ratio` = the median gradient norm over the rows of the run's second
                half over the norm at its first row; per outcome (trained or not) and block: the median
                ratio, the runs in which that block's ratio is the smallest (where the gradients vanish
                first), the runs whose block ends with a gradient of exactly 0, and the median first
                step at which it is 0
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts.checked import read_csv_table
from acoustic_mlm.experiments import record as R

BLOCKS = "blocks.csv"
KEY = ["size", "arm", "lr", "seed"]


def read_blocks(path: Path) -> pd.DataFrame:
    """A round's blocks.csv through the checked reader (every field, steps whole, norms numbers)."""
    cols = [*KEY, "step", "block", "grad_norm", "update_ratio"]
    return read_csv_table(
        path,
        "table of per-block gradient norms",
        R.STAGE,
        cols,
        ints=["seed", "step"],
        finite=["lr"],
        numbers=["grad_norm", "update_ratio"],
    )


def run_ratios(blocks: pd.DataFrame) -> pd.DataFrame:
    """Per run and block: its first gradient norm, its late median (rows past half its last step), their
    ratio, and the first step from which its gradient norm stays exactly 0 (NaN when it never does)."""
    rows = []
    for key, g in blocks.groupby([*KEY, "block"], sort=False):
        g = g.sort_values("step")
        steps, norms = g["step"].to_numpy(), g["grad_norm"].to_numpy(float)
        first, late = norms[0], float(np.median(norms[steps > steps[-1] / 2]))
        nonzero = np.flatnonzero(norms != 0)
        last = nonzero[-1] if len(nonzero) else -1
        zero_from = float(steps[last + 1]) if last + 1 < len(norms) else np.nan
        rows.append(dict(zip([*KEY, "block"], key)) | {"first": first, "late": late, "zero_from": zero_from})
    out = pd.DataFrame(rows)
    out["ratio"] = out["late"] / out["first"]
    return out


def vanishing(blocks: pd.DataFrame, runs: pd.DataFrame) -> dict:
    """The summary of the module docstring, for the runs that trained and those that did not."""
    ratios = run_ratios(blocks).merge(runs[KEY + ["trained"]], on=KEY, how="inner")
    out = {}
    for trained, g in ratios.groupby("trained"):
        n = int(g[KEY].drop_duplicates().shape[0])
        smallest = g.loc[g.groupby(KEY)["ratio"].idxmin(), "block"].value_counts()
        per_block = {}
        for block, b in g.groupby("block", sort=False):
            zero = b["zero_from"].dropna()
            per_block[block] = {
                "median_ratio": float(b["ratio"].median()),
                "smallest_in_runs": int(smallest.get(block, 0)),
                "ends_at_zero_in_runs": int(len(zero)),
                "median_zero_from_step": float(zero.median()) if len(zero) else None,
            }
        out["trained" if trained else "not_trained"] = {"runs": n, "blocks": per_block}
    return out
