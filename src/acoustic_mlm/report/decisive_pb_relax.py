"""The decisive experiments' two PB-Relax parts (docs/stability.md, "Decisive experiments: the rules"):
its arithmetic on benchmarks/attention_fp16.py's table, and its training in fp16 under forced logit
growth, from the decisive runs table (report.decisive)."""

from __future__ import annotations

import math

import pandas as pd

from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.report.verdicts import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED
from acoustic_mlm.train.precision import names_where
from acoustic_mlm.utils import FP16_MAX  # an unfused logit beyond it is inf


def forced_logit_verdict(runs: pd.DataFrame) -> dict:
    """PB-Relax in fp16 under forced logit growth (the amended part 2 of the rules): at each gain
    where an unfused run's logits passed FP16_MAX, supported if every unfused run there failed and
    every PB-Relax run completed without failing; not supported if a PB-Relax run failed there or an
    unfused run that passed the limit did not fail; inconclusive if no unfused run passed it."""
    fp16 = runs[runs["precision"].isin(names_where(lambda tr: tr.float16_range))]  # fp16, fp16_fairseq
    by_gain, outcomes = {}, []
    for gain, g in fp16.groupby("qk_gain"):
        unfused, relax, fused = (g[g["arm"] == k] for k in ("unfused", "pb_relax", "clip1"))
        reached = unfused[unfused[M.ATTN_LOGIT_MAX] >= FP16_MAX]
        row = {
            arm: {
                "runs": len(x),
                "failed": int(x["failed"].sum()),
                "reached": int((x[M.ATTN_LOGIT_MAX] >= FP16_MAX).sum()),
                "largest_logit": float(x[M.ATTN_LOGIT_MAX].max()) if len(x) else math.nan,
                "final_loss": float(x["final_loss"].mean()) if len(x) else math.nan,
            }
            for arm, x in (("unfused", unfused), ("pb_relax", relax), ("fused", fused))
        }
        if len(reached) and len(relax):
            if relax["failed"].any() or not reached["failed"].all():
                outcome = NOT_SUPPORTED
            elif unfused["failed"].all():
                outcome = SUPPORTED
            else:
                outcome = INCONCLUSIVE
            outcomes.append(outcome)
            row["outcome"] = outcome
        by_gain[f"{gain:g}"] = row
    verdict = (
        INCONCLUSIVE
        if not outcomes
        else NOT_SUPPORTED
        if NOT_SUPPORTED in outcomes
        else SUPPORTED
        if SUPPORTED in outcomes
        else INCONCLUSIVE
    )
    return {"id": "pb_relax_training", "verdict": verdict, "by_gain": by_gain}


def numerics_verdict(numerics: pd.DataFrame | None) -> dict:
    """PB-Relax's arithmetic (part 1, benchmarks/attention_fp16.py's table): supported if at a scale
    where unfused fails (non-finite output or gradient), PB-Relax is finite with relative error
    below 1e-2; not supported if PB-Relax fails or is worse wherever unfused fails; inconclusive if
    unfused never fails (or no table)."""
    if numerics is None:
        return {"id": "pb_relax_arithmetic", "verdict": INCONCLUSIVE, "note": "no numerics table given"}
    fails = numerics[(numerics["path"] == "unfused") & ~numerics["finite"]]
    scales = sorted(fails["logit_max"].unique())
    good = []
    for s in scales:
        r = numerics[(numerics["path"] == "pb_relax") & (numerics["logit_max"] == s)]
        good.append(bool(len(r) and r["finite"].all() and (r["rel_error"] < 1e-2).all()))
    verdict = INCONCLUSIVE if not scales else SUPPORTED if any(good) else NOT_SUPPORTED
    return {
        "id": "pb_relax_arithmetic",
        "verdict": verdict,
        "unfused_fails_at": [float(s) for s in scales],
        "pb_relax_good_at": [float(s) for s, ok in zip(scales, good) if ok],
    }
