"""A clip's music as data: the `Score` that `synth.compose` draws and `synth_render.render` plays.

Times are in seconds and pitches in MIDI note numbers, so a score does not depend on the sample
rate it is rendered at.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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
    """One clip: its frame (tempo, metre, harmony), mix settings and the tracks that play."""

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
