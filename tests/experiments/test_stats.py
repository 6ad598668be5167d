"""experiments.stats: Holm's step-down adjustment and the Newcombe interval, by hand and on the
published P2."""

from __future__ import annotations

import pytest

from acoustic_mlm.experiments.stats import fisher_greater, holm, newcombe


def test_holm_and_newcombe():
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    d = newcombe(11, 12, 6, 12)  # the published P2: 0.42 [0.05, 0.67]
    assert (round(d["estimate"], 2), round(d["low"], 2), round(d["high"], 2)) == (0.42, 0.05, 0.67)
    assert newcombe(12, 12, 0, 12)["high"] == 1.0


def test_fisher_greater_is_one_sided():
    assert fisher_greater(4, 4, 0, 4) == pytest.approx(1 / 70)
    assert fisher_greater(0, 4, 4, 4) == 1.0
