"""Per run and seed, the statistics of a loss curve that the claims judge (`curve_stats`), for every
run of a curves table (`collect`).

Definitions (all per run and seed, on the rows of that curve, steps as logged):

    first     the first logged loss
    final     curves.final_loss: mean loss over the last 10 % of the curve's step range
    converged curves.converged_step with `converge_margin` bits: from there on the curve stays
              within the margin of its own final loss, through the whole final window
    spike     curves.detect_spikes with `spike_threshold` and `recovery_margin` bits
    diverged  the curve holds a non-finite loss (the step of the first one is reported)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from acoustic_mlm.config import ClaimThresholds
from acoustic_mlm.curves import converged_step, detect_spikes, final_loss
from acoustic_mlm.errors import UserError


@dataclass
class CurveStats:
    """The statistics of one run and seed."""

    run: str
    seed: int
    first_step: int
    first_bits: float
    last_step: int
    final_bits: float  # NaN if diverged
    converged_step: float  # NaN if diverged or never within the margin
    converged_fraction: float  # converged_step / last_step
    diverged_step: int | None  # first step with a non-finite loss
    spikes: list[dict]  # on the finite part of the curve


def curve_stats(run: str, seed: int, steps, loss, th: ClaimThresholds) -> CurveStats:
    steps, loss = np.asarray(steps, dtype=float), np.asarray(loss, dtype=float)
    bad = np.flatnonzero(~np.isfinite(loss))
    diverged = int(steps[bad[0]]) if len(bad) else None
    finite_steps, finite_loss = (steps[: bad[0]], loss[: bad[0]]) if len(bad) else (steps, loss)
    final = conv = math.nan
    if diverged is None:
        final = final_loss(steps, loss)
        conv = converged_step(steps, loss, final, th.converge_margin)
    return CurveStats(
        run=run,
        seed=seed,
        first_step=int(steps[0]),
        first_bits=float(loss[0]),
        last_step=int(steps[-1]),
        final_bits=final,
        converged_step=conv,
        converged_fraction=conv / steps[-1] if steps[-1] > 0 else math.nan,
        diverged_step=diverged,
        spikes=detect_spikes(finite_steps, finite_loss, th.spike_threshold, th.recovery_margin),
    )


def collect(
    curves: pd.DataFrame, runs: list[str], th: ClaimThresholds, split: str = "train", codebook: int = 0
) -> dict[str, list[CurveStats]]:
    """Statistics per run (those present in `curves`), one entry per seed, seeds ascending."""
    need = {"run", "step", "split", "codebook", "loss_bits"}
    if not need <= set(curves.columns):
        raise UserError(f"loss curves lack column(s): {', '.join(sorted(need - set(curves.columns)))}")
    data = curves[(curves["split"] == split) & (curves["codebook"] == codebook) & curves["run"].isin(runs)]
    if "seed" not in data.columns:
        data = data.assign(seed=0)
    out: dict[str, list[CurveStats]] = {}
    for (run, seed), g in data.groupby(["run", "seed"], sort=True):
        # duplicate steps (a resumed run) collapse to their mean
        g = g.groupby("step", sort=True)["loss_bits"].mean(numeric_only=True)
        out.setdefault(run, []).append(curve_stats(run, int(seed), g.index.to_numpy(), g.to_numpy(), th))
    return out


def rounded(x: float, nd: int = 4):
    """JSON-friendly rounding: NaN -> None; nd=0 gives an int (steps)."""
    if x is None or not math.isfinite(x):
        return None
    return int(round(x)) if nd == 0 else round(float(x), nd)
