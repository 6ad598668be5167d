"""Loudness normalisation before encoding: BS.1770 loudness per window, gains to the target,
silence left alone, and codes that do not depend on the recording level."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tokenizer_helpers import HOP, SR

from acoustic_mlm.tokenizer import codec, loudness
from acoustic_mlm.tokenizer.codec import TokenizerError
from acoustic_mlm.tokenizer.encode import encode_clips


def test_frame_gains_bring_clips_to_the_target_and_leave_silence_alone():
    rng = np.random.default_rng(0)
    x = (0.05 * rng.standard_normal(SR * 3)).astype(np.float32)
    g = loudness.frame_gains(x, "lufs", -23.0)
    assert g.shape == (len(x) // HOP,) and np.all(g == g[0])
    assert loudness.loudness_lufs(x * g[0]) == pytest.approx(-23.0, abs=0.01)
    g40 = loudness.frame_gains(x * 0.01, "lufs", -23.0)  # 40 dB quieter: 40 dB more gain, same result
    assert 20 * np.log10(g40[0] / g[0]) == pytest.approx(40.0, abs=0.01)
    quiet_then_loud = np.concatenate([x * 0.01, x]).astype(np.float32)
    r = loudness.frame_gains(quiet_then_loud, "rms", -20.0)  # one gain per window
    w = loudness.LOUDNESS_WINDOW_FRAMES
    assert np.all(r[:w] == r[0]) and r[w] != r[0]
    assert loudness.rms_dbfs(quiet_then_loud[: w * HOP] * r[0]) == pytest.approx(-20.0, abs=0.01)
    assert 20 * np.log10(np.median(r[: len(r) // 2]) / np.median(r[len(r) // 2 :])) == pytest.approx(40.0, abs=0.3)
    silence = np.zeros(SR * 2, np.float32)
    for method in loudness.LOUDNESS_METHODS:
        assert np.all(loudness.frame_gains(silence, method, -23.0) == 1.0)  # silence stays silence
    assert np.all(loudness.frame_gains(x[: SR // 10], "lufs", -23.0) == 1.0)  # under 400 ms: not measurable
    assert np.all(loudness.frame_gains(x, "none", -23.0) == 1.0)
    with pytest.raises(TokenizerError, match="tokenizer.loudness"):
        loudness.frame_gains(x, "peak", -23.0)


def _sine(freq: float, seconds: float, amplitude: float = 1.0) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * freq * np.arange(int(seconds * SR)) / SR)).astype(np.float32)


def test_window_loudness_is_bs1770_per_window():
    """A 0 dBFS 1 kHz sine reads -3.01 LUFS (BS.1770-4's calibration) in every window but the first
    (the filter's start-up), as pyloudnorm's integrated loudness of the whole clip; the partial last
    window is measured on its own samples; the filter's tail fades within two windows of silence."""
    w = loudness.LOUDNESS_WINDOW_FRAMES * HOP
    x = _sine(1000, 2.0)
    loud = loudness.window_loudness(x, w)
    assert len(loud) == -(-len(x) // w) and loud[1:] == pytest.approx(-3.01, abs=0.06)
    assert loudness.loudness_lufs(x) == pytest.approx(-3.01, abs=0.06)
    short = loudness.window_loudness(x[: len(x) - w // 2], w)
    assert short[-1] == pytest.approx(loud[-2], abs=0.06)  # half a window: the same loudness, not 3 dB less
    gap = loudness.window_loudness(np.concatenate([x[:w], np.zeros(3 * w, np.float32), x[:w]]), w)
    assert gap[1] < -40 and gap[2] < loudness.WINDOW_SILENCE_DB and gap[4] == pytest.approx(gap[0])  # filter tail
    assert np.isneginf(loudness.window_loudness(np.zeros(2 * w), w)).all()
    for frames in (1, 5, 8):  # clips of one window or less: one gain, bringing them to the target
        g = loudness.frame_gains(x[: frames * HOP], "kweighted", -23.0)
        assert len(g) == frames and np.all(g == g[0]) and 20 * np.log10(g[0]) == pytest.approx(-23 + 3.01, abs=1.5)


def test_kweighted_loudness_discounts_low_frequencies():
    """The point of loudness kweighted: a 40 Hz hum and a 1 kHz tone of the same RMS are not equally loud.
    K-weighting reads the hum 6.2 dB quieter (BS.1770's filters: -5.6 dB at 40 Hz, +0.6 dB at 1 kHz),
    so the tokenizer raises it by that much more, where loudness rms turns both by the same gain (glacier-bay-humpback:
    -8.9 dBFS RMS but -28 LUFS, docs/tokenizer.md)."""
    hum, tone = _sine(40, 2.0, 0.5), _sine(1000, 2.0, 0.5)
    k_hum, k_tone = (loudness.frame_gains(x, "kweighted", -23.0) for x in (hum, tone))
    r_hum, r_tone = (loudness.frame_gains(x, "rms", -23.0) for x in (hum, tone))
    w = loudness.LOUDNESS_WINDOW_FRAMES
    assert 20 * np.log10(r_hum / r_tone) == pytest.approx(0.0, abs=0.2)  # 107 ms holds 4.3 periods of 40 Hz
    extra_db = 20 * np.log10(np.median(k_hum) / np.median(k_tone))
    assert extra_db == pytest.approx(5.59 + 0.64, abs=0.1)
    assert np.all(k_tone[:w] == k_tone[0]) and len(k_tone) == len(tone) // HOP
    # the windows' loudness after their gains is the target
    scaled = tone * np.repeat(k_tone, HOP)[: len(tone)]
    assert loudness.window_loudness(scaled[w * HOP :], w * HOP)[:-1] == pytest.approx(-23.0, abs=0.1)


def test_windows_at_the_silence_floor_keep_gain_one():
    """Digital silence and a window at or below WINDOW_SILENCE_DB keep gain 1; a window just above is
    brought to the target."""
    w = loudness.LOUDNESS_WINDOW_FRAMES * HOP
    tone = _sine(1000, w * 3 / SR)
    floor = loudness.WINDOW_SILENCE_DB
    below = tone * 10 ** ((floor - 1 + 3.01) / 20)  # 1 dB under the floor, in LUFS
    above = tone * 10 ** ((floor + 5 + 3.01) / 20)
    x = np.concatenate([tone, below, np.zeros(w * 3, np.float32), above]).astype(np.float32)
    g = loudness.frame_gains(x, "kweighted", -23.0)
    n = loudness.LOUDNESS_WINDOW_FRAMES
    assert np.all(g[4 * n : 9 * n] == 1.0)  # below the floor (after the tone's filter tail), then zeros
    assert 20 * np.log10(g[-1]) == pytest.approx(-23.0 - floor - 5, abs=0.2)


@pytest.mark.slow
def test_loudness_normalised_codes_do_not_depend_on_the_recording_level(calibrated, prepared):
    """The same clip 30 dB quieter: the same codes with loudness kweighted and lufs, other codes without."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    row = manifest.iloc[0]
    audio = np.load(prepared / f"shard-{row['shard']:05d}" / "audio.npy", mmap_mode="r")
    clip = np.asarray(audio[row["offset"] : row["offset"] + row["num_samples"]])
    quiet = (clip * 10 ** (-30 / 20)).astype(np.float32)
    one = pd.DataFrame({"offset": [0], "num_samples": [len(clip)]})

    def codes(x, method):
        return encode_clips(model, x, one, frame_gain=loudness.frame_gains(x, method, -23.0))

    for method in ("kweighted", "lufs"):
        assert (codes(clip, method)[0] == codes(quiet, method)[0]).mean() > 0.99, method
    assert (codes(clip, "none")[0] == codes(quiet, "none")[0]).mean() < 0.5
