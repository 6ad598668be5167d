"""The findings stage: the figure's six claims, checked on the reproduced loss curves.

Reads `loss_curves.csv` (codebook 0, one split) and writes `claims.json` and `claims.md`; given
`diagnostics.csv`, it also says what the diagnostics show at every spike (spike_diagnostics).
Each claim comes back with the numbers it was judged on and one of three verdicts:

    reproduced       the measured curves show what the paper's figure shows
    not reproduced   they show something else
    inconclusive     they cannot tell: a run is missing or diverged, or the difference between
                     arms is smaller than the spread between seeds (or than `min_final_gap`)

The claims, as read from a description of the paper's figure (data/reference/README.md):

    a  every arm starts near 10 bits (a uniform guess over 1024 codes)
    b  Gradient Clip=10 reaches the lowest final loss
    c  Gradient Clip=1 converges slowest
    d  Post-Norm with DeepNorm shows a transient spike (and recovers)
    e  attention relaxation lies between clip 10 and clip 1 in convergence speed
    f  every arm stabilises by 30-40 % of the x-range

Arms are found by their `role` in the config (clip10, clip1, deepnorm, attn_relax), never by
their names. The statistics judged (first, final and converged loss, spikes, divergence; per run
and seed) are defined in acoustic_mlm.report.curve_stats; claims.md is written by claims_markdown.

With several seeds per arm, comparisons use the mean over seeds, and a comparison whose
difference is smaller than the seeds' spread (max - min, or two standard deviations) is
inconclusive. With one seed per arm, each verdict's note says that it rests on one seed.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm.artifacts import curve_tables
from acoustic_mlm.artifacts.checked import ReadError
from acoustic_mlm.config import ClaimThresholds
from acoustic_mlm.curves import _EPS
from acoustic_mlm.errors import UserError
from acoustic_mlm.report.claims_markdown import spikes_markdown, to_markdown
from acoustic_mlm.report.curve_stats import CurveStats, collect, rounded
from acoustic_mlm.report.spike_diagnostics import explain_spikes
from acoustic_mlm.utils import atomic_path, log, write_json

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"


# ----------------------------------------------------------------------------- comparisons


def _spread(values: list[float], how: str) -> float:
    v = [x for x in values if math.isfinite(x)]
    if len(v) < 2:
        return 0.0
    return float(max(v) - min(v)) if how == "range" else float(2 * np.std(v, ddof=1))


def _mean(values: list[float]) -> float:
    v = [x for x in values if math.isfinite(x)]
    return float(np.mean(v)) if v else math.nan


def _compare(
    a: str,
    b: str,
    gap: float,
    spreads: tuple[float, float],
    resolution: float,
    multi_seed: bool,
    unit: str,
    how_range: bool = True,
) -> tuple[bool | None, str]:
    """Is `gap` (expected positive) clearly positive? True / False / None (undecided), and why."""
    spread = max(spreads)
    num = (lambda x: f"{x:+,.0f}") if unit == "steps" else (lambda x: f"{x:+.3f}")
    if multi_seed and abs(gap) <= spread:
        return None, (
            f"{a} vs {b}: difference {num(gap)} {unit} is within the seed spread "
            f"({num(spread)[1:]} {unit}, {'max - min' if how_range else 'two std'})"
        )
    if abs(gap) <= resolution:
        return None, (
            f"{a} vs {b}: difference {num(gap)} {unit} is a tie (at most {resolution:g} {unit}: "
            + ("within the noise rounding alone makes, claims.min_final_gap)" if unit == "bits" else "a tie)")
        )
    beyond = f", beyond the {resolution:g} {unit} rounding alone makes (claims.min_final_gap)" if unit == "bits" else ""
    return gap > 0, f"{a} vs {b}: difference {num(gap)} {unit}{beyond}"


def _combine(results: list[bool | None]) -> str:
    if any(r is False for r in results):
        return NOT_REPRODUCED
    if all(r is True for r in results):
        return REPRODUCED
    return INCONCLUSIVE


def _per_seed_verdict(passes: dict[str, list[bool]]) -> str:
    """Per-arm lists of per-seed pass/fail -> verdict: any arm failing in every seed fails."""
    if any(not any(p) for p in passes.values()):
        return NOT_REPRODUCED
    if all(all(p) for p in passes.values()):
        return REPRODUCED
    return INCONCLUSIVE


# ----------------------------------------------------------------------------- the claims


# What MERT's released code shows about claim (e) (docs/recipe.md, "Attention relaxation in MERT's released code").
PB_RELAX_FINDING = (
    "in MERT's released training code the relaxation never runs (mert_fairseq/models/mert/mert_model.py: "
    "MultiheadAttention_extend.forward, lines 1710-1754, returns through F.multi_head_attention_forward before "
    "the PB-Relax branch at lines 1928-1945), so the paper's Attn. Relax arm computed plain softmax attention "
    "and its gap to clip 1 cannot come from relaxation; here the arm does relax, which changes nothing in fp32 "
    "and only fp16 overflow in fp16"
)

CLAIMS = {
    "a": (
        "Every arm starts near 10 bits (a uniform guess over 1024 codes)",
        "first points ~9.3-9.5 bits for all four arms",
    ),
    "b": (
        "Gradient Clip=10 reaches the lowest final loss",
        "clip 10 ends lowest, ~5.7 bits (key observations); stated plateaus: clip 10 5.7-5.8, "
        "Post-Norm 5.6-5.7, Attn. Relax 5.7-5.8, clip 1 5.8-5.9",
    ),
    "c": (
        "Gradient Clip=1 converges slowest",
        "clip 1 reaches ~5.9 only by 50K steps; clip 10 ~5.8 by 10K, Attn. Relax ~5.8 by 30K, Post-Norm ~5.7 by 30K",
    ),
    "d": (
        "Post-Norm with DeepNorm shows a transient loss spike and recovers",
        "spike from ~5.9 to ~9.2 bits at 20K, back to ~5.7 by 30K; no other arm spikes",
    ),
    "e": (
        "Attention relaxation lies between clip 10 and clip 1 in convergence speed",
        "Attn. Relax ~5.8 by 30K: after clip 10 (~10K), before clip 1 (~50K)",
    ),
    "f": (
        "Every arm stabilises by 30-40 % of the x-range",
        "'after ~30K-40K steps' of 100K for most arms; clip 1 stabilises only after ~60K",
    ),
}


def role_map(by_role: dict[str, str]) -> dict[str, str]:
    """Every role -> the run name that has it; a role no arm has maps to a placeholder name that
    no curve carries, so its claims come out inconclusive with the reason in their notes."""
    unknown = sorted(set(by_role) - set(C.ROLES))
    if unknown:
        raise UserError(f"claims: unknown role '{unknown[0]}' (roles: {', '.join(C.ROLES)})")
    return {role: by_role.get(role, f"(no arm with role {role})") for role in C.ROLES}


def evaluate(
    curves: pd.DataFrame, thresholds: ClaimThresholds | None, by_role: dict[str, str], split: str = "train"
) -> list[dict]:
    """The six claims on codebook-0 curves of `split`; one dict per claim, in order a-f.

    Each dict: id, claim (text), paper (what the paper shows), measured (numbers), verdict,
    note. `by_role` maps roles (clip10, clip1, deepnorm, attn_relax) to run names
    (Config.runs_by_role).
    """
    th = thresholds or ClaimThresholds()
    roles = role_map(by_role)
    stats = collect(curves, list(roles.values()), th, split=split)
    ctx = _Context(th, roles, stats)
    return [ctx.claim(cid) for cid in CLAIMS]


class _Context:
    """Shared bookkeeping for the six claim functions."""

    def __init__(self, th: ClaimThresholds, roles: dict[str, str], stats: dict[str, list[CurveStats]]):
        self.th, self.roles, self.stats = th, roles, stats
        self.present = {r: n for r, n in roles.items() if n in stats}
        self.missing = {r: n for r, n in roles.items() if n not in stats}
        self.multi_seed = any(len(s) > 1 for s in stats.values())

    def claim(self, cid: str) -> dict:
        text, paper = CLAIMS[cid]
        verdict, measured, notes = getattr(self, f"_claim_{cid}")()
        notes = [n for n in notes if n]
        if self.stats and not self.multi_seed:
            notes.append("rests on one seed per arm: no seed spread to judge differences against")
        return {
            "id": cid,
            "claim": text,
            "paper": paper,
            "measured": measured,
            "verdict": verdict,
            "note": "; ".join(notes),
        }

    # helpers
    def per_seed(self, attr: str, roles=None) -> dict[str, dict[str, float]]:
        roles = roles or list(self.present)
        nd = 0 if attr.endswith("_step") else 4
        return {
            self.roles[r]: {str(s.seed): rounded(getattr(s, attr), nd) for s in self.stats[self.roles[r]]}
            for r in roles
            if r in self.present
        }

    def values(self, role: str, attr: str) -> list[float]:
        return [getattr(s, attr) for s in self.stats[self.roles[role]]]

    def mean(self, role: str, attr: str) -> float:
        return _mean(self.values(role, attr))

    def spread(self, role: str, attr: str) -> float:
        return _spread(self.values(role, attr), self.th.seed_spread)

    def missing_note(self, roles) -> str:
        gone = [self.roles[r] for r in roles if r in self.missing]
        return f"run(s) missing from the curves: {', '.join(gone)}" if gone else ""

    def diverged_note(self, roles) -> str:
        out = [
            f"{s.run} seed {s.seed} diverged (non-finite loss from step {s.diverged_step})"
            for r in roles
            if r in self.present
            for s in self.stats[self.roles[r]]
            if s.diverged_step is not None
        ]
        return "; ".join(out)

    def measured(self, attrs: list[str], roles=None) -> dict:
        roles = [r for r in (roles or self.roles) if r in self.present]
        m = {}
        for attr in attrs:
            m[attr] = {self.roles[r]: rounded(self.mean(r, attr), 0 if attr.endswith("_step") else 4) for r in roles}
            if self.multi_seed:
                m[f"{attr}_per_seed"] = self.per_seed(attr, roles)
        m["seeds"] = {self.roles[r]: len(self.stats[self.roles[r]]) for r in roles}
        return m

    def every_arm(self, passes: dict[str, list[bool]], failing: str, measured: dict, notes: list):
        """Verdict of a claim that every arm must pass in every seed (a, f); names the arms that fail."""
        out = [self.roles[r] for r, p in passes.items() if not all(p)]
        if out:
            notes.insert(0, f"{failing}: {', '.join(out)}")
        if not passes:
            return INCONCLUSIVE, measured, notes
        verdict = _per_seed_verdict(passes)
        if verdict == REPRODUCED and self.missing:
            verdict = INCONCLUSIVE
        return verdict, measured, notes

    # a: every arm starts near 10 bits
    def _claim_a(self):
        th, roles = self.th, list(self.roles)
        passes = {
            r: [th.start_min <= s.first_bits <= th.start_max for s in self.stats[self.roles[r]]]
            for r in roles
            if r in self.present
        }
        measured = self.measured(["first_bits", "first_step"])
        measured["band_bits"] = [th.start_min, th.start_max]
        notes = [self.missing_note(roles), self.diverged_note(roles)]
        return self.every_arm(passes, f"outside [{th.start_min:g}, {th.start_max:g}] bits", measured, notes)

    # b: clip 10 reaches the lowest final loss
    def _claim_b(self):
        roles = list(self.roles)
        measured = self.measured(["final_bits"])
        notes = [self.missing_note(roles), self.diverged_note(roles)]
        if "clip10" not in self.present:
            return INCONCLUSIVE, measured, notes
        mine = self.mean("clip10", "final_bits")
        if not math.isfinite(mine):
            notes.insert(0, f"{self.roles['clip10']} has no final loss")
            return NOT_REPRODUCED, measured, notes
        others = {r: self.mean(r, "final_bits") for r in self.present if r != "clip10"}
        others = {r: v for r, v in others.items() if math.isfinite(v)}  # diverged arms end worse
        if not others:
            return INCONCLUSIVE, measured, notes + ["no other arm has a final loss to compare"]
        rival = min(others, key=others.get)
        gap = others[rival] - mine
        measured["gap_bits"] = rounded(gap)
        ok, why = _compare(
            self.roles["clip10"],
            self.roles[rival],
            gap,
            (self.spread("clip10", "final_bits"), self.spread(rival, "final_bits")),
            self.th.min_final_gap,
            self.multi_seed,
            "bits",
            self.th.seed_spread == "range",
        )
        notes.insert(0, f"lowest other arm: {why}")
        verdict = _combine([ok])
        if verdict == REPRODUCED and self.missing:
            verdict = INCONCLUSIVE
        return verdict, measured, notes

    def _steps_ready(self, roles) -> tuple[bool, list[str]]:
        """Are the converged steps of these roles all defined? Else why not."""
        notes = [self.missing_note(roles), self.diverged_note(roles)]
        never = [
            f"{s.run} seed {s.seed}"
            for r in roles
            if r in self.present
            for s in self.stats[self.roles[r]]
            if s.diverged_step is None and not math.isfinite(s.converged_step)
        ]
        if never:
            notes.append(f"never within {self.th.converge_margin:g} bits of its final loss: {', '.join(never)}")
        ok = all(r in self.present and all(math.isfinite(v) for v in self.values(r, "converged_step")) for r in roles)
        return ok, notes

    # c: clip 1 converges slowest
    def _claim_c(self):
        roles = list(self.roles)
        measured = self.measured(["converged_step", "final_bits"])
        measured["margin_bits"] = self.th.converge_margin
        ready, notes = self._steps_ready(roles)
        if not ready:
            return INCONCLUSIVE, measured, notes
        others = {r: self.mean(r, "converged_step") for r in roles if r != "clip1"}
        rival = max(others, key=others.get)
        gap = self.mean("clip1", "converged_step") - others[rival]
        measured["gap_steps"] = rounded(gap, 0)
        ok, why = _compare(
            self.roles["clip1"],
            self.roles[rival],
            gap,
            (self.spread("clip1", "converged_step"), self.spread(rival, "converged_step")),
            0.0,
            self.multi_seed,
            "steps",
            self.th.seed_spread == "range",
        )
        notes.insert(0, f"slowest other arm: {why}")
        return _combine([ok]), measured, notes

    # d: Post-Norm DeepNorm spikes and recovers
    def _claim_d(self):
        th = self.th
        measured = {"spike_threshold_bits": th.spike_threshold, "recovery_margin_bits": th.recovery_margin}
        notes = [self.missing_note(["deepnorm"]), self.diverged_note(["deepnorm"])]
        if "deepnorm" not in self.present:
            return INCONCLUSIVE, measured, notes
        passes, per_seed = [], {}
        for s in self.stats[self.roles["deepnorm"]]:
            recovered = [k for k in s.spikes if k["recovery_step"] is not None]
            pick = max(recovered or s.spikes, key=lambda k: k["height_bits"], default=None)
            per_seed[str(s.seed)] = (
                None if pick is None else {k: (rounded(v) if isinstance(v, float) else v) for k, v in pick.items()}
            )
            passes.append(bool(recovered))
            if s.spikes and not recovered:
                notes.append(
                    f"seed {s.seed}: rose {pick['height_bits']:.3g} bits at step {pick['peak_step']} "
                    "and did not recover by the last step"
                )
        measured["spike"] = per_seed  # seed -> the largest recovered spike (else the largest), or None
        elsewhere = {
            self.roles[r]: len(s.spikes)
            for r in self.present
            if r != "deepnorm"
            for s in self.stats[self.roles[r]]
            if s.spikes
        }
        measured["spikes_in_other_arms"] = elsewhere
        if elsewhere:
            notes.append(f"other arms spike too (the paper shows none): {', '.join(elsewhere)}")
        if len(passes) > 1 and 0 < sum(passes) < len(passes):
            notes.insert(0, f"spike in {sum(passes)} of {len(passes)} seeds")
        return _per_seed_verdict({"deepnorm": passes}), measured, notes

    # e: attention relaxation between clip 10 and clip 1
    def _claim_e(self):
        roles = ["clip10", "attn_relax", "clip1"]
        measured = self.measured(["converged_step"], roles)
        measured["margin_bits"] = self.th.converge_margin
        ready, notes = self._steps_ready(roles)
        if not ready:
            return INCONCLUSIVE, measured, notes
        results = []
        for lo, hi in (("clip10", "attn_relax"), ("attn_relax", "clip1")):
            gap = self.mean(hi, "converged_step") - self.mean(lo, "converged_step")
            ok, why = _compare(
                self.roles[hi],
                self.roles[lo],
                gap,
                (self.spread(lo, "converged_step"), self.spread(hi, "converged_step")),
                0.0,
                self.multi_seed,
                "steps",
                self.th.seed_spread == "range",
            )
            results.append(ok)
            notes.insert(len(results) - 1, f"{why} (expected > 0)")
        verdict = _combine(results)
        if verdict != REPRODUCED:
            notes.append(
                "PB-Relax equals softmax attention in exact arithmetic: in fp32 the Attn. Relax arm "
                "should match clip 1 up to seed noise"
            )
        notes.append(PB_RELAX_FINDING)
        return verdict, measured, notes

    # f: every arm stabilises by 40 % of the x-range
    def _claim_f(self):
        th, roles = self.th, list(self.roles)
        measured = self.measured(["converged_step", "last_step", "converged_fraction"])
        measured["max_fraction"] = th.stabilise_fraction
        notes = [self.missing_note(roles), self.diverged_note(roles)]
        passes = {
            r: [
                math.isfinite(s.converged_fraction) and s.converged_fraction <= th.stabilise_fraction + _EPS
                for s in self.stats[self.roles[r]]
            ]
            for r in roles
            if r in self.present
        }
        return self.every_arm(passes, f"not stabilised by {th.stabilise_fraction:.0%} of the x-range", measured, notes)


# ----------------------------------------------------------------------------- the stage


def run(
    cfg: C.Config,
    curves_path,
    out_json,
    out_md,
    *,
    reference_path=None,
    check_reference: bool = True,
    diagnostics_path=None,
) -> list[dict]:
    """Evaluate the claims on `curves_path`; write `out_json` and `out_md` atomically.

    Thresholds from the config's `claims:` section, arms by their `role`, the split drawn in the
    figure (`figure.split`). With `check_reference`, the same checks run on the paper's digitised
    curves as well and their verdicts are reported beside the reproduction's (skipped with a log
    line if absent). With `diagnostics_path` (diagnostics.csv), every spike is explained by the
    diagnostics.
    """
    th = cfg.claims
    split = cfg.figure.split
    curves_path = Path(curves_path)
    if not curves_path.is_file():
        raise UserError(f"{curves_path}: loss curves not found; run the aggregate stage first")
    curves = curve_tables.read_curves(curves_path)
    have = set(curves.loc[(curves["split"] == split) & (curves["codebook"] == 0), "run"])
    missing = [name for name in cfg.runs if name not in have]
    if missing:  # an arm left out would turn its claims inconclusive without a word
        raise UserError(
            f"{curves_path}: no {split} codebook-0 rows for run(s) {', '.join(missing)} of the "
            "configuration; rerun the aggregate stage"
        )
    roles = role_map(cfg.runs_by_role())
    claims = evaluate(curves, th, roles, split=split)
    explained = None
    if diagnostics_path is not None:
        if not Path(diagnostics_path).is_file():
            raise UserError(f"{diagnostics_path}: diagnostics not found; run the aggregate stage first")
        stats = collect(curves, list(roles.values()), th, split=split)
        explained = explain_spikes(stats, curve_tables.read_diagnostics(diagnostics_path))

    paper_verdicts = None
    if check_reference:
        from acoustic_mlm.report import reference

        try:
            ref = reference.load_reference(reference_path)
            by_role = {r["role"]: name for name, r in reference.runs_of(ref).items()}
            paper_verdicts = {c["id"]: c["verdict"] for c in evaluate(reference.as_curves(ref), th, by_role)}
        except UserError as exc:
            if isinstance(exc, ReadError) and Path(reference_path or reference.REFERENCE_PATH).is_file():
                raise  # a damaged or edited file is refused, never skipped
            log.warning("claims: %s; skipping the check on the paper's curves", exc)

    data = curves[(curves["split"] == split) & (curves["codebook"] == 0)]
    seeds = {
        name: sorted(int(s) for s in data.loc[data["run"] == name, "seed"].unique()) if "seed" in data.columns else []
        for name in roles.values()
    }
    header = {
        "curves": str(curves_path),
        "split": split,
        "codebook": 0,
        "roles": roles,
        "seeds": seeds,
        "n_seeds": {name: len(s) for name, s in seeds.items()},
        "thresholds": asdict(th),
    }
    doc = {**header, "claims": claims, "verdicts": {c["id"]: c["verdict"] for c in claims}}
    if paper_verdicts is not None:
        doc["paper_verdicts"] = paper_verdicts  # the same checks on data/reference/paper_curves.csv
    if explained is not None:
        doc["spike_diagnostics"] = explained
    write_json(out_json, doc)
    with atomic_path(out_md) as tmp:
        spikes = spikes_markdown(explained) if explained is not None else ""
        tmp.write_text(to_markdown(claims, header, paper_verdicts) + spikes)
    log.info("claims: %s -> %s, %s", ", ".join(f"{c['id']} {c['verdict']}" for c in claims), out_json, out_md)
    return claims
