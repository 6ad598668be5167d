"""The procedural music generator: deterministic, independent clips, music rather than noise."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from acoustic_mlm.data import synth

SR = 24000


def spectral_flatness(x: np.ndarray) -> float:
    """Geometric over arithmetic mean of the Welch power spectrum: ~1 for white noise, ~0 for tones."""
    n = 1024
    frames = np.lib.stride_tricks.sliding_window_view(x, n)[:: n // 2] * np.hanning(n)
    p = (np.abs(np.fft.rfft(frames, axis=1)) ** 2).mean(axis=0)[1:] + 1e-20
    return float(np.exp(np.log(p).mean()) / p.mean())


def tonal_fraction(x: np.ndarray, sr: int, tol_cents: float = 20.0) -> float:
    """Share of 100 Hz-2 kHz power within tol_cents of an equal-tempered pitch (A4 = 440 Hz).

    A flat spectrum gives 2 * tol_cents / 100 = 0.4; tuned notes give much more.
    """
    power = np.abs(np.fft.rfft(x * np.hanning(len(x)))) ** 2
    hz = np.fft.rfftfreq(len(x), 1.0 / sr)
    band = (hz >= 100) & (hz <= 2000)
    cents = 1200 * np.log2(hz[band] / 440.0)
    off = np.abs((cents + 50) % 100 - 50)
    return float(power[band][off < tol_cents].sum() / power[band].sum())


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    return [synth.generate_clip(synth.clip_rng(7, i), 2.0, SR) for i in range(6)]


def corpus_bytes(folder, **kw) -> dict[str, bytes]:
    paths = synth.generate_corpus(folder, **kw)
    return {p.name: p.read_bytes() for p in paths}


def test_corpus_is_identical_for_a_seed_and_differs_for_another(tmp_path):
    kw = dict(n_clips=3, clip_seconds=1.0, sample_rate=16000)
    a = corpus_bytes(tmp_path / "a", seed=0, **kw)
    b = corpus_bytes(tmp_path / "b", seed=0, **kw)
    c = corpus_bytes(tmp_path / "c", seed=1, **kw)
    assert list(a) == ["synth_00000.flac", "synth_00001.flac", "synth_00002.flac"]
    assert a == b
    assert all(a[k] != c[k] for k in a)
    assert len({v for v in a.values()}) == 3  # clips differ from each other


def test_a_clip_does_not_depend_on_the_others(tmp_path):
    one = corpus_bytes(tmp_path / "one", n_clips=1, clip_seconds=1.0, sample_rate=16000, seed=3)
    two = corpus_bytes(tmp_path / "two", n_clips=2, clip_seconds=1.0, sample_rate=16000, seed=3)
    assert one["synth_00000.flac"] == two["synth_00000.flac"]


def test_flac_files_are_pcm16_at_the_requested_rate(tmp_path):
    (path,) = synth.generate_corpus(tmp_path, n_clips=1, clip_seconds=1.5, sample_rate=32000, seed=0)
    info = sf.info(str(path))
    assert (info.format, info.subtype, info.samplerate, info.frames) == ("FLAC", "PCM_16", 32000, 48000)


def test_clip_shape_and_range(clips):
    for x in clips:
        assert x.dtype == np.float32 and x.ndim == 2 and x.shape[0] == 2 * SR and x.shape[1] in (1, 2)
        assert np.isfinite(x).all()
        peak = np.abs(x).max()
        assert 0.2 < peak <= 0.9 + 1e-6  # peak-normalised to 0.9 x a gain in [-12, 0] dB
        assert np.sqrt((x.astype(np.float64) ** 2).mean()) > 0.01  # not silent


def test_clips_are_tuned_music_not_noise(clips):
    noise = np.random.default_rng(0).standard_normal(2 * SR)
    assert spectral_flatness(noise) > 0.8
    assert tonal_fraction(noise, SR) < 0.5
    for x in clips:
        mono = x.mean(axis=1)
        assert spectral_flatness(mono) < 0.2
        assert tonal_fraction(mono, SR) > 0.6


def test_stereo_and_mono_clips_both_occur():
    channels = {synth.generate_clip(synth.clip_rng(0, i), 0.25, 8000).shape[1] for i in range(24)}
    assert channels == {1, 2}


def test_stereo_channels_differ():
    for i in range(24):
        x = synth.generate_clip(synth.clip_rng(0, i), 1.0, 8000)
        if x.shape[1] == 2:
            assert not np.allclose(x[:, 0], x[:, 1])
            return
    pytest.fail("no stereo clip among 24")


def test_score_is_structured_music():
    for i in range(20):
        score = synth.compose(synth.clip_rng(1, i), 8.0)
        assert 70 <= score.tempo <= 160 and score.beats_per_bar in (3, 4)
        names = [t.name for t in score.tracks]
        assert names[0] == "lead" and len(names) >= 2
        mode = {(score.key + iv) % 12 for iv in synth.MODES[score.mode]}
        melody = {(score.key + iv) % 12 for iv in synth.SCALES[score.scale]}
        for track in score.tracks:
            pcs = set(np.round(track.pitch).astype(int) % 12)
            assert pcs <= (mode | melody if track.name == "lead" else mode), (i, track.name)
        # bass and chords repeat one rhythm per bar: onsets fall on few distinct grid positions
        bar_s = score.beats_per_bar * 60.0 / score.tempo
        for track in score.tracks[1:]:
            phase = np.round((track.onset % bar_s) / (bar_s / 48)).astype(int) % 48
            assert len(set(phase)) <= 24


def test_generate_clip_is_fast_enough():
    import time

    t0 = time.perf_counter()
    synth.generate_clip(synth.clip_rng(0, 0), 10.0, 32000)
    assert time.perf_counter() - t0 < 2.0  # about 0.1 s here; the default corpus is 64 of these
