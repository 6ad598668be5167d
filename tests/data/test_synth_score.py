"""The score as data: what compose fills in (times in seconds, MIDI pitches, per-note arrays of one
length, onsets never before 0), independent of the sample rate it is rendered at."""

from __future__ import annotations

import numpy as np
from data_helpers import one_note_score

from acoustic_mlm.data import synth
from acoustic_mlm.data.synth_render import render
from acoustic_mlm.data.synth_score import DrumTrack, Score, Timbre, Track


def test_a_score_without_tracks_has_its_own_empty_lists():
    frame = dict(
        seconds=1.0,
        tempo=100.0,
        beats_per_bar=3,
        key=2,
        mode="minor",
        scale="blues",
        progression=(0, 3),
        bars_per_chord=2,
        swing=0.0,
        stereo=False,
        reverb_seconds=0.5,
        reverb_wet=0.0,
        level=0.5,
    )
    a, b = Score(**frame), Score(**frame)
    assert a.tracks == [] and a.drums == []
    a.tracks.append(one_note_score().tracks[0])
    assert b.tracks == []  # default_factory: no list shared between scores


def test_a_composed_score_holds_notes_of_one_length_in_range():
    for i in range(5):
        score = synth.compose(synth.clip_rng(3, i), 6.0)
        assert isinstance(score, Score) and score.seconds == 6.0
        assert score.mode in synth.MODES and score.scale in synth.SCALES and 0 <= score.key < 12
        assert score.tracks and all(isinstance(t, Track) and isinstance(t.timbre, Timbre) for t in score.tracks)
        for t in score.tracks:
            n = len(t.onset)
            assert len(t.gate) == len(t.pitch) == len(t.velocity) == n, t.name
            assert (t.onset >= 0).all() and (t.gate > 0).all(), t.name  # whole bars: render drops what starts late
            assert (t.onset < score.seconds).any(), t.name
            assert ((t.velocity >= 0) & (t.velocity <= 1)).all() and 0 <= t.pan <= 1, t.name
            assert ((t.pitch > 20) & (t.pitch < 110)).all(), t.name  # MIDI note numbers, not Hz
            assert len(t.timbre.harmonics) == len(t.timbre.phases), t.name
        for d in score.drums:
            assert isinstance(d, DrumTrack) and d.name in ("kick", "snare", "hat")
            assert len(d.onset) == len(d.velocity) and ((d.velocity >= 0) & (d.velocity <= 1)).all()


def test_a_score_does_not_depend_on_the_sample_rate():
    """Seconds and MIDI pitches: one score renders to the same duration at any rate."""
    score = one_note_score(seconds=0.8)
    for sr in (16000, 24000, 32000):
        audio = render(score, np.random.default_rng(0), sr)
        assert audio.shape == (round(0.8 * sr), 1)
