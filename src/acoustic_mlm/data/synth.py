"""Procedural music: a deterministic, numpy-only generator of short multi-instrument clips.

The offline stand-in for a music corpus. Each clip is composed, then rendered:

- `compose(rng, seconds)` draws a `Score` (synth_score): tempo (70-160 BPM), metre (4/4 or 3/4),
  key, mode, melody scale (the mode, its pentatonic or blues subset), a 4-chord progression, and
  note events for a lead melody (a 1-2 bar motif repeated in a form such as AABA, transposed to
  each chord, snapped to chord tones on beats), a bass line (one rhythm pattern per clip on
  chord roots, fifths and octaves), a chord layer (pads, strums or arpeggios) and drums
  (kick, snare, hi-hat on a per-clip pattern with fills). Each instrument gets a random timbre:
  a harmonic amplitude profile, a brightness that decays, detune, vibrato and an ADSR envelope.
  It draws the frame first, then one voice at a time, in that order (`_frame`, `_lead`, `_bass`,
  `_chord_layer`, `_drums`).
- `render(score, rng, sample_rate)` (synth_render) turns it into audio: band-limited wavetable
  oscillators, drums from sine sweeps and shaped noise, pan (some clips are stereo), a
  noise-tail reverb and peak normalisation to 0.9 x a random gain.

`generate_clip` does both with one generator, `clip_rng(seed, index)`; `generate_corpus` writes
the clips as FLAC files. The structure (bars, repetition, harmony) is what makes the tokens
learnable; the randomness of timbre and mix is what makes them varied. Same seed, same clip, on
any machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from acoustic_mlm.data.synth_render import render
from acoustic_mlm.data.synth_score import DrumTrack, Score, Timbre, Track

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


# --------------------------------------------------------------------------------------------
# Compose: the frame, then each voice, all drawn from one generator in this order
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Grid:
    """The rhythmic grid and the harmony of a clip, which every voice plays to."""

    tempo: float  # BPM
    beats_per_bar: int
    bar_steps: int  # 16ths per bar
    step_s: float  # s per 16th
    swing: float  # delay of off-beat 8ths, as a fraction of a 16th
    n_bars: int  # bars drawn: enough to cover the clip, and one more
    bars_per_chord: int
    cycle_bars: int  # bars of one pass through the progression
    key: int  # tonic pitch class
    scale: tuple[int, ...]  # the melody's scale, semitones above the tonic
    chords: list[list[int]]  # the chord of each bar: pitch classes, root first

    @classmethod
    def of(cls, score: Score, bar_steps: int, step_s: float, n_bars: int, chords: list[list[int]]) -> _Grid:
        """The grid of `score`: its tempo, metre, swing, key and scale, with the steps and chords drawn."""
        return cls(
            tempo=score.tempo,
            beats_per_bar=score.beats_per_bar,
            bar_steps=bar_steps,
            step_s=step_s,
            swing=score.swing,
            n_bars=n_bars,
            bars_per_chord=score.bars_per_chord,
            cycle_bars=len(score.progression) * score.bars_per_chord,
            key=score.key,
            scale=SCALES[score.scale],
            chords=chords,
        )

    @property
    def bar_s(self) -> float:
        return self.bar_steps * self.step_s

    def times(self, bar, step) -> np.ndarray:
        """Onset time of (bar, step) grid points, with swing on off-beat 8ths."""
        bar, step = np.asarray(bar, dtype=np.float64), np.asarray(step, dtype=np.float64)
        off8 = (np.mod(step, STEPS_PER_BEAT) == 2).astype(np.float64)
        return (bar * self.bar_steps + step + self.swing * off8) * self.step_s


def compose(rng: np.random.Generator, seconds: float) -> Score:
    """Draw the music of one clip (note events and instruments); no audio yet.

    The frame first, then the voices in the order they are added to the score: every random draw
    comes from `rng` in a fixed order, so a seed gives one score.
    """
    score, grid = _frame(rng, seconds)
    score.tracks.append(_lead(rng, grid))
    score.tracks += _bass(rng, grid)
    score.tracks += _chord_layer(rng, grid)
    score.drums += _drums(rng, grid)
    return score


def _frame(rng: np.random.Generator, seconds: float) -> tuple[Score, _Grid]:
    """Tempo, metre, key, mode, melody scale, progression, swing and the mix: an empty score and its grid."""
    tempo = rng.uniform(70.0, 160.0)
    beats_per_bar = 3 if rng.random() < 0.2 else 4
    bar_steps = beats_per_bar * STEPS_PER_BEAT
    step_s = 60.0 / tempo / STEPS_PER_BEAT
    key = int(rng.integers(0, 12))
    mode = str(rng.choice(list(MODES), p=[0.35, 0.1, 0.3, 0.15, 0.1]))
    scale_name = _melody_scale(rng, mode)
    progs = PROGRESSIONS_MAJOR if mode in MAJOR_LIKE else PROGRESSIONS_MINOR
    progression = progs[rng.integers(len(progs))]
    bars_per_chord = 2 if (tempo > 115 and rng.random() < 0.5) else 1
    swing = float(rng.choice([0.0, rng.uniform(0.15, 0.35)], p=[0.75, 0.25]))
    sevenths = rng.random() < 0.35
    n_bars = int(math.ceil(seconds / (bar_steps * step_s))) + 1
    score = Score(
        seconds=seconds,
        tempo=tempo,
        beats_per_bar=beats_per_bar,
        key=key,
        mode=mode,
        scale=scale_name,
        progression=tuple(int(d) for d in progression),
        bars_per_chord=bars_per_chord,
        swing=swing,
        stereo=bool(rng.random() < 0.35),
        reverb_seconds=rng.uniform(0.3, 1.5),
        reverb_wet=float(rng.choice([0.0, rng.uniform(0.05, 0.3)], p=[0.3, 0.7])),
        level=0.9 * 10.0 ** (rng.uniform(-12.0, 0.0) / 20.0),
    )
    degrees = [progression[(bar // bars_per_chord) % len(progression)] for bar in range(n_bars)]
    grid = _Grid.of(score, bar_steps, step_s, n_bars, [_chord_pcs(key, mode, d, sevenths) for d in degrees])
    return score, grid


def _humanise(rng: np.random.Generator, t: np.ndarray, sd: float = 0.004) -> np.ndarray:
    """Onsets off the grid by a few ms, as a player's would be."""
    return np.maximum(t + rng.normal(0.0, sd, t.shape), 0.0)


# ---- lead melody: motifs in a form, transposed to each chord --------------------------------

NOTE_STEPS = np.array([1, 2, 3, 4, 6, 8])  # the lengths of a motif's notes, in 16ths


def _lead(rng: np.random.Generator, g: _Grid) -> Track:
    """1-2 bar motifs (A, B, C) in a form such as AABA, each note placed from its bar's chord root."""
    centre = int(rng.integers(64, 77))
    notes = np.array([m for m in range(36, 109) if (m - g.key) % 12 in g.scale])
    weights = _note_weights(rng.uniform(0.0, 1.0), g.tempo)
    motif_bars = int(rng.choice([1, 2]))
    p_rest = rng.uniform(0.05, 0.25)
    motifs = {label: _motif(rng, motif_bars * g.bar_steps, weights, p_rest) for label in "ABC"}
    form = FORMS[rng.integers(len(FORMS))]
    legato = rng.uniform(0.55, 1.0)
    on, gate, pitch, vel = [], [], [], []
    for unit_start in range(0, g.n_bars, motif_bars):
        label = form[(unit_start // motif_bars) % len(form)]
        if unit_start >= g.cycle_bars and rng.random() < 0.12:  # a silent unit now and then
            continue
        for step, d, rest, deg in motifs[label]:
            if rest:
                continue
            bar = unit_start + step // g.bar_steps
            s = step % g.bar_steps
            m = _lead_pitch(rng, g.chords[min(bar, g.n_bars - 1)], notes, centre, deg, s % STEPS_PER_BEAT == 0)
            on.append(g.times(bar, s))
            gate.append(d * g.step_s * legato)
            pitch.append(m)
            accent = 0.15 if s % STEPS_PER_BEAT == 0 else 0.0
            vel.append(np.clip(rng.uniform(0.6, 0.85) + accent, 0.0, 1.0))
    return Track(
        "lead",
        _humanise(rng, np.array(on)),
        np.array(gate),
        np.array(pitch),
        np.array(vel),
        _timbre(rng, "lead"),
        gain=rng.uniform(0.7, 1.0),
        pan=rng.uniform(0.3, 0.7),
    )


def _note_weights(density: float, tempo: float) -> np.ndarray:
    """Weights of NOTE_STEPS: a dense melody favours short notes."""
    w = np.array([0.3 * density, 1.0, 0.4, 1.0 - 0.5 * density, 0.4 * (1 - density), 0.5 * (1 - density)]) + 0.02
    if tempo > 130:  # no 16th runs at fast tempi
        w[0] *= 0.2
    return w


def _motif(
    rng: np.random.Generator, total: int, weights: np.ndarray, p_rest: float
) -> list[tuple[int, int, bool, int]]:
    """(step, duration, rest, degree offset) covering `total` steps: a bounded walk over the scale."""
    notes, pos, deg = [], 0, 0
    while pos < total:
        ok = NOTE_STEPS <= total - pos
        d = int(rng.choice(NOTE_STEPS[ok], p=weights[ok] / weights[ok].sum()))
        deg = int(np.clip(deg + rng.choice([-3, -2, -1, 0, 1, 2, 3, 4]), -4, 7))
        notes.append((pos, d, bool(pos > 0 and rng.random() < p_rest), deg))
        pos += d
    return notes


def _lead_pitch(
    rng: np.random.Generator, chord: list[int], notes: np.ndarray, centre: int, deg: int, on_beat: bool
) -> float:
    """`deg` scale notes above the chord's root (the one in the octave around `centre`), now and then
    one off; on a beat most often moved to the nearest chord tone; folded into centre - 8 .. centre + 10."""
    anchor = centre - 6 + (chord[0] - (centre - 6)) % 12
    idx = int(np.searchsorted(notes, anchor)) + deg
    if rng.random() < 0.08:  # variation on repeats
        idx += int(rng.choice([-1, 1]))
    m = float(notes[np.clip(idx, 0, len(notes) - 1)])
    tones = np.array(chord)
    if on_beat and ((m - tones) % 12).min() != 0 and rng.random() < 0.7:
        cands = np.concatenate([tones + 12 * o for o in range(3, 9)])
        m = float(cands[np.argmin(np.abs(cands - m))])
    while m > centre + 10:
        m -= 12
    while m < centre - 8:
        m += 12
    return m


# ---- bass: one rhythm per clip on roots, fifths, octaves ------------------------------------


def _bass(rng: np.random.Generator, g: _Grid) -> list[Track]:
    """The bass line (in 9 clips of 10): one rhythm per clip on each bar's root, fifth, octave or third."""
    if rng.random() >= 0.9:
        return []
    pattern = _bar_pattern(rng, g.bar_steps, busy=rng.uniform(0.2, 0.9))
    tones = [0] + [int(rng.choice([0, 0, 2, 3, 1])) for _ in pattern[1:]]  # root, root, fifth, octave, third
    ends = np.append(pattern[1:], g.bar_steps)
    legato = rng.uniform(0.5, 0.95)
    on, gate, pitch = [], [], []
    for bar in range(g.n_bars):
        ch = g.chords[bar]
        root = 31 + (ch[0] - 31) % 12  # G1..F#2
        above = [0, (ch[1] - ch[0]) % 12, (ch[2] - ch[0]) % 12, 12]  # the chord's own third and fifth
        for s, e, tone in zip(pattern, ends, tones):
            on.append(g.times(bar, s))
            gate.append((e - s) * g.step_s * legato)
            pitch.append(root + above[tone])
    return [
        Track(
            "bass",
            _humanise(rng, np.array(on), 0.003),
            np.array(gate),
            np.array(pitch, dtype=np.float64),
            np.clip(rng.uniform(0.7, 0.95, len(on)), 0, 1),
            _timbre(rng, "bass"),
            gain=rng.uniform(0.5, 1.0),
            pan=0.5,
        )
    ]


# ---- chords: pads, strums or arpeggios ------------------------------------------------------


def _chord_layer(rng: np.random.Generator, g: _Grid) -> list[Track]:
    """One chord style (pad, strum or arpeggio), now and then a pad or arpeggio beside it."""
    styles = [str(rng.choice(["pad", "strum", "arp"], p=[0.4, 0.35, 0.25]))]
    if rng.random() < 0.25:
        styles.append("pad" if styles[0] != "pad" else "arp")
    centre = int(rng.integers(55, 66))
    tracks = []
    for style in styles:
        play, role = {"pad": (_pad, "pad"), "strum": (_strum, "pluck"), "arp": (_arpeggio, "pluck")}[style]
        on, gate, pitch, vel = play(rng, g, centre)
        tracks.append(
            Track(
                style,
                _humanise(rng, np.array(on), 0.003),
                np.array(gate),
                np.array(pitch),
                np.array(vel),
                _timbre(rng, role),
                gain=rng.uniform(0.3, 0.7),
                pan=rng.uniform(0.15, 0.85),
            )
        )
    return tracks


def _pad(rng: np.random.Generator, g: _Grid, centre: int) -> tuple[list, list, list, list]:
    """(onsets, gates, pitches, velocities): each chord held for as long as it lasts."""
    on, gate, pitch, vel = [], [], [], []
    for bar in range(0, g.n_bars, g.bars_per_chord):
        for m in _voicing(g.chords[bar], centre):
            on.append(g.times(bar, 0))
            gate.append(g.bars_per_chord * g.bar_s * 0.97)
            pitch.append(m)
            vel.append(rng.uniform(0.5, 0.7))
    return on, gate, pitch, vel


def _strum(rng: np.random.Generator, g: _Grid, centre: int) -> tuple[list, list, list, list]:
    """(onsets, gates, pitches, velocities): the chord strummed on one rhythm per clip, down and up."""
    pattern = _bar_pattern(rng, g.bar_steps, busy=rng.uniform(0.3, 1.0))
    ends = np.append(pattern[1:], g.bar_steps)
    spread = rng.uniform(0.006, 0.025)
    on, gate, pitch, vel = [], [], [], []
    for bar in range(g.n_bars):
        voices = _voicing(g.chords[bar], centre)
        for i, (s, e) in enumerate(zip(pattern, ends)):
            order = voices if i % 2 == 0 else voices[::-1]  # down and up strokes
            for j, m in enumerate(order):
                on.append(g.times(bar, s) + j * spread)
                gate.append((e - s) * g.step_s * 0.9)
                pitch.append(m)
                vel.append(rng.uniform(0.45, 0.65) * (1.0 if s % STEPS_PER_BEAT == 0 else 0.8))
    return on, gate, pitch, vel


def _arpeggio(rng: np.random.Generator, g: _Grid, centre: int) -> tuple[list, list, list, list]:
    """(onsets, gates, pitches, velocities): the chord and its octave one note at a time, up, up and
    down, or in a fixed order."""
    every = 2 if g.tempo > 90 or rng.random() < 0.5 else 1
    shape = str(rng.choice(["up", "updown", "fixed"]))
    fixed = rng.permutation(5)
    hold = rng.uniform(1.0, 3.0)
    on, gate, pitch, vel = [], [], [], []
    for bar in range(g.n_bars):
        voices = _voicing(g.chords[bar], centre)
        voices = np.append(voices, voices[0] + 12)
        nv = len(voices)
        for k, s in enumerate(range(0, g.bar_steps, every)):
            if shape == "up":
                j = k % nv
            elif shape == "updown":
                j = (list(range(nv)) + list(range(nv - 2, 0, -1)))[k % (2 * nv - 2)]
            else:
                j = fixed[k % 5] % nv
            on.append(g.times(bar, s))
            gate.append(every * g.step_s * hold)
            pitch.append(voices[j])
            vel.append(rng.uniform(0.45, 0.6) + (0.15 if s % STEPS_PER_BEAT == 0 else 0.0))
    return on, gate, pitch, vel


# ---- drums: a per-clip pattern, a fill at the end of each cycle -----------------------------


def _drums(rng: np.random.Generator, g: _Grid) -> list[DrumTrack]:
    """Kick, snare and hi-hat (in 85 clips of 100), each with its own sound, gain and pan."""
    if rng.random() >= 0.85:
        return []
    kick, snare, hat, hat_every = _drum_pattern(rng, g)
    fills = rng.random() < 0.6
    enter = int(rng.choice([0, 0, 0, 1, 2]))  # drums may come in after a bar or two
    hits = _drum_hits(g, kick, snare, hat, fills, enter)
    params, gains, pans = _drum_kit(rng, long_hat=hat_every == 4 or hat[0] == 2)
    tracks = []
    for name, (t, v) in hits.items():
        if not t:
            continue
        v = np.clip(np.array(v) * rng.uniform(0.85, 1.1, len(v)), 0.0, 1.0)
        tracks.append(
            DrumTrack(
                name, _humanise(rng, np.array(t, dtype=np.float64), 0.002), v, params[name], gains[name], pans[name]
            )
        )
    return tracks


def _drum_pattern(rng: np.random.Generator, g: _Grid) -> tuple[list[int], list[int], list[int], int]:
    """(kick steps, snare steps, hat steps, hat spacing) of one bar."""
    if g.beats_per_bar == 4:
        kick = [[0, 8], [0, 6, 8], [0, 10], [0, 4, 8, 12], [0, 3, 8, 11], [0, 7, 10]][rng.integers(6)]
        snare = [[4, 12], [4, 12], [8], [4, 12, 15]][rng.integers(4)]
    else:
        kick = [[0], [0, 6], [0, 8]][rng.integers(3)]
        snare = [[4, 8], [8], [6]][rng.integers(3)]
    hat_every = int(rng.choice([1, 2, 2, 4]))
    hat = list(range(0, g.bar_steps, hat_every))
    if rng.random() < 0.2:  # off-beat open hats
        hat = list(range(2, g.bar_steps, 4))
    return kick, snare, hat, hat_every


def _drum_hits(
    g: _Grid, kick: list[int], snare: list[int], hat: list[int], fills: bool, enter: int
) -> dict[str, tuple[list, list]]:
    """Onsets and velocities of each drum from bar `enter` on; with `fills`, a snare run ends each cycle."""
    hits: dict[str, tuple[list, list]] = {"kick": ([], []), "snare": ([], []), "hat": ([], [])}
    for bar in range(enter, g.n_bars):
        fill = fills and bar % g.cycle_bars == g.cycle_bars - 1
        for s in kick:
            hits["kick"][0].append(g.times(bar, s))
            hits["kick"][1].append(0.9 if s == 0 else 0.75)
        sn = list(snare)
        if fill:
            sn += list(range(g.bar_steps - STEPS_PER_BEAT, g.bar_steps))
        for s in sorted(set(sn)):
            hits["snare"][0].append(g.times(bar, s))
            hits["snare"][1].append(0.85 if s in snare else 0.55)
        for s in hat:
            hits["hat"][0].append(g.times(bar, s))
            hits["hat"][1].append(0.7 if s % STEPS_PER_BEAT == 0 else 0.45)
    return hits


# Each drum voice's parameters, drawn uniformly from [low, high) in this order: the order of the draws
# is part of the corpus (another order gives other clips). The hat's decay comes last, from _HAT_DECAY
# by whether the clip's hats ring open.
_DRUM_RANGES = (
    ("kick", "f_start", 100.0, 200.0),
    ("kick", "f_end", 40.0, 65.0),
    ("kick", "sweep_tau", 0.015, 0.05),
    ("kick", "decay", 0.12, 0.35),
    ("kick", "click", 0.0, 0.3),
    ("snare", "tone_hz", 160.0, 260.0),
    ("snare", "tone_decay", 0.03, 0.08),
    ("snare", "noise_hz", 1500.0, 5000.0),
    ("snare", "noise_q", 0.6, 1.5),
    ("snare", "noise_decay", 0.06, 0.2),
    ("snare", "tone_mix", 0.2, 0.6),
    ("hat", "noise_hz", 7000.0, 11000.0),
    ("hat", "noise_q", 0.8, 2.0),
)
_HAT_DECAY = {True: (0.15, 0.35), False: (0.02, 0.06)}  # open hats ring longer


def _drum_kit(rng: np.random.Generator, long_hat: bool) -> tuple[dict, dict, dict]:
    """(voice parameters, gains, pans) of kick, snare and hat; `long_hat`: open hats ring longer."""
    u = rng.uniform
    params: dict[str, dict[str, float]] = {"kick": {}, "snare": {}, "hat": {}}
    for voice, name, low, high in _DRUM_RANGES:
        params[voice][name] = u(low, high)
    params["hat"]["decay"] = u(*_HAT_DECAY[long_hat])
    gains = {"kick": u(0.6, 1.0), "snare": u(0.4, 0.8), "hat": u(0.15, 0.4)}
    pans = {"kick": 0.5, "snare": u(0.4, 0.6), "hat": u(0.25, 0.75)}
    return params, gains, pans


# --------------------------------------------------------------------------------------------
# The corpus
# --------------------------------------------------------------------------------------------


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
