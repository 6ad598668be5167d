"""Rendering a score: its length and channels, silence without notes, a note's pitch and where it
sounds, pan, and the same audio for the same generator."""

from __future__ import annotations

import numpy as np
import pytest
from data_helpers import one_note_score

from acoustic_mlm.data.synth_render import _fft_len, midi_to_hz, render
from acoustic_mlm.data.synth_score import DrumTrack

SR = 24000
DRUMS = [
    DrumTrack(
        "kick",
        np.array([0.0, 0.5]),
        np.array([0.9, 0.7]),
        dict(f_start=150.0, f_end=50.0, sweep_tau=0.03, decay=0.2, click=0.1),
        gain=0.8,
        pan=0.5,
    ),
    DrumTrack(
        "snare",
        np.array([0.25]),
        np.array([0.8]),
        dict(tone_hz=200.0, tone_decay=0.05, noise_hz=3000.0, noise_q=1.0, noise_decay=0.1, tone_mix=0.4),
        gain=0.6,
        pan=0.45,
    ),
    DrumTrack(
        "hat",
        np.array([0.125, 0.375]),
        np.array([0.5, 0.4]),
        dict(noise_hz=9000.0, noise_q=1.2, decay=0.04),
        gain=0.3,
        pan=0.6,
    ),
]


def test_midi_to_hz():
    assert midi_to_hz([69, 81, 57]) == pytest.approx([440.0, 880.0, 220.0])
    assert float(midi_to_hz(60)) == pytest.approx(261.6256, abs=1e-4)


def test_one_note_has_the_scores_length_level_and_pitch_and_sounds_only_while_it_plays():
    audio = render(one_note_score(seconds=1.0, pitch=69.0, onset=0.1, gate=0.3), np.random.default_rng(0), SR)
    assert audio.shape == (SR, 1) and audio.dtype == np.float32 and np.isfinite(audio).all()
    assert np.abs(audio).max() == pytest.approx(0.5, rel=1e-6)  # peak normalised to the score's level
    x = audio[:, 0]
    start, end = int(0.1 * SR), int((0.1 + 0.3 + 0.05) * SR)  # onset; gate + release
    assert not x[:start].any() and not x[end + 1 :].any()
    note = x[start:end].astype(np.float64)
    peak_hz = np.fft.rfftfreq(len(note), 1 / SR)[np.argmax(np.abs(np.fft.rfft(note * np.hanning(len(note)))))]
    assert abs(peak_hz - 440.0) < 3.0


def test_without_notes_or_drums_the_render_is_silence():
    score = one_note_score(seconds=0.5, stereo=True)
    score.tracks = []
    audio = render(score, np.random.default_rng(0), SR)
    assert audio.shape == (SR // 2, 2) and not audio.any()


def test_a_note_panned_hard_left_is_silent_on_the_right():
    audio = render(one_note_score(stereo=True, pan=0.0), np.random.default_rng(0), SR)
    assert audio.shape == (SR, 2) and np.abs(audio[:, 0]).max() == pytest.approx(0.5, rel=1e-6)
    assert np.abs(audio[:, 1]).max() < 1e-6  # cos(0) left, sin(0) right


def test_drums_and_reverb_are_the_same_for_the_same_generator():
    score = one_note_score(seconds=1.0, stereo=True, drums=DRUMS, reverb_wet=0.3)
    a, b = (render(score, np.random.default_rng(7), SR) for _ in range(2))
    assert np.isfinite(a).all() and np.array_equal(a, b)
    assert np.abs(a[: int(0.1 * SR)]).max() > 0.01  # the kick at 0 s sounds before the note
    assert not np.array_equal(a, render(score, np.random.default_rng(8), SR))  # the noise is drawn from it


def test_fft_len_is_the_smallest_5_smooth_length():
    smooth = [m for m in range(1, 1100) if _is_5_smooth(m)]
    for n in (1, 7, 97, 1000, 1025):
        assert _fft_len(n) == min(m for m in smooth if m >= n)


def _is_5_smooth(m: int) -> bool:
    for p in (2, 3, 5):
        while m % p == 0:
            m //= p
    return m == 1
