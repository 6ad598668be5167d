"""A curve's statistics for the claims: first, final, converged, spikes and divergence on a hand-made
curve, and `collect` over a curves table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from acoustic_mlm.errors import UserError
from acoustic_mlm.report.claims import ClaimThresholds
from acoustic_mlm.report.curve_stats import collect, curve_stats, rounded

STEPS = np.arange(0, 101, 10)  # the final window is steps 90 and 100 (the last 10 % of 0-100)
# falls to 6.0 by step 50, spikes 0.8 bits above that minimum at 60, back within 0.2 bits at 70
LOSS = np.array([10.0, 8.0, 7.0, 6.5, 6.05, 6.0, 6.8, 6.02, 6.0, 6.0, 6.0])


def test_a_curve_with_one_spike():
    s = curve_stats("a", 3, STEPS, LOSS, ClaimThresholds())
    assert (s.run, s.seed, s.first_step, s.first_bits, s.last_step) == ("a", 3, 0, 10.0, 100)
    assert s.final_bits == pytest.approx(6.0)  # mean of steps 90 and 100
    assert s.converged_step == 70.0  # after the spike every point is within 0.1 bits of 6.0
    assert s.converged_fraction == pytest.approx(0.7)
    assert s.diverged_step is None
    assert s.spikes == [
        {
            "onset_step": 60,
            "peak_step": 60,
            "peak_bits": 6.8,
            "base_bits": 6.0,
            "height_bits": pytest.approx(0.8),
            "recovery_step": 70,
        }
    ]


def test_the_thresholds_decide_what_counts():
    s = curve_stats("a", 1, STEPS, LOSS, ClaimThresholds(spike_threshold=1.0, recovery_margin=0.2, converge_margin=1.0))
    assert s.spikes == []  # 0.8 bits is not a spike at a 1-bit threshold
    assert s.converged_step == 20.0  # 7.0 is within 1 bit of 6.0, 8.0 is not


def test_a_diverged_curve_has_no_final_loss_and_spikes_only_before_it():
    loss = LOSS.copy()
    loss[8] = np.nan  # step 80
    s = curve_stats("a", 1, STEPS, loss, ClaimThresholds())
    assert s.diverged_step == 80 and math.isnan(s.final_bits) and math.isnan(s.converged_step)
    assert math.isnan(s.converged_fraction) and [k["onset_step"] for k in s.spikes] == [60]


def test_a_curve_never_within_the_margin_before_the_final_window_has_not_converged():
    s = curve_stats("a", 1, STEPS, np.linspace(10.0, 5.0, len(STEPS)), ClaimThresholds())
    assert math.isnan(s.converged_step) and s.spikes == []


def _table(rows):
    return pd.DataFrame(rows, columns=["run", "seed", "step", "split", "codebook", "loss_bits"])


def test_collect_takes_one_curve_per_run_and_seed_of_the_split_and_codebook():
    rows = [
        (run, seed, int(st), split, cb, float(y) + 0.5 * cb + (split == "valid"))
        for run in ("a", "b", "c")
        for seed in (2, 1)
        for split in ("train", "valid")
        for cb in (0, 1)
        for st, y in zip(STEPS, LOSS)
    ]
    rows.append(("a", 1, 100, "train", 0, 7.0))  # a resumed run logged step 100 twice: the mean, 6.5
    stats = collect(_table(rows), ["a", "b"], ClaimThresholds())
    assert sorted(stats) == ["a", "b"] and [s.seed for s in stats["a"]] == [1, 2]
    assert stats["a"][0].last_step == 100 and stats["a"][0].final_bits == pytest.approx((6.0 + 6.5) / 2)
    assert stats["b"][0].first_bits == 10.0  # train, codebook 0
    valid = collect(_table(rows), ["b"], ClaimThresholds(), split="valid", codebook=1)
    assert valid["b"][0].first_bits == 11.5
    no_seed = collect(_table(rows).drop(columns="seed"), ["c"], ClaimThresholds())
    assert [s.seed for s in no_seed["c"]] == [0]
    with pytest.raises(UserError, match=r"^loss curves lack column\(s\): codebook, split$"):
        collect(_table(rows).drop(columns=["split", "codebook"]), ["a"], ClaimThresholds())


def test_rounded_is_json_friendly():
    assert rounded(math.nan) is None and rounded(None) is None and rounded(math.inf) is None
    assert rounded(1.234567) == 1.2346 and rounded(1.23456, 2) == 1.23
    assert rounded(149.6, 0) == 150 and isinstance(rounded(149.6, 0), int)
