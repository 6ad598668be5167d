"""figure.py: which arms coincide, the step axis, the marks at a diverged or skipped run's end, and
the refusals, on curves made up in the test. The saved files, axes, legend and styles of whole
figures are in test_aggregate_figure.py."""

import re

import numpy as np
import pandas as pd
import pytest

from acoustic_mlm.errors import UserError
from acoustic_mlm.report import figure

plt = figure.plt  # pyplot on the Agg backend, as figure.py sets it

STEPS = [1, 2, 4, 8, 16]


def _curve(label: str, loss, seed: int = 1, nonfinite: int = 0) -> pd.DataFrame:
    return pd.DataFrame({"label": label, "seed": seed, "step": STEPS[: len(loss)], "loss_bits": loss,
                         "nonfinite": nonfinite})


def test_arms_within_two_hundredths_of_a_bit_at_every_step_coincide():
    base = np.array([10.0, 9.0, 8.0, 7.0, 6.0])
    data = pd.concat([_curve("A", base), _curve("B", base + [0.0, 0.01, -0.015, 0.005, 0.0]),
                      _curve("C", base + [0.0, 0.0, 0.0, 0.03, 0.0])])  # C leaves the band once
    ((a, b, diff),) = figure.coinciding(data, ["A", "B", "C"])
    assert (a, b) == ("A", "B") and diff == pytest.approx(0.015)
    assert figure.coincidence_note(data, ["A", "B", "C"]) == "B coincides with\nA (within 0.02 bits)"
    assert figure.coincidence_note(data, ["A", "C"]) is None


def test_coincidence_compares_the_means_over_seeds():
    data = pd.concat([_curve("A", [10.0, 9.0, 8.0], seed=1), _curve("A", [10.2, 9.2, 8.2], seed=2),
                      _curve("B", [10.1, 9.1, 8.1])])  # B is A's mean, not within 0.02 of either seed
    assert [(a, b) for a, b, _ in figure.coinciding(data, ["A", "B"])] == [("A", "B")]


def test_the_step_axis_is_logarithmic_in_thousands_and_padded_at_both_ends():
    fig, ax = plt.subplots()
    figure.log_step_axis(ax, 0.0, 50_000)  # a first step of 0 still gives a positive left limit
    assert ax.get_xscale() == "log"
    assert ax.get_xlim() == pytest.approx((1 / figure.X_PAD, 50_000 * figure.X_PAD))
    assert [figure.step_label(x) for x in (0.5, 20, 1500, 1e6)] == ["0.5", "20", "1.5K", "1000K"]
    plt.close(fig)


def test_a_diverged_seed_gets_an_x_at_its_last_finite_point():
    styles = {"A": figure.ROLE_STYLES["clip10"], "B": figure.ROLE_STYLES["clip1"]}
    selected = pd.concat([_curve("A", [10.0, 9.0, 8.5, np.nan, np.inf]), _curve("B", [10.0, 9.0, 8.0, 7.0, 6.0]),
                          _curve("B", [np.nan, np.nan], seed=2)])  # no finite point at all: nothing to mark
    fig, ax = plt.subplots()
    assert figure.mark_divergence(ax, selected, styles) == ["A"]
    (x_mark,) = ax.get_lines()
    assert x_mark.get_marker() == "X" and list(x_mark.get_xdata()) == [4] and list(x_mark.get_ydata()) == [8.5]
    assert [t.get_text() for t in ax.texts] == ["diverged (seed 1)"]
    plt.close(fig)


def test_a_completed_run_that_skipped_one_update_says_so_in_the_singular():
    styles = {"A": figure.ROLE_STYLES["clip10"], "B": figure.ROLE_STYLES["clip1"]}
    selected = pd.concat([_curve("A", [10.0, 9.0, 8.0], nonfinite=1), _curve("B", [10.0, 9.0, np.nan], nonfinite=2)])
    fig, ax = plt.subplots()
    assert figure.mark_nonfinite(ax, selected, styles) == ["A"]  # B diverged: mark_divergence marks it
    assert [t.get_text() for t in ax.texts] == ["1 non-finite update skipped (seed 1)"]
    assert figure.mark_nonfinite(ax, selected.drop(columns="nonfinite"), styles) == []
    plt.close(fig)


def test_more_arms_without_a_role_than_styles_are_refused_naming_the_arm():
    runs = {f"extra{i}": {"label": f"Extra {i}", "role": None} for i in range(len(figure.EXTRA_STYLES) + 1)}
    with pytest.raises(UserError, match=r"runs\.extra6: the figure can style 6 arms without a role"):
        figure.arm_styles(runs)


def test_an_arm_without_rows_in_the_split_is_named(smoke_cfg):
    labels = [r["label"] for r in smoke_cfg["runs"].values()]
    rows = [{"run": name, "seed": 1, "step": s, "split": "train", "codebook": 0, "loss_bits": 10.0 - s / 10}
            for name in list(smoke_cfg["runs"])[:3] for s in STEPS]
    with pytest.raises(UserError, match=re.escape(f"loss curves hold no train codebook-0 rows for: {labels[3]}")):
        figure.draw(pd.DataFrame(rows), smoke_cfg["runs"], {"split": "train"})
