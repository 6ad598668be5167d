"""Procedural music: a deterministic, numpy-only generator of short multi-instrument clips.

The offline stand-in for a music corpus. Each clip is composed, then rendered:

- `compose(rng, seconds)` draws a `Score`: tempo (70-160 BPM), metre (4/4 or 3/4), key, mode,
  melody scale (the mode, its pentatonic or blues subset), a 4-chord progression, and note
  events for a lead melody (a 1-2 bar motif repeated in a form such as AABA, transposed to
  each chord, snapped to chord tones on beats), a bass line (one rhythm pattern per clip on
  chord roots, fifths and octaves), a chord layer (pads, strums or arpeggios) and drums
  (kick, snare, hi-hat on a per-clip pattern with fills). Each instrument gets a random timbre:
  a harmonic amplitude profile, a brightness that decays, detune, vibrato and an ADSR envelope.
- `render(score, rng, sample_rate)` turns it into audio, band-limited (wavetables built from
  the harmonics, truncated below Nyquist), vectorised over the notes of a track (cache-sized
  chunks, envelopes as tables indexed by time since onset); drums
  are a pitch-swept sine (kick) and spectrally shaped noise bursts (snare, hi-hat); then pan
  (some clips are stereo), a noise-tail reverb and peak normalisation to 0.9 x a random gain.

The structure (bars, repetition, harmony) is what makes the tokens learnable; the randomness
of timbre and mix is what makes them varied. Same seed, same clip, on any machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

A4_HZ = 440.0
TABLE_SIZE = 8192  # samples per wavetable period (nearest-sample lookup: errors below -65 dB)
STEPS_PER_BEAT = 4  # the rhythmic grid is the 16th note

# Diatonic modes (semitones above the tonic); chords are stacked thirds of these.
MODES: dict[str, tuple[int, ...]] = {
    "major": (0, 2, 4, 5, 7, 9, 11),
    "mixolydian": (0, 2, 4, 5, 7, 9, 10),
    "minor": (0, 2, 3, 5, 7, 8, 10),
    "dorian": (0, 2, 3, 5, 7, 9, 10),
    "harmonic_minor": (0, 2, 3, 5, 7, 8, 11),
}
MAJOR_LIKE = ("major", "mixolydian")
# Melody scales: a mode itself or one of these subsets / blues.
SCALES: dict[str, tuple[int, ...]] = {
    **MODES,
    "major pentatonic": (0, 2, 4, 7, 9),
    "minor pentatonic": (0, 3, 5, 7, 10),
    "blues": (0, 3, 5, 6, 7, 10),
}
# Chord progressions as 0-based scale degrees (I V vi IV = 0 4 5 3).
PROGRESSIONS_MAJOR = ((0, 4, 5, 3), (0, 5, 3, 4), (0, 3, 4, 3), (0, 3, 0, 4), (5, 3, 0, 4), (0, 1, 4, 0), (0, 0, 3, 4))
PROGRESSIONS_MINOR = ((0, 5, 2, 6), (0, 3, 4, 0), (0, 6, 5, 6), (0, 5, 3, 4), (0, 3, 0, 4), (0, 2, 5, 4))
FORMS = ("AABA", "ABAB", "AAAB", "ABAC", "AABB")


def midi_to_hz(midi) -> np.ndarray:
    return A4_HZ * 2.0 ** ((np.asarray(midi, dtype=np.float64) - 69.0) / 12.0)


# --------------------------------------------------------------------------------------------
# Score: what is played (independent of the sample rate)
# --------------------------------------------------------------------------------------------


@dataclass
class Timbre:
    """How a pitched instrument sounds."""

    harmonics: np.ndarray  # amplitude of harmonic k = 1..H of the bright wavetable
    phases: np.ndarray  # phase of each harmonic (radians)
    darken: float  # the dark wavetable is harmonics * k**-darken
    bright_tau: float  # s; the bright table fades into the dark one with this time constant
    attack: float  # s, linear rise
    decay: float  # s, exponential time constant towards sustain
    sustain: float  # level held while the note is on
    release: float  # s, fade after the note ends
    detune_cents: float  # two oscillators at +-detune; 0: one oscillator
    vibrato_hz: float
    vibrato_cents: float  # 0: no vibrato


@dataclass
class Track:
    """Pitched notes of one instrument."""

    name: str
    onset: np.ndarray  # s
    gate: np.ndarray  # s the note is held before its release
    pitch: np.ndarray  # MIDI note number (float)
    velocity: np.ndarray  # 0..1
    timbre: Timbre
    gain: float  # linear mix gain
    pan: float  # 0 = left, 0.5 = centre, 1 = right


@dataclass
class DrumTrack:
    """Hits of one percussion voice."""

    name: str  # "kick" | "snare" | "hat"
    onset: np.ndarray  # s
    velocity: np.ndarray  # 0..1
    params: dict  # voice parameters (pitches, decays, filter bands)
    gain: float
    pan: float


@dataclass
class Score:
    seconds: float
    tempo: float  # BPM
    beats_per_bar: int
    key: int  # tonic pitch class, 0 = C
    mode: str  # harmony (a key of MODES)
    scale: str  # melody scale (a key of SCALES)
    progression: tuple[int, ...]  # scale degrees, one chord per `bars_per_chord` bars
    bars_per_chord: int
    swing: float  # delay of off-beat 8ths, as a fraction of a 16th
    stereo: bool
    reverb_seconds: float
    reverb_wet: float
    level: float  # output peak
    tracks: list[Track] = field(default_factory=list)
    drums: list[DrumTrack] = field(default_factory=list)


def _melody_scale(rng: np.random.Generator, mode: str) -> str:
    """The mode itself, its pentatonic, or (minor modes) the blues scale."""
    major = mode in MAJOR_LIKE
    kind = rng.choice(["mode", "pentatonic", "blues"], p=[0.5, 0.38, 0.12])
    if kind == "pentatonic":
        return "major pentatonic" if major else "minor pentatonic"
    if kind == "blues" and not major:
        return "blues"
    return mode


def _chord_pcs(key: int, mode: str, degree: int, seventh: bool) -> list[int]:
    """Pitch classes (root first) of the stacked-thirds chord on a scale degree."""
    iv = MODES[mode]
    n = 4 if seventh else 3
    return [(key + iv[(degree + 2 * j) % 7]) % 12 for j in range(n)]


def _voicing(pcs: list[int], centre: int) -> np.ndarray:
    """Each pitch class in the octave around `centre`: close voicings, smooth voice leading."""
    lo = centre - 6
    return np.sort(np.array([lo + (pc - lo) % 12 for pc in pcs], dtype=np.float64))


def _bar_pattern(rng: np.random.Generator, bar_steps: int, busy: float) -> np.ndarray:
    """Onset steps within a bar: always the downbeat, beats likely, off-beats less so."""
    steps = [0]
    for s in range(1, bar_steps):
        p = busy if s % STEPS_PER_BEAT == 0 else busy * (0.45 if s % 2 == 0 else 0.12)
        if rng.random() < p:
            steps.append(s)
    return np.array(steps)


def _timbre(rng: np.random.Generator, role: str) -> Timbre:
    """A random instrument of a role: lead, bass, pad or pluck."""
    u = rng.uniform
    if role == "pad":
        n_h, tilt = rng.integers(6, 14), u(1.0, 2.0)
        env = dict(attack=u(0.05, 0.5), decay=u(0.3, 1.5), sustain=u(0.6, 0.9), release=u(0.3, 1.0))
        bright_tau, detune, vib = u(0.5, 3.0), u(3.0, 12.0), (u(0.2, 1.0), u(0.0, 6.0))
    elif role == "pluck":
        n_h, tilt = rng.integers(6, 16), u(0.6, 1.6)
        env = dict(attack=u(0.001, 0.008), decay=u(0.12, 0.6), sustain=u(0.0, 0.15), release=u(0.05, 0.3))
        bright_tau, detune, vib = u(0.04, 0.3), u(0.0, 4.0), (5.0, 0.0)
    elif role == "bass":
        n_h, tilt = rng.integers(3, 9), u(1.0, 2.5)
        env = dict(attack=u(0.003, 0.02), decay=u(0.1, 0.5), sustain=u(0.3, 0.8), release=u(0.03, 0.12))
        bright_tau, detune, vib = u(0.05, 0.5), 0.0, (5.0, 0.0)
    else:  # lead
        n_h, tilt = rng.integers(5, 15), u(0.7, 1.8)
        env = dict(attack=u(0.005, 0.06), decay=u(0.1, 0.5), sustain=u(0.45, 0.9), release=u(0.05, 0.25))
        bright_tau, detune = u(0.2, 2.0), (u(2.0, 8.0) if rng.random() < 0.3 else 0.0)
        vib = (u(4.5, 6.5), u(0.0, 25.0) if rng.random() < 0.7 else 0.0)
    k = np.arange(1, n_h + 1, dtype=np.float64)
    amps = k**-tilt * rng.lognormal(0.0, 0.35, n_h)
    if rng.random() < 0.2:  # hollow, clarinet-like: weak even harmonics
        amps[1::2] *= u(0.05, 0.3)
    if rng.random() < 0.3:  # a formant bump
        centre, width = u(2.0, n_h), u(1.0, 3.0)
        amps *= 1.0 + u(0.5, 2.0) * np.exp(-0.5 * ((k - centre) / width) ** 2)
    amps[0] = max(amps[0], 0.5 * amps.max())  # the fundamental stays audible
    return Timbre(
        harmonics=amps / amps.max(),
        phases=rng.uniform(0.0, 2 * np.pi, n_h),
        darken=u(1.0, 2.5),
        bright_tau=bright_tau,
        detune_cents=detune,
        vibrato_hz=vib[0],
        vibrato_cents=vib[1],
        **env,
    )


def compose(rng: np.random.Generator, seconds: float) -> Score:
    """Draw the music of one clip (note events and instruments); no audio yet."""
    tempo = rng.uniform(70.0, 160.0)
    beats_per_bar = 3 if rng.random() < 0.2 else 4
    bar_steps = beats_per_bar * STEPS_PER_BEAT
    step_s = 60.0 / tempo / STEPS_PER_BEAT
    bar_s = bar_steps * step_s
    key = int(rng.integers(0, 12))
    mode = str(rng.choice(list(MODES), p=[0.35, 0.1, 0.3, 0.15, 0.1]))
    scale_name = _melody_scale(rng, mode)
    scale = SCALES[scale_name]
    progs = PROGRESSIONS_MAJOR if mode in MAJOR_LIKE else PROGRESSIONS_MINOR
    progression = progs[rng.integers(len(progs))]
    bars_per_chord = 2 if (tempo > 115 and rng.random() < 0.5) else 1
    swing = float(rng.choice([0.0, rng.uniform(0.15, 0.35)], p=[0.75, 0.25]))
    sevenths = rng.random() < 0.35
    n_bars = int(math.ceil(seconds / bar_s)) + 1
    cycle_bars = len(progression) * bars_per_chord

    def chord_at(bar: int) -> int:
        return progression[(bar // bars_per_chord) % len(progression)]

    def times(bar, step) -> np.ndarray:
        """Onset time of (bar, step) grid points, with swing on off-beat 8ths."""
        bar, step = np.asarray(bar, dtype=np.float64), np.asarray(step, dtype=np.float64)
        off8 = (np.mod(step, STEPS_PER_BEAT) == 2).astype(np.float64)
        return (bar * bar_steps + step + swing * off8) * step_s

    def humanise(t: np.ndarray, sd: float = 0.004) -> np.ndarray:
        return np.maximum(t + rng.normal(0.0, sd, t.shape), 0.0)

    score = Score(
        seconds=seconds, tempo=tempo, beats_per_bar=beats_per_bar, key=key, mode=mode, scale=scale_name,
        progression=tuple(int(d) for d in progression), bars_per_chord=bars_per_chord, swing=swing,
        stereo=bool(rng.random() < 0.35), reverb_seconds=rng.uniform(0.3, 1.5),
        reverb_wet=float(rng.choice([0.0, rng.uniform(0.05, 0.3)], p=[0.3, 0.7])),
        level=0.9 * 10.0 ** (rng.uniform(-12.0, 0.0) / 20.0),
    )
    chords = [_chord_pcs(key, mode, chord_at(b), sevenths) for b in range(n_bars)]

    # ---- lead melody: motifs in a form, transposed to each chord ----------------------------
    centre = int(rng.integers(64, 77))
    lo, hi = centre - 8, centre + 10
    melody_notes = np.array([m for m in range(36, 109) if (m - key) % 12 in scale])
    density = rng.uniform(0.0, 1.0)
    dur_choices = np.array([1, 2, 3, 4, 6, 8])
    dur_w = np.array([0.3 * density, 1.0, 0.4, 1.0 - 0.5 * density, 0.4 * (1 - density), 0.5 * (1 - density)]) + 0.02
    if tempo > 130:  # no 16th runs at fast tempi
        dur_w[0] *= 0.2
    motif_bars = int(rng.choice([1, 2]))
    p_rest = rng.uniform(0.05, 0.25)

    def motif() -> list[tuple[int, int, bool, int]]:
        """(step, duration, rest, degree offset) covering motif_bars bars."""
        notes, pos, deg = [], 0, 0
        total = motif_bars * bar_steps
        while pos < total:
            ok = dur_choices <= total - pos
            d = int(rng.choice(dur_choices[ok], p=dur_w[ok] / dur_w[ok].sum()))
            deg = int(np.clip(deg + rng.choice([-3, -2, -1, 0, 1, 2, 3, 4]), -4, 7))
            notes.append((pos, d, bool(pos > 0 and rng.random() < p_rest), deg))
            pos += d
        return notes

    motifs = {label: motif() for label in "ABC"}
    form = FORMS[rng.integers(len(FORMS))]
    legato = rng.uniform(0.55, 1.0)
    on, gate, pitch, vel = [], [], [], []
    for unit_start in range(0, n_bars, motif_bars):
        label = form[(unit_start // motif_bars) % len(form)]
        if unit_start >= cycle_bars and rng.random() < 0.12:  # a silent unit now and then
            continue
        for step, d, rest, deg in motifs[label]:
            if rest:
                continue
            bar = unit_start + step // bar_steps
            s = step % bar_steps
            root_pc = chords[min(bar, n_bars - 1)][0]
            anchor = centre - 6 + (root_pc - (centre - 6)) % 12
            idx = int(np.searchsorted(melody_notes, anchor)) + deg
            if rng.random() < 0.08:  # variation on repeats
                idx += int(rng.choice([-1, 1]))
            m = float(melody_notes[np.clip(idx, 0, len(melody_notes) - 1)])
            tones = np.array(chords[min(bar, n_bars - 1)])
            if s % STEPS_PER_BEAT == 0 and ((m - tones) % 12).min() != 0 and rng.random() < 0.7:
                cands = np.concatenate([tones + 12 * o for o in range(3, 9)])
                m = float(cands[np.argmin(np.abs(cands - m))])
            while m > hi:
                m -= 12
            while m < lo:
                m += 12
            on.append(times(bar, s))
            gate.append(d * step_s * legato)
            pitch.append(m)
            accent = 0.15 if s % STEPS_PER_BEAT == 0 else 0.0
            vel.append(np.clip(rng.uniform(0.6, 0.85) + accent, 0.0, 1.0))
    score.tracks.append(
        Track("lead", humanise(np.array(on)), np.array(gate), np.array(pitch), np.array(vel),
              _timbre(rng, "lead"), gain=rng.uniform(0.7, 1.0), pan=rng.uniform(0.3, 0.7))
    )

    # ---- bass: one rhythm per clip on roots, fifths, octaves -------------------------------
    if rng.random() < 0.9:
        pattern = _bar_pattern(rng, bar_steps, busy=rng.uniform(0.2, 0.9))
        tones = [0] + [int(rng.choice([0, 0, 2, 3, 1])) for _ in pattern[1:]]  # root, root, fifth, octave, third
        ends = np.append(pattern[1:], bar_steps)
        b_legato = rng.uniform(0.5, 0.95)
        on, gate, pitch = [], [], []
        for bar in range(n_bars):
            ch = chords[bar]
            root = 31 + (ch[0] - 31) % 12  # G1..F#2
            above = [0, (ch[1] - ch[0]) % 12, (ch[2] - ch[0]) % 12, 12]  # the chord's own third and fifth
            for s, e, tone in zip(pattern, ends, tones):
                on.append(times(bar, s))
                gate.append((e - s) * step_s * b_legato)
                pitch.append(root + above[tone])
        n = len(on)
        score.tracks.append(
            Track("bass", humanise(np.array(on), 0.003), np.array(gate), np.array(pitch, dtype=np.float64),
                  np.clip(rng.uniform(0.7, 0.95, n), 0, 1), _timbre(rng, "bass"),
                  gain=rng.uniform(0.5, 1.0), pan=0.5)
        )

    # ---- chords: pads, strums or arpeggios -------------------------------------------------
    styles = [str(rng.choice(["pad", "strum", "arp"], p=[0.4, 0.35, 0.25]))]
    if rng.random() < 0.25:
        styles.append("pad" if styles[0] != "pad" else "arp")
    chord_centre = int(rng.integers(55, 66))
    for style in styles:
        on, gate, pitch, vel = [], [], [], []
        if style == "pad":
            for bar in range(0, n_bars, bars_per_chord):
                for m in _voicing(chords[bar], chord_centre):
                    on.append(times(bar, 0))
                    gate.append(bars_per_chord * bar_s * 0.97)
                    pitch.append(m)
                    vel.append(rng.uniform(0.5, 0.7))
            role = "pad"
        elif style == "strum":
            pattern = _bar_pattern(rng, bar_steps, busy=rng.uniform(0.3, 1.0))
            ends = np.append(pattern[1:], bar_steps)
            spread = rng.uniform(0.006, 0.025)
            for bar in range(n_bars):
                voices = _voicing(chords[bar], chord_centre)
                for i, (s, e) in enumerate(zip(pattern, ends)):
                    order = voices if i % 2 == 0 else voices[::-1]  # down and up strokes
                    for j, m in enumerate(order):
                        on.append(times(bar, s) + j * spread)
                        gate.append((e - s) * step_s * 0.9)
                        pitch.append(m)
                        vel.append(rng.uniform(0.45, 0.65) * (1.0 if s % STEPS_PER_BEAT == 0 else 0.8))
            role = "pluck"
        else:  # arpeggio
            every = 2 if tempo > 90 or rng.random() < 0.5 else 1
            shape = str(rng.choice(["up", "updown", "fixed"]))
            fixed = rng.permutation(5)
            hold = rng.uniform(1.0, 3.0)
            for bar in range(n_bars):
                voices = _voicing(chords[bar], chord_centre)
                voices = np.append(voices, voices[0] + 12)
                nv = len(voices)
                for k, s in enumerate(range(0, bar_steps, every)):
                    if shape == "up":
                        j = k % nv
                    elif shape == "updown":
                        j = (list(range(nv)) + list(range(nv - 2, 0, -1)))[k % (2 * nv - 2)]
                    else:
                        j = fixed[k % 5] % nv
                    on.append(times(bar, s))
                    gate.append(every * step_s * hold)
                    pitch.append(voices[j])
                    vel.append(rng.uniform(0.45, 0.6) + (0.15 if s % STEPS_PER_BEAT == 0 else 0.0))
            role = "pluck"
        score.tracks.append(
            Track(style, humanise(np.array(on), 0.003), np.array(gate), np.array(pitch), np.array(vel),
                  _timbre(rng, role), gain=rng.uniform(0.3, 0.7), pan=rng.uniform(0.15, 0.85))
        )

    # ---- drums: a per-clip pattern, a fill at the end of each cycle -------------------------
    if rng.random() < 0.85:
        if beats_per_bar == 4:
            kick = [[0, 8], [0, 6, 8], [0, 10], [0, 4, 8, 12], [0, 3, 8, 11], [0, 7, 10]][rng.integers(6)]
            snare = [[4, 12], [4, 12], [8], [4, 12, 15]][rng.integers(4)]
        else:
            kick = [[0], [0, 6], [0, 8]][rng.integers(3)]
            snare = [[4, 8], [8], [6]][rng.integers(3)]
        hat_every = int(rng.choice([1, 2, 2, 4]))
        hat = list(range(0, bar_steps, hat_every))
        if rng.random() < 0.2:  # off-beat open hats
            hat = list(range(2, bar_steps, 4))
        fills = rng.random() < 0.6
        enter = int(rng.choice([0, 0, 0, 1, 2]))  # drums may come in after a bar or two
        hits: dict[str, tuple[list, list]] = {"kick": ([], []), "snare": ([], []), "hat": ([], [])}
        for bar in range(enter, n_bars):
            fill = fills and bar % cycle_bars == cycle_bars - 1
            for s in kick:
                hits["kick"][0].append(times(bar, s))
                hits["kick"][1].append(0.9 if s == 0 else 0.75)
            sn = list(snare)
            if fill:
                sn += list(range(bar_steps - STEPS_PER_BEAT, bar_steps))
            for s in sorted(set(sn)):
                hits["snare"][0].append(times(bar, s))
                hits["snare"][1].append(0.85 if s in snare else 0.55)
            for s in hat:
                hits["hat"][0].append(times(bar, s))
                hits["hat"][1].append(0.7 if s % STEPS_PER_BEAT == 0 else 0.45)
        u = rng.uniform
        params = {
            "kick": dict(f_start=u(100.0, 200.0), f_end=u(40.0, 65.0), sweep_tau=u(0.015, 0.05),
                         decay=u(0.12, 0.35), click=u(0.0, 0.3)),
            "snare": dict(tone_hz=u(160.0, 260.0), tone_decay=u(0.03, 0.08), noise_hz=u(1500.0, 5000.0),
                          noise_q=u(0.6, 1.5), noise_decay=u(0.06, 0.2), tone_mix=u(0.2, 0.6)),
            "hat": dict(noise_hz=u(7000.0, 11000.0), noise_q=u(0.8, 2.0),
                        decay=u(0.15, 0.35) if hat_every == 4 or hat[0] == 2 else u(0.02, 0.06)),
        }
        gains = {"kick": u(0.6, 1.0), "snare": u(0.4, 0.8), "hat": u(0.15, 0.4)}
        pans = {"kick": 0.5, "snare": u(0.4, 0.6), "hat": u(0.25, 0.75)}
        for name, (t, v) in hits.items():
            if not t:
                continue
            v = np.clip(np.array(v) * rng.uniform(0.85, 1.1, len(v)), 0.0, 1.0)
            score.drums.append(DrumTrack(name, humanise(np.array(t, dtype=np.float64), 0.002), v,
                                         params[name], gains[name], pans[name]))
    return score


# --------------------------------------------------------------------------------------------
# Render: the score as audio at a sample rate
# --------------------------------------------------------------------------------------------


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


def generate_clip(rng: np.random.Generator, seconds: float, sample_rate: int) -> np.ndarray:
    """One clip of procedural music, shaped (samples, channels) float32 in [-0.9, 0.9]."""
    return render(compose(rng, seconds), rng, sample_rate)


def clip_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of clip `index`: a function of (seed, index) alone."""
    return np.random.default_rng(np.random.SeedSequence([seed, index]))


def generate_corpus(out_dir: str | Path, n_clips: int, clip_seconds: float, sample_rate: int, seed: int) -> list[Path]:
    """Write `synth_00000.flac` ... (PCM_16) into out_dir; clip i depends only on (seed, i)."""
    import soundfile as sf

    from acoustic_mlm.utils import Progress

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with Progress(n_clips, "synth", unit="clip") as bar:
        for i in range(n_clips):
            audio = generate_clip(clip_rng(seed, i), clip_seconds, sample_rate)
            path = out_dir / f"synth_{i:05d}.flac"
            sf.write(path, audio, sample_rate, format="FLAC", subtype="PCM_16")
            paths.append(path)
            bar.update(1)
    return paths
