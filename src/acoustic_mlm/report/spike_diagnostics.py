"""What the diagnostics show at each loss spike: for every spike of every arm and seed (as claim d
finds them), the largest gradient norm and attention logit from its onset to its peak against
their medians just before, and the updates skipped in between. The claims stage writes them into
claims.json (`spike_diagnostics`) and, as text, into claims.md (claims_markdown.spikes_markdown).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.report.curve_stats import CurveStats, rounded
from acoustic_mlm.utils import FP16_MAX

UNUSUAL_FACTOR = 3.0  # a diagnostic at a spike this many times its median before the spike is unusual
BASELINE_ROWS = 3  # ... the median of the last this many rows before the onset (early training moves fast)
SKIP_NAMES = {M.OVERFLOW_SKIPS: "fp16 overflow", M.NONFINITE: "non-finite loss"}  # metrics column -> why


def _before_and_during(series: pd.Series, onset: int, peak: int) -> tuple[float, float]:
    """(median of the last BASELINE_ROWS finite values before `onset`, largest value in onset..peak)
    of a step-indexed series."""
    before = series[(series.index < onset) & np.isfinite(series.to_numpy())].sort_index().iloc[-BASELINE_ROWS:]
    during = series[(series.index >= onset) & (series.index <= peak)]
    return (float(before.median()) if len(before) else math.nan, float(during.max()) if len(during) else math.nan)


def explain_spikes(
    stats: dict[str, list[CurveStats]], diagnostics: pd.DataFrame, factor: float = UNUSUAL_FACTOR
) -> list[dict]:
    """For every spike in `stats` (claim d's spikes, every arm and seed), what the diagnostics show
    from its onset to its peak: the largest gradient norm before clipping and attention logit,
    each against its median over the last BASELINE_ROWS rows before the onset, and the updates
    skipped (fp16 overflow, non-finite loss) in between. `unusual` names what rose `factor` times or more
    above its median, any skipped update, and an attention logit beyond float16's range;
    empty: the diagnostics show nothing unusual at that spike.
    """
    out = []
    for run, per_seed in stats.items():
        for s in per_seed:
            rows = diagnostics[(diagnostics["run"] == run) & (diagnostics["seed"] == s.seed)]
            wide = rows.pivot_table(index="step", columns="diagnostic", values="value", aggfunc="mean", dropna=False)
            for k in s.spikes:
                onset, peak = k["onset_step"], k["peak_step"]
                seen = {
                    "run": run,
                    "seed": s.seed,
                    "onset_step": onset,
                    "peak_step": peak,
                    "height_bits": k["height_bits"],
                    "unusual": [],
                }
                for name, column in (("grad_norm", M.GRAD_NORM_MAX), ("attn_logit", M.ATTN_LOGIT_MAX)):
                    label = {"grad_norm": "gradient norm", "attn_logit": "attention logit"}[name]
                    if column not in wide.columns:
                        seen[name] = None  # not measured (train.diagnostics false)
                        continue
                    median, top = _before_and_during(wide[column], onset, peak)
                    seen[name] = {
                        "max": rounded(top),
                        "median_before": rounded(median),
                        "ratio": rounded(top / median) if median > 0 else None,
                    }
                    if math.isfinite(top) and median > 0 and top >= factor * median:
                        seen["unusual"].append(f"{label} {top / median:.1f}x its median")
                if seen["attn_logit"] and (seen["attn_logit"]["max"] or 0) >= FP16_MAX:
                    seen["unusual"].append("attention logit beyond float16's range")
                for name in SKIP_NAMES:
                    if name not in wide.columns:
                        seen[name] = None
                        continue
                    c = wide[name].dropna()
                    start = c[c.index < onset].iloc[-1] if (c.index < onset).any() else 0.0
                    end = c[c.index <= peak].iloc[-1] if (c.index <= peak).any() else start
                    seen[name] = int(end - start)
                    if seen[name] > 0:
                        seen["unusual"].append(f"{seen[name]} update(s) skipped for {SKIP_NAMES[name]}")
                out.append(seen)
    return out
