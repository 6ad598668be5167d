"""Render: a `Score` (synth_score) as audio at a sample rate.

Pitched tracks are band-limited wavetable oscillators (tables built from the timbre's harmonics,
truncated below Nyquist), vectorised over the notes of a track (cache-sized chunks, envelopes as
tables indexed by time since onset); drums are a pitch-swept sine (kick) and spectrally shaped
noise bursts (snare, hi-hat); then pan (some clips are stereo), a noise-tail reverb and peak
normalisation to the score's level. The noise is drawn from the clip's generator after `compose`
has drawn the score, so the same (seed, index) gives the same audio.
"""

from __future__ import annotations

import numpy as np

from acoustic_mlm.data.synth_score import DrumTrack, Score, Timbre, Track

A4_HZ = 440.0
TABLE_SIZE = 8192  # samples per wavetable period (nearest-sample lookup: errors below -65 dB)


def midi_to_hz(midi) -> np.ndarray:
    return A4_HZ * 2.0 ** ((np.asarray(midi, dtype=np.float64) - 69.0) / 12.0)


def _wavetables(t: Timbre, max_hz: float, sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """Dark table and (bright - dark), one period each, band-limited below Nyquist."""
    n_h = max(1, min(len(t.harmonics), int(0.45 * sample_rate / max(max_hz, 1.0))))
    k = np.arange(1, n_h + 1)
    tables = []
    for amps in (t.harmonics[:n_h], t.harmonics[:n_h] * k**-t.darken):
        spec = np.zeros(TABLE_SIZE // 2 + 1, dtype=np.complex128)
        spec[1 : n_h + 1] = amps * np.exp(1j * t.phases[:n_h])
        table = np.fft.irfft(spec, TABLE_SIZE)
        tables.append(table / (np.abs(table).max() + 1e-12))
    bright, dark = tables
    return dark.astype(np.float32), (bright - dark).astype(np.float32)


def _chunks(length: np.ndarray, max_samples: int) -> list[tuple[int, int]]:
    """Consecutive note ranges of at most ~max_samples samples (numpy temporaries stay in cache)."""
    bounds, acc, first = [], 0, 0
    for i, n in enumerate(length.tolist()):
        if acc and acc + n > max_samples:
            bounds.append((first, i))
            first, acc = i, 0
        acc += n
    bounds.append((first, len(length)))
    return bounds


def _render_tones(track: Track, sample_rate: int, n_out: int) -> np.ndarray:
    """All notes of a track: wavetable oscillators x ADSR, overlap-added.

    Everything that depends only on the time since onset (envelope, brightness, vibrato) is a
    table indexed by that sample count, so a note costs a few gathers per sample.
    """
    tb = track.timbre
    order = np.argsort(track.onset, kind="stable")
    hz = midi_to_hz(track.pitch[order])
    start = np.round(track.onset[order] * sample_rate).astype(np.int64)
    hold = np.round(track.gate[order] * sample_rate).astype(np.int64)
    n_rel = max(1, int(round(tb.release * sample_rate)))
    keep = start < n_out
    hz, start, hold, vel = hz[keep], start[keep], hold[keep], track.velocity[order][keep].astype(np.float32)
    length = np.minimum(hold + n_rel, n_out - start)
    if not len(length):
        return np.zeros(n_out)
    max_len = int(length.max())

    dark, diff = _wavetables(tb, hz.max() * 2 ** (tb.detune_cents / 1200), sample_rate)
    t = np.arange(max_len) / sample_rate
    a = max(tb.attack, 1e-3)  # linear attack, exponential decay towards sustain while held
    env_hold = np.where(t < a, t / a, tb.sustain + (1 - tb.sustain) * np.exp(-(t - a) / tb.decay)).astype(np.float32)
    env_release = (np.clip(1 - np.arange(max_len) / n_rel, 0, 1) ** 2).astype(np.float32)  # after the gate
    bright = np.exp(-t / tb.bright_tau).astype(np.float32)  # bright table fades into the dark one
    if tb.vibrato_cents > 0:  # warped time: the integral of 1 + v sin(2 pi r t)
        v, w = 2.0 ** (tb.vibrato_cents / 1200.0) - 1.0, 2 * np.pi * tb.vibrato_hz
        warped = t + v / w * (1.0 - np.cos(w * t))
    else:
        warped = t
    cents = tb.detune_cents if tb.detune_cents > 0.5 else 0.0
    detunes = (2 ** (cents / 1200), 2 ** (-cents / 1200)) if cents else (1.0,)

    out = np.zeros(n_out)
    for i0, i1 in _chunks(length, 1 << 15):
        ln = length[i0:i1]
        local = np.arange(int(ln.sum())) - np.repeat(np.cumsum(ln) - ln, ln)  # samples since onset
        sig = np.zeros(len(local), dtype=np.float32)
        for k, d in enumerate(detunes):
            ph = np.repeat(hz[i0:i1] * d * TABLE_SIZE, ln) * warped[local] + 0.37 * k * TABLE_SIZE
            j = ph.astype(np.int64) & (TABLE_SIZE - 1)  # nearest-sample lookup, phase wraps
            sig += dark[j] + bright[local] * diff[j]
        held = np.minimum(local, np.repeat(hold[i0:i1], ln))
        sig *= env_hold[held] * env_release[local - held] * np.repeat(vel[i0:i1] / len(detunes), ln)
        lo = int(start[i0])
        hi = int((start[i0:i1] + ln).max())
        out[lo:hi] += np.bincount(np.repeat(start[i0:i1] - lo, ln) + local, weights=sig, minlength=hi - lo)
    return out


def _shaped_noise(rng: np.random.Generator, n: int, sample_rate: int, centre: float, q: float) -> np.ndarray:
    """White noise through a log-Gaussian band around `centre` Hz (width ~ 1/q octaves)."""
    n_fft = _fft_len(n)  # arbitrary n may be prime: slow FFTs
    spec = np.fft.rfft(rng.standard_normal(n_fft))
    hz = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    centre = min(centre, 0.4 * sample_rate)
    octaves = np.log2(np.maximum(hz, 1.0) / centre)
    x = np.fft.irfft(spec * np.exp(-0.5 * (octaves * q) ** 2), n_fft)[:n]
    return x / (np.abs(x).max() + 1e-12)


def _drum_sample(rng: np.random.Generator, name: str, p: dict, sample_rate: int) -> np.ndarray:
    if name == "kick":
        t = np.arange(int(min(0.5, 6 * p["decay"]) * sample_rate)) / sample_rate
        # f(t) = f_end + (f_start - f_end) exp(-t / tau), phase = its integral
        phase = p["f_end"] * t + (p["f_start"] - p["f_end"]) * p["sweep_tau"] * (1 - np.exp(-t / p["sweep_tau"]))
        x = np.sin(2 * np.pi * phase) * np.exp(-t / p["decay"])
        x += p["click"] * rng.standard_normal(len(t)) * np.exp(-t / 0.002)
    elif name == "snare":
        t = np.arange(int(6 * max(p["tone_decay"], p["noise_decay"]) * sample_rate)) / sample_rate
        tone = np.sin(2 * np.pi * p["tone_hz"] * t) * np.exp(-t / p["tone_decay"])
        noise = _shaped_noise(rng, len(t), sample_rate, p["noise_hz"], p["noise_q"]) * np.exp(-t / p["noise_decay"])
        x = p["tone_mix"] * tone + (1 - p["tone_mix"]) * noise
    else:  # hat
        t = np.arange(int(min(1.0, 6 * p["decay"]) * sample_rate)) / sample_rate
        x = _shaped_noise(rng, len(t), sample_rate, p["noise_hz"], p["noise_q"]) * np.exp(-t / p["decay"])
    return (x / (np.abs(x).max() + 1e-12)).astype(np.float32)


def _render_drums(rng: np.random.Generator, d: DrumTrack, sample_rate: int, n_out: int) -> np.ndarray:
    """Hits drawn from 3 variants of the voice (real drum machines replay samples too)."""
    samples = np.stack([_drum_sample(rng, d.name, d.params, sample_rate) for _ in range(3)])
    variant = rng.integers(0, 3, len(d.onset))
    start = np.round(d.onset * sample_rate).astype(np.int64)
    out = np.zeros(n_out)
    for s, v, k in zip(start.tolist(), d.velocity.tolist(), variant.tolist()):
        if s < n_out:  # a few hundred slice adds beat one scattered add of every sample
            seg = samples[k, : n_out - s]
            out[s : s + len(seg)] += v * seg
    return out


def _fft_len(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= n (pocketfft is fast on these; often faster than the next 2^k)."""
    best = 1 << (n - 1).bit_length()
    f5 = 1
    while f5 < best:
        f35 = f5
        while f35 < best:
            m = f35
            while m < n:
                m *= 2
            best = min(best, m)
            f35 *= 3
        f5 *= 5
    return best


def _reverb(rng: np.random.Generator, x: np.ndarray, sample_rate: int, seconds: float, wet: float) -> np.ndarray:
    """Mono send convolved (FFT) with a decaying noise tail, one tail per output channel."""
    n_ir = int(seconds * sample_rate)
    t = np.arange(n_ir) / sample_rate
    n_fft = _fft_len(x.shape[0] + n_ir)
    hz = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    band = np.exp(-0.5 * (0.5 * np.log2(np.maximum(hz, 1.0) / 1500.0)) ** 2)  # a dark room
    send = np.fft.rfft(x.mean(axis=1).astype(np.float32), n_fft) * band.astype(np.float32)
    out = np.empty_like(x)
    for c in range(x.shape[1]):  # a different tail per channel widens stereo clips
        ir = (rng.standard_normal(n_ir) * np.exp(-6.9 * t / seconds)).astype(np.float32)  # -60 dB at the end
        ir /= np.sqrt((ir**2).sum()) + 1e-12
        tail = np.fft.irfft(send * np.fft.rfft(ir, n_fft), n_fft)
        out[:, c] = (1 - wet) * x[:, c] + wet * tail[: x.shape[0]]
    return out


def render(score: Score, rng: np.random.Generator, sample_rate: int) -> np.ndarray:
    """Audio of a score, (samples, channels) float32, peak = score.level."""
    n = int(round(score.seconds * sample_rate))
    stems = [(_render_tones(tr, sample_rate, n), tr.gain, tr.pan) for tr in score.tracks if len(tr.onset)]
    stems += [(_render_drums(rng, d, sample_rate, n), d.gain, d.pan) for d in score.drums]
    channels = 2 if score.stereo else 1
    mix = np.zeros((n, channels), dtype=np.float64)
    for y, gain, pan in stems:
        y = y * (gain / (np.abs(y).max() + 1e-9))  # stems are mixed by their gains, not their density
        if channels == 2:  # constant-power pan
            mix[:, 0] += np.cos(0.5 * np.pi * pan) * y
            mix[:, 1] += np.sin(0.5 * np.pi * pan) * y
        else:
            mix[:, 0] += y
    if score.reverb_wet > 0:
        mix = _reverb(rng, mix, sample_rate, score.reverb_seconds, score.reverb_wet)
    peak = np.abs(mix).max()
    if peak > 0:
        mix *= score.level / peak
    return mix.astype(np.float32)
