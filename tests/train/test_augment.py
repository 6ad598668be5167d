"""augment.py: the mixed crops' shapes, the energy the noise adds, and where the noise comes from.

The draws' ranges, their determinism per (seed, step) and MERT's bounds are in
tests/model/test_recipe_model.py (MERT's recipe, switch by switch).
"""

import numpy as np
import pytest

from acoustic_mlm.train.augment import Segment, apply_mixture, draw_mixture

L = 1000  # samples per crop
GROUPS = [np.array([0, 2]), np.array([1, 3])]  # two pools of two crops: 0 with 2, 1 with 3


def _crops() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((4, L)).astype(np.float32)


def test_mixed_crops_keep_shape_and_dtype_and_the_clean_crops_are_untouched():
    wav = _crops()
    before = wav.copy()
    plan = draw_mixture(np.random.default_rng(1), GROUPS, L, 1.0, (1, 3), (50, 200))
    out = apply_mixture(wav, np.arange(4), GROUPS, plan, volume=1.0)
    assert out.shape == (4, L) and out.dtype == np.float32
    np.testing.assert_array_equal(wav, before)  # the CQT target reads the clean crops afterwards
    assert {s.row for s in plan} == {0, 1, 2, 3}  # mixture_prob 1: every crop is mixed


def test_one_segment_of_a_constant_crop_adds_volume_squared_times_its_energy():
    wav = np.zeros((4, L), dtype=np.float32)
    wav[2] = 0.25  # the only pool crop with signal: crop 0 hears it, crop 2 hears silent crop 0
    plan = draw_mixture(np.random.default_rng(3), GROUPS, L, 1.0, (1, 1), (100, 300))
    out = apply_mixture(wav, np.arange(4), GROUPS, plan, volume=0.5)
    (seg,) = [s for s in plan if s.row == 0]
    added = out[0] - wav[0]
    assert np.sum(added**2) == pytest.approx(0.5**2 * 0.25**2 * seg.length)
    assert np.count_nonzero(added) == seg.length  # where the segment lands, nowhere else
    assert np.all(added[seg.position : seg.position + seg.length] == np.float32(0.125))
    np.testing.assert_array_equal(out[[1, 2, 3]], wav[[1, 2, 3]])  # their pools are silent


def test_the_added_noise_is_linear_in_the_volume():
    wav = _crops()
    plan = draw_mixture(np.random.default_rng(4), GROUPS, L, 1.0, (2, 3), (50, 400))  # overlaps allowed
    unit = apply_mixture(wav, np.arange(4), GROUPS, plan, volume=1.0) - wav
    np.testing.assert_allclose(
        apply_mixture(wav, np.arange(4), GROUPS, plan, volume=0.3) - wav, 0.3 * unit, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(apply_mixture(wav, np.arange(4), GROUPS, plan, volume=0.0), wav)


def test_noise_comes_only_from_the_other_crops_of_the_same_group():
    wav = np.zeros((4, L), dtype=np.float32)
    wav[[0, 2]] = 1.0  # group [0, 2] has signal, group [1, 3] is silent
    plan = draw_mixture(np.random.default_rng(5), GROUPS, L, 1.0, (1, 3), (50, 200))
    out = apply_mixture(wav, np.arange(4), GROUPS, plan, volume=1.0)
    assert np.all(out[[1, 3]] == 0.0) and np.all(out[[0, 2]] >= 1.0) and np.any(out[[0, 2]] > 1.0)


def test_without_mixing_the_plan_is_empty_and_the_crops_come_back_equal():
    wav = _crops()
    plan = draw_mixture(np.random.default_rng(6), GROUPS, L, 0.0, (1, 3), (50, 200))
    assert plan == []
    np.testing.assert_array_equal(apply_mixture(wav, np.arange(4), GROUPS, plan, volume=1.0), wav)


def test_a_group_split_between_processes_cannot_be_mixed():
    wav = _crops()
    plan = [Segment(row=0, pool_start=0, length=10, position=0)]
    with pytest.raises(KeyError):  # crop 2, row 0's pool, is on another process
        apply_mixture(wav[[0, 1]], np.array([0, 1]), GROUPS, plan, volume=1.0)


@pytest.mark.parametrize("segments, samples", [((3, 1), (50, 200)), ((0, 2), (50, 200)), ((1, 3), (200, 50))])
def test_ranges_that_are_not_increasing_and_positive_are_refused(segments, samples):
    with pytest.raises(ValueError, match="must be increasing and positive"):
        draw_mixture(np.random.default_rng(0), GROUPS, L, 0.5, segments, samples)
