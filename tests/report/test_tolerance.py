"""`amlm verify`'s inexact check (report.tolerance): its windows, the difference it measures, and the
shipped tolerances recomputed from the runs they were measured on."""

import json

import pandas as pd
import pytest
from helpers import load_benchmark

from acoustic_mlm.artifacts.reference_run import META
from acoustic_mlm.report import tolerance


def _rows(losses, steps=(1, 2, 4, 8)):
    return pd.DataFrame({"seed": 1, "step": list(steps), "train_loss_cb0": losses, "valid_loss_cb0": losses})


def test_the_windows_hold_early_rows_tight_and_late_rows_to_their_own_tolerance():
    ref = _rows([10.0, 9.5, 9.0, 8.0])
    meta = {"tolerance_bits": 0.001, "tolerance_until_step": 2, "late_tolerance_bits": 0.5}
    wins = tolerance.windows(meta)
    assert [w["name"] for w in wins] == ["steps <= 2", "steps > 2"]
    assert [w["tolerance_bits"] for w in wins] == [0.001, 0.5]
    drifted = _rows([10.0, 9.5, 9.3, 8.4])  # 0.4 bits late: within 0.5
    early = tolerance.largest_difference(drifted, ref, wins[0]["steps"])
    late = tolerance.largest_difference(drifted, ref, wins[1]["steps"])
    assert early["bits"] == 0.0 and late["bits"] == pytest.approx(0.4) and late["step"] == 8
    broken = _rows([10.01, 9.5, 9.0, 8.0])  # 0.01 bits at step 1: outside 0.001
    assert tolerance.largest_difference(broken, ref, wins[0]["steps"])["bits"] == pytest.approx(0.01)
    assert tolerance.largest_difference(broken, ref, wins[1]["steps"])["bits"] == 0.0
    # without tolerance_until_step every row is held to tolerance_bits; --tolerance sets the first window
    assert [w["steps"] for w in tolerance.windows({"tolerance_bits": 0.01})] == [(-float("inf"), float("inf"))]
    assert tolerance.windows(meta, tolerance_bits=0.2)[0]["tolerance_bits"] == 0.2


@pytest.mark.parametrize("folder", ["smoke_run", "default_run"])
def test_the_shipped_tolerances_are_twice_what_was_measured_on_all_four_arms(root, folder):
    """benchmarks/verify_tolerances.py --write stored them; measured again here from the shipped runs."""
    script = load_benchmark("verify_tolerances")
    pinned, native, until = script.measure(folder)
    assert len(pinned) == 4 and (native is None or len(native) == 16)  # four arms; two machines x two vendors
    found = tolerance.tolerances_from(pinned, native)
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        meta = json.loads((root / "data" / "reference" / folder / vendor / META).read_text())
        for key, value in found.items():
            if value is not None:
                assert meta[key] == value, (vendor, key)
        assert pinned["early_largest"].max() * 2 <= meta["tolerance_bits"] < pinned["early_largest"].max() * 2.1


def test_thresholds_round_up_to_two_digits():
    assert (
        tolerance._round_up(0.0312) == 0.032 and tolerance._round_up(1.448) == 1.5 and tolerance._round_up(0.2) == 0.2
    )
    assert tolerance._round_up(3.86e-3) == 3.9e-3 and tolerance._round_up(0.0) == 0.0
