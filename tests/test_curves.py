"""curves.py: each statistic of one loss curve on hand-made curves whose answer is worked out by hand.

First the step ranges that do not start at 0, sparse powers-of-two rows, the float slack, and the
late change and flattening that the stability map reads; at the end the first cases (one spike, two
spikes, a plain final loss and converged step, the clipped fraction).
"""

import math

import numpy as np
import pytest

from acoustic_mlm import curves as CV

POW2 = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000.0])  # the rows a run logs: powers of two, then the end


def test_final_window_is_the_last_tenth_of_the_step_range_not_of_the_rows():
    assert CV.final_window_start(np.array([100.0, 200, 1100])) == 1000.0  # 1100 - 0.1 x (1100 - 100)
    assert CV.final_window_start(POW2) == pytest.approx(1000 - 0.1 * 999)
    # powers of two: only the last row lies in [900.1, 1000], so the final loss is that row alone
    loss = np.linspace(10, 6, len(POW2))
    assert CV.final_loss(POW2, loss) == 6.0


def test_final_loss_averages_every_row_in_the_window():
    steps = np.arange(0, 101, 5.0)  # 0, 5, ..., 100: the window [90, 100] holds 90, 95, 100
    loss = np.full(len(steps), 7.0)
    loss[-3:] = [6.0, 5.0, 4.0]
    assert CV.final_loss(steps, loss) == pytest.approx(5.0)
    assert CV.final_loss([3, 4], [2.0, 1.0]) == 1.0  # two rows: the window is the last one


def test_converged_step_with_a_margin_covering_the_whole_curve_is_the_first_step():
    steps = np.array([10, 20, 30, 40, 50.0])
    loss = np.array([6.3, 6.2, 6.1, 6.0, 6.0])
    assert CV.converged_step(steps, loss, final=6.0, margin=0.5) == 10.0
    assert CV.converged_step(steps, loss, final=6.0, margin=0.15) == 30.0  # 6.2 is 0.2 away


def test_a_point_exactly_the_margin_away_is_inside_despite_float_rounding():
    steps = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.0])
    loss = np.array([9, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1, 1.0, 1.0])
    assert 1.1 - 1.0 > 0.1  # 0.10000000000000009 in floating point
    assert CV.converged_step(steps, loss, final=1.0, margin=0.1) == 1.0


def test_a_spike_on_a_plateau_recovers_at_the_first_point_back_within_the_margin():
    steps = np.array([0, 10, 20, 30, 40, 50, 60.0])
    loss = np.array([8.0, 6.0, 6.0, 7.5, 6.9, 6.3, 6.25])
    (spike,) = CV.detect_spikes(steps, loss, threshold=1.0, recovery_margin=0.3)
    assert spike == {
        "onset_step": 30,
        "peak_step": 30,
        "peak_bits": 7.5,
        "base_bits": 6.0,
        "height_bits": 1.5,
        "recovery_step": 50,
    }  # 6.3 <= 6.0 + 0.3: 6.9 is still up
    assert CV.detect_spikes(steps, loss, threshold=1.5, recovery_margin=0.3) == []  # 1.5 is not above 1.5


def test_the_base_is_the_minimum_of_the_points_before_and_a_lone_point_is_no_spike():
    steps = np.arange(6.0)
    loss = np.array([10.0, 12.0, 9.0, 9.5, 11.0, 9.0])  # 12 > 10 + 1: a spike; 11 > 9 + 1: another
    spikes = CV.detect_spikes(steps, loss, threshold=1.0, recovery_margin=0.1)
    assert [(s["onset_step"], s["base_bits"], s["recovery_step"]) for s in spikes] == [(1, 10.0, 2), (4, 9.0, 5)]
    assert CV.detect_spikes([0.0], [10.0], threshold=1.0, recovery_margin=0.1) == []


def test_late_change_is_the_mean_over_the_window_ending_at_three_quarters_minus_the_final_loss():
    steps = np.arange(0, 101, 5.0)
    loss = np.linspace(10.0, 5.0, len(steps))  # 0.25 bits per 5 steps
    # window [65, 75]: 6.75, 6.5, 6.25 (mean 6.5); final window [90, 100]: 5.5, 5.25, 5.0 (mean 5.25)
    assert CV.late_change(steps, loss) == pytest.approx(1.25)
    # no row inside [65.35, 75.25] (powers of two, then 100): the last row before 75 % of the range, 64
    sparse = np.array([1, 2, 4, 8, 16, 32, 64, 100.0])
    assert CV.late_change(sparse, np.array([9, 8, 7, 6, 5.5, 5.2, 5.1, 5.0])) == pytest.approx(0.1)


def test_a_curve_has_flattened_when_its_last_quarter_moved_it_by_at_most_a_tenth_of_its_fall():
    steps = np.arange(0, 101, 5.0)
    falling = np.linspace(10.0, 5.0, len(steps))  # late change 1.25 of a 4.75-bit fall (to 5.25): 26 %
    assert not CV.flattened(steps, falling)
    plateau = np.where(steps <= 50, 10.0 - steps / 10, 5.0)  # 10 -> 5 by step 50, flat after
    assert CV.late_change(steps, plateau) == 0.0 and CV.flattened(steps, plateau)
    edge = plateau.copy()
    edge[13:16] = 5.5  # window [65, 75] at 5.5: late change 0.5, exactly 10 % of the 5-bit fall
    assert CV.late_change(steps, edge) == pytest.approx(0.5) and CV.flattened(steps, edge)
    edge[13:16] = 5.6
    assert not CV.flattened(steps, edge)


def test_rising_non_finite_or_too_short_curves_have_not_flattened():
    steps = np.arange(0, 101, 5.0)
    assert not CV.flattened(steps, np.linspace(5.0, 10.0, len(steps)))  # no fall
    assert not CV.flattened(steps, np.full(len(steps), 5.0))  # a fall of 0
    diverged = np.where(steps <= 50, 10.0 - steps / 10, 5.0)
    diverged[-1] = math.nan
    assert not CV.flattened(steps, diverged)
    assert not CV.flattened([0.0, 1.0], [10.0, 5.0])


def test_spike_detection_positive():
    steps = np.arange(10) * 100
    loss = np.array([10, 8, 7, 6.0, 9.2, 7.0, 6.1, 5.9, 5.8, 5.8])
    (spike,) = CV.detect_spikes(steps, loss, threshold=0.5, recovery_margin=0.2)
    assert spike["peak_step"] == 400 and spike["onset_step"] == 400
    assert spike["base_bits"] == 6.0 and spike["height_bits"] == pytest.approx(3.2)
    assert spike["recovery_step"] == 600  # 6.1 <= 6.0 + 0.2


def test_spike_detection_negative_and_unrecovered():
    steps = np.arange(8) * 100
    smooth = np.array([10, 9, 8, 7, 6.5, 6.6, 6.4, 6.3])  # a 0.1-bit wobble is no spike
    assert CV.detect_spikes(steps, smooth, threshold=0.5, recovery_margin=0.2) == []
    rising = np.array([10, 8, 6, 6.1, 7.5, 8.0, 8.5, 9.0])  # rises and never comes back
    (spike,) = CV.detect_spikes(steps, rising, threshold=0.5, recovery_margin=0.2)
    assert spike["recovery_step"] is None and spike["peak_step"] == 700


def test_two_spikes_are_both_found():
    steps = np.arange(9)
    loss = np.array([10, 7, 9, 7, 6, 8, 6.1, 6, 6])
    spikes = CV.detect_spikes(steps, loss, threshold=1.0, recovery_margin=0.2)
    assert [(k["peak_step"], k["recovery_step"]) for k in spikes] == [(2, 3), (5, 6)]


def test_final_and_converged_step():
    steps = np.array([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.0])
    loss = np.array([10, 8, 7, 6.5, 6.2, 6.0, 6.3, 6.05, 6.0, 6.0, 5.9])
    assert CV.final_loss(steps, loss) == pytest.approx(5.95)  # the last 10 % of the range: steps >= 90
    # 6.3 at step 60 leaves the 0.1 band: converged only from 70 on
    assert CV.converged_step(steps, loss, 6.0, 0.1) == 70
    assert math.isnan(CV.converged_step(steps, np.r_[loss[:-1], 7.0], 6.0, 0.1))
    # within the band only from the final window on (step 90 of 0-100) is not converged
    late = np.array([10, 9, 9, 9, 9, 9, 9, 9, 9, 6.0, 6.0])
    assert math.isnan(CV.converged_step(steps, late, 6.0, 0.1))
    assert CV.converged_step(steps, np.r_[late[:8], 6.0, 6.0, 6.0], 6.0, 0.1) == 80


def test_clipped_fraction_counts_updates():
    assert CV.clipped_fraction(3, 12) == 0.25
    assert math.isnan(CV.clipped_fraction(0, 0))
