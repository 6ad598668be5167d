"""docs/stability.md's re-statement of the published confirmatory verdicts under Holm, and the numbers
its prose quotes about them, recomputed from the published run tables in data/reference/.

Every cell of the table is rendered here from the runs (counts by each round's own outcome, Fisher's
exact test one-sided as published, Holm's step-down adjustment, Newcombe's interval of the difference)
and must equal the document's row character for character: an edited number fails. The statistics are
computed with scipy alone, apart from the package's own code, as an independent check of it.

    python tests/docs/test_holm_restatement.py    # print the table as the document should hold it
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pandas as pd
import pytest
from scipy.stats import binom, binomtest, fisher_exact

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs/stability.md"
ALPHA = 0.025  # each published test's one-sided level, and the family's level under Holm


@dataclass(frozen=True)
class Confirmatory:
    """One published confirmatory test: arm a (the promise favours it) against arm b."""

    id: str
    round: str  # its family when each round is one family
    what: str
    folder: str  # under data/reference/
    size: str
    lr: float
    a: str
    b: str
    seeds: tuple[int, ...]
    published: str  # the verdict as published


C = Confirmatory
SEEDS = tuple(range(101, 113))
TESTS = (
    C("P1", "3", "clip 1 against no clipping", "confirm_round", "S1", 0.05, "prenorm_clip1", "prenorm_noclip",
      SEEDS, "supported"),
    C("P2", "3", "clip 1 against clip 10 (the figure's pair)", "confirm_round", "S1", 0.05, "prenorm_clip1",
      "prenorm_clip10", SEEDS, "undecided"),
    C("P3", "3", "DeepNorm against plain Post-Norm (D12)", "confirm_round", "D12", 0.01, "postnorm_deepnorm_clip1",
      "postnorm_clip1", SEEDS, "supported"),
    C("R5", "5", "PB-Relax against fairseq's unfused order (fp16, gain 128)", "pb_relax_confirm", "S1-fp16-g128",
      0.01, "prenorm_attnrelax_clip1", "prenorm_unfused_clip1", (601, 602, 603, 604), "supported"),
)  # fmt: skip


@cache
def _runs(folder: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / "data/reference" / folder / "runs.csv")


def _outcome(runs: pd.DataFrame, folder: str) -> pd.Series:
    """Each round's primary outcome: *trained* (round 3), *trained through* (round 5: all 800 updates,
    not stopped by the loss scaler, and trained)."""
    trained = runs["trained"].astype(bool)
    if folder == "pb_relax_confirm":
        completed = runs["status"].isin(["completed", "completed_with_nonfinite"]) & (runs["updates"] == 800)
        return trained & completed
    return trained


def counts(t: Confirmatory) -> tuple[int, int, int, int]:
    """(k_a, n_a, k_b, n_b): runs with the outcome and runs, per arm."""
    runs = _runs(t.folder)
    cell = runs[(runs["size"] == t.size) & (runs["lr"] == t.lr) & runs["seed"].isin(t.seeds)]
    out = []
    for arm in (t.a, t.b):
        g = cell[cell["arm"] == arm]
        assert sorted(g["seed"]) == sorted(t.seeds), (t.id, arm)  # every planned run, once
        out += [int(_outcome(g, t.folder).sum()), len(g)]
    return tuple(out)


def fisher_greater(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    return float(fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]], alternative="greater")[1])


def holm(p: dict[str, float]) -> dict[str, float]:
    """Holm (1979): the i-th smallest of m p-values times (m - i + 1), made non-decreasing, capped at 1."""
    out, running = {}, 0.0
    for i, key in enumerate(sorted(p, key=p.get)):
        running = max(running, min(1.0, (len(p) - i) * p[key]))
        out[key] = running
    return out


def newcombe(k_a: int, n_a: int, k_b: int, n_b: int) -> tuple[float, float, float]:
    """Share a minus share b with Newcombe's 95 % hybrid score interval (Newcombe 1998, method 10:
    from the Wilson interval of each share)."""
    pa, pb = k_a / n_a, k_b / n_b
    wa = binomtest(k_a, n_a).proportion_ci(0.95, method="wilson")
    wb = binomtest(k_b, n_b).proportion_ci(0.95, method="wilson")
    d = pa - pb
    low = d - math.sqrt((pa - wa.low) ** 2 + (wb.high - pb) ** 2)
    high = d + math.sqrt((wa.high - pa) ** 2 + (pb - wb.low) ** 2)
    return d, max(-1.0, low), min(1.0, high)


def aa_rejection(share: float, n: int = 10) -> float:
    """P(an A/A pair of identical arms at `share`, n runs each, is decided either way by the two
    one-sided Fisher tests at ALPHA): the chance that such a calibration fails."""
    total = 0.0
    for ka in range(n + 1):
        for kb in range(n + 1):
            if fisher_greater(ka, n, kb, n) < ALPHA or fisher_greater(kb, n, ka, n) < ALPHA:
                total += binom.pmf(ka, n, share) * binom.pmf(kb, n, share)
    return total


def fisher_power(pa: float, pb: float, n: int) -> float:
    """Power of the one-sided Fisher test at ALPHA, n runs per arm, true shares pa > pb."""
    return sum(
        binom.pmf(ka, n, pa) * binom.pmf(kb, n, pb)
        for ka in range(n + 1)
        for kb in range(n + 1)
        if fisher_greater(ka, n, kb, n) < ALPHA
    )


def fmt_p(p: float) -> str:
    """Two significant digits; below 0.001 as 5.4e-5."""
    if p < 1e-3:
        mantissa, exponent = f"{p:.1e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return f"{float(f'{p:.2g}'):g}"


def stats() -> dict[str, dict]:
    raw = {t.id: fisher_greater(*counts(t)) for t in TESTS}
    per_round = {}
    for r in {t.round for t in TESTS}:
        per_round |= holm({t.id: raw[t.id] for t in TESTS if t.round == r})
    together = holm(raw)
    return {
        t.id: {"counts": counts(t), "p": raw[t.id], "round": per_round[t.id], "four": together[t.id]} for t in TESTS
    }


def render() -> list[str]:
    """The table's rows, as docs/stability.md holds them."""
    rows = []
    s = stats()
    for t in TESTS:
        ka, na, kb, nb = s[t.id]["counts"]
        d, low, high = newcombe(ka, na, kb, nb)
        under = "supported" if s[t.id]["four"] < ALPHA else "undecided"
        rows.append(
            f"| {t.id}: {t.what} | {t.round} | {na} and {nb}, Fisher one-sided | {ka} of {na} against {kb} of {nb} | "
            f"{d:.2f} [{low:.2f}, {high:.2f}] | {fmt_p(s[t.id]['p'])} | {fmt_p(s[t.id]['round'])} | "
            f"{fmt_p(s[t.id]['four'])} | {t.published} | {under} |"
        )
    return rows


def _doc() -> str:
    return " ".join(DOC.read_text().split())  # a quoted sentence may wrap across lines


# ----------------------------------------------------------------------------- the table


def test_the_holm_table_is_recomputed_from_the_published_runs():
    lines = DOC.read_text().splitlines()
    (head,) = [i for i, line in enumerate(lines) if line.startswith("| test | round | n per arm, test |")]
    ours = []
    for line in lines[head + 2 :]:  # past the header and its rule, to the table's end
        if not line.startswith("|"):
            break
        ours.append(line)
    assert ours == render(), "docs/stability.md's Holm table differs from its recomputation:\n" + "\n".join(render())


def test_the_summary_at_a_glance_quotes_the_same_intervals_and_adjusted_p():
    lines = DOC.read_text().splitlines()
    (head,) = [i for i, line in enumerate(lines) if line.startswith("| promise | verdict as published |")]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[head + 2 : head + 6]]
    s = stats()
    for t, row in zip(TESTS, rows):
        ka, na, kb, nb = s[t.id]["counts"]
        d, low, high = newcombe(ka, na, kb, nb)
        assert f"{ka} of {na} against {kb} of {nb}" in row[1] and f"p = {fmt_p(s[t.id]['p'])}" in row[1], t.id
        assert row[3] == f"{d:.2f} [{low:.2f}, {high:.2f}]", t.id
        under = "supported" if s[t.id]["four"] < ALPHA else "undecided"
        adjusted = fmt_p(s[t.id]["four"])
        assert row[4] in (f"{under} ({adjusted})", f"{under} (adjusted p = {adjusted})"), t.id


def test_the_counts_and_p_values_are_the_published_verdicts():
    """The recomputation agrees with what each round published (verdicts.json, verdict.json)."""
    import json

    s = stats()
    published = json.loads((ROOT / "data/reference/confirm_round/verdicts.json").read_text())["verdicts"]
    for v in published:
        ka, na, kb, nb = s[v["id"]]["counts"]
        assert (v["trained_a"], v["n_a"], v["trained_b"], v["n_b"]) == (ka, na, kb, nb)
        assert v["p_for"] == pytest.approx(s[v["id"]]["p"], rel=1e-9)
    r5 = json.loads((ROOT / "data/reference/pb_relax_confirm/verdict.json").read_text())
    assert r5["p_for"] == pytest.approx(s["R5"]["p"], rel=1e-9)
    assert tuple(r5["trained_high"].values()) == s["R5"]["counts"][::2]


def test_holm_keeps_p1_and_p3_and_drops_round_5_of_the_four():
    s = stats()
    assert [k for k in s if s[k]["four"] < ALPHA] == ["P1", "P3"]
    assert s["R5"]["p"] < ALPHA / 1 and ALPHA / 2 < s["R5"]["p"]  # alone it stands; second of two it falls
    assert s["R5"]["four"] == pytest.approx(2 * s["R5"]["p"])


def test_the_statistics_on_known_values():
    # Holm on a textbook family: sorted 0.01, 0.02, 0.03 of m = 3 -> 0.03, 0.04, 0.04
    assert holm({"a": 0.03, "b": 0.01, "c": 0.02}) == pytest.approx({"b": 0.03, "c": 0.04, "a": 0.04})
    # Newcombe 1998, Table II, example (a): 56/70 against 48/80 -> 0.2000 [0.0524, 0.3339] (method 10)
    d, low, high = newcombe(56, 70, 48, 80)
    assert (round(d, 4), round(low, 4), round(high, 4)) == (0.2, 0.0524, 0.3339)
    assert fmt_p(5.362e-5) == "5.4e-5" and fmt_p(0.0343) == "0.034" and fmt_p(0.02857) == "0.029"


# ----------------------------------------------------------------------------- numbers the prose quotes


def test_p2_is_quoted_by_its_interval_and_its_planned_power():
    d, low, high = newcombe(*counts(TESTS[1]))
    doc = _doc()
    assert f"difference of shares {d:.2f}, Newcombe 95 % interval [{low:.2f}, {high:.2f}]" in doc
    power = fisher_power(0.8, 2 / 3, 12)  # the pilot's planned shares (Laplace: 4/5 and 2/3), n = 12
    assert f"about {100 * power:.1f} % power" in doc
    assert "excluded" not in " ".join(line for line in DOC.read_text().splitlines()[:40])


def test_the_aa_pair_is_quoted_as_unable_to_fail():
    doc = _doc()
    m = re.search(r"reject with probability ([\d.]+) % at shares of 0\.9 \(([\d.]+) % at 0\.85\)", doc)
    assert m, "docs/stability.md no longer quotes the A/A pair's chance of failing"
    assert m.groups() == (f"{100 * aa_rejection(0.9):.2f}", f"{100 * aa_rejection(0.85):.1f}")


def _s1_round_runs() -> pd.DataFrame:
    runs = _runs("confirm_round")
    return runs[(runs["size"] == "S1") & (runs["lr"] == 0.05) & (runs["seed"] < 400)]  # 401: the curves' seed


def test_the_collapse_is_described_from_the_published_runs():
    runs = _s1_round_runs()
    failed, trained = runs[~runs["trained"]], runs[runs["trained"]]
    curves = pd.read_csv(ROOT / "data/reference/confirm_round/curves.csv")
    curves = curves[(curves["size"] == "S1") & (curves["lr"] == 0.05) & (curves["seed"] < 400)]
    late = curves[curves["step"] >= 300].merge(runs[["arm", "seed", "trained"]], on=["arm", "seed"])
    grad = late.groupby(["arm", "seed", "trained"])["grad_norm"].median().groupby("trained").median()

    def logits(g):
        x = g["attn_logit_max"]
        return f"median {x.median():.0f}, {x.min():.0f}-{x.max():.0f}"

    doc = _doc()
    quoted = (
        f"the {len(failed)} runs that did not train reached largest attention logits of {logits(failed)}, "
        f"the {len(trained)} that trained {logits(trained)}"
    )
    assert quoted in doc, quoted
    quoted = f"gradient norm before clipping (the median over updates 300-600) is {grad[False]:.2f} in the runs that"
    assert quoted in doc, quoted
    assert f"did not train and {grad[True]:.1f} in those that did" in doc


def test_the_copy_task_and_the_collapse_timing_are_the_runs():
    runs = _runs("confirm_round")
    s1 = _s1_round_runs()
    clip1 = s1[(s1["arm"] == "prenorm_clip1") & s1["trained"]]["final_loss"]
    d12 = runs[(runs["size"] == "D12") & (runs["arm"] == "postnorm_deepnorm_clip1")]["final_loss"]
    doc = _doc()
    assert f"1.06-1.15 bits; its DeepNorm runs at D12: {d12.min():.2f}-{d12.max():.2f})" in doc
    assert f"{clip1.min():.2f}-{clip1.max():.2f} bits" == "1.06-1.15 bits"
    assert f"the {len(s1)} runs of round 3 with seeds 101-112 and 201-210" in doc
    curves = pd.read_csv(ROOT / "data/reference/confirm_round/curves.csv")
    failed = s1[~s1["trained"]][["arm", "seed"]]
    c = curves[(curves["size"] == "S1") & (curves["lr"] == 0.05)].merge(failed, on=["arm", "seed"])
    lowest = c.loc[c.groupby(["arm", "seed"])["train_loss_cb0"].idxmin(), "step"]
    assert f"its loss is lowest at updates {lowest.min():.0f}-{lowest.max():.0f}" in doc
    above = (s1[~s1["trained"]]["final_loss"] - s1[~s1["trained"]]["plateau"]).sort_values(ascending=False)
    on = above[above.abs() <= 0.02]
    off = ", ".join(f"{-x:.2f}" for x in above[above.abs() > 0.02]).replace(", ", " and ")
    assert f"{len(on)} of the {len(above)} end within 0.02 bits of the plateau, the other two {off} bits below" in doc


def test_round_5s_loss_scale_only_fell():
    curves = pd.read_csv(ROOT / "data/reference/pb_relax_confirm/curves.csv")
    runs = _runs("pb_relax_confirm")
    for _, g in curves.groupby(["size", "arm", "seed"]):
        scale = g.sort_values("step")["loss_scale"].dropna().to_numpy()
        assert (scale[1:] <= scale[:-1]).all()  # never grew back within 800 updates
    relax = runs[(runs["size"] == "S1-fp16-g128") & (runs["arm"] == "prenorm_attnrelax_clip1")]
    doc = _doc()
    quoted = (
        f"ended with scales of {relax['lowest_loss_scale'].min():g}-{relax['lowest_loss_scale'].max():g} after "
        f"{relax['overflow_skips'].min()}-{relax['overflow_skips'].max()} skipped updates"
    )
    assert quoted in doc, quoted
    last = curves[(curves["size"] == "S1-fp16-g128") & (curves["arm"] == "prenorm_attnrelax_clip1")]
    falling = [
        g.sort_values("step")["loss_scale"].to_numpy()[-2:] for _, g in last.groupby("seed")
    ]  # the last two rows (775, 800)
    assert sum(a > b for a, b in falling) == 1 and "one of them was still falling at update 800" in doc
    assert 2**14 // 1 == 16384 and 2**14 // (64 * 8) == 32 and 16384 // 32 == 512  # fairseq's window


def test_the_parameter_counts_are_the_models(monkeypatch):
    """S1 and D12 built as the sizing round declares them (config/experiments/proxy_sizing.yaml: the
    preset config/proxy.yaml with the round's size and the cell's overrides)."""
    from acoustic_mlm.experiments import declaration as D
    from acoustic_mlm.model.objective import AcousticMLM

    monkeypatch.chdir(ROOT)  # the declaration names its preset from the repository's root
    rnd = D.load(ROOT / "config" / "experiments" / "proxy_sizing.yaml")

    def params(size: str) -> int:
        cfg = D.settings(rnd, "prenorm_clip10", size, 1, lr=0.01)
        return sum(p.numel() for p in AcousticMLM(cfg.model_for("prenorm_clip10")).parameters())

    s1, d12 = params("S1"), params("D12")
    assert f"{round(s1 / 1000)} K parameters (S1; D12 {d12 / 1e6:.2f} M)" in _doc()
    assert "0.1 M parameters" not in _doc()


if __name__ == "__main__":
    print("\n".join(render()))
