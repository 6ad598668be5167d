"""What the diagnostics show at a spike: a hand-made spike at step 60 and diagnostics around it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from acoustic_mlm.report.claims import ClaimThresholds
from acoustic_mlm.report.curve_stats import curve_stats
from acoustic_mlm.report.spike_diagnostics import explain_spikes

STEPS = np.arange(0, 101, 10)
LOSS = np.array([10.0, 8.0, 7.0, 6.5, 6.05, 6.0, 6.8, 6.02, 6.0, 6.0, 6.0])  # a spike: onset and peak 60


def _stats(run="a", seed=1):
    return {run: [curve_stats(run, seed, STEPS, LOSS, ClaimThresholds())]}


def _diagnostics(columns: dict, run="a", seed=1) -> pd.DataFrame:
    """{diagnostic: {step: value}} as diagnostics.csv's long rows."""
    rows = [(run, run, seed, step, name, value) for name, series in columns.items() for step, value in series.items()]
    return pd.DataFrame(rows, columns=["run", "label", "seed", "step", "diagnostic", "value"])


def test_a_gradient_norm_rise_and_overflow_skips_are_unusual():
    diag = _diagnostics(
        {
            "grad_norm_max": {10: 9.0, 30: 1.0, 40: 1.2, 50: 1.1, 60: 5.5, 70: 1.0},  # median before: 1.1 (last 3 rows)
            "attn_logit_max": {30: 10.0, 40: 10.0, 50: 10.0, 60: 12.0},
            "overflow_skips": {40: 1.0, 50: 1.0, 60: 3.0},  # cumulative: 2 skipped from the onset to the peak
            "nonfinite": {50: 0.0, 60: 0.0},
        }
    )
    [e] = explain_spikes(_stats(), diag)
    assert (e["run"], e["seed"], e["onset_step"], e["peak_step"]) == ("a", 1, 60, 60)
    assert e["height_bits"] == pytest.approx(0.8)
    assert e["grad_norm"] == {"max": 5.5, "median_before": 1.1, "ratio": 5.0}
    assert e["attn_logit"] == {"max": 12.0, "median_before": 10.0, "ratio": 1.2}
    assert (e["overflow_skips"], e["nonfinite"]) == (2, 0)
    assert e["unusual"] == ["gradient norm 5.0x its median", "2 update(s) skipped for fp16 overflow"]


def test_nothing_unusual_and_a_logit_beyond_float16():
    calm = _diagnostics({"grad_norm_max": {40: 1.0, 50: 1.0, 60: 2.9}, "attn_logit_max": {50: 10.0, 60: 11.0}})
    [e] = explain_spikes(_stats(), calm)
    assert e["unusual"] == [] and e["overflow_skips"] is None and e["nonfinite"] is None  # not logged
    assert explain_spikes(_stats(), calm, factor=2.0)[0]["unusual"] == ["gradient norm 2.9x its median"]
    huge = _diagnostics({"attn_logit_max": {50: 60000.0, 60: 70000.0}})
    [e] = explain_spikes(_stats(), huge)
    assert e["grad_norm"] is None and e["unusual"] == ["attention logit beyond float16's range"]


def test_only_the_spiking_seeds_rows_are_read_and_no_spike_explains_nothing():
    diag = pd.concat(
        [
            _diagnostics({"grad_norm_max": {50: 1.0, 60: 1.0}}),
            _diagnostics({"grad_norm_max": {50: 1.0, 60: 100.0}}, seed=2),
        ]
    )
    [e] = explain_spikes(_stats(), diag)
    assert e["grad_norm"]["max"] == 1.0 and e["unusual"] == []
    flat = {"a": [curve_stats("a", 1, STEPS, np.full(len(STEPS), 6.0), ClaimThresholds())]}
    assert explain_spikes(flat, diag) == []
