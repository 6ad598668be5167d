"""Loudness normalisation of the tokenizer's input (`tokenizer.loudness`, `tokenizer.loudness_target`).

The calibrated tokenizer sees each clip at a normalised loudness (kweighted, ITU-R BS.1770
K-weighted loudness per 107 ms window through pyloudnorm's meter; lufs, BS.1770 integrated loudness
per clip; rms, per 107 ms window; none), so that codebook 0 describes the music rather than how
loud it was recorded; silence stays silence, and the model still trains on the raw waveform (MERT:
`normalize: false`). Pretrained mode feeds EnCodec 24 kHz as released, which does not normalise
(encodec/model.py: `audio_normalize=False` for the 24 kHz model).

The meters (`rms_dbfs`, `loudness_lufs`, `window_loudness`), the gain of every EnCodec frame
(`frame_gains`), what a configuration normalises to (`loudness_of`; `loudness_record` describes a
method and target), and each clip's measurement for the stage's `loudness.csv` (`clip_loudness`).
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from acoustic_mlm import encodec
from acoustic_mlm.artifacts.codes import LOUDNESS_COLUMNS
from acoustic_mlm.artifacts.prepared import as_float, unstored
from acoustic_mlm.tokenizer.codec import TokenizerError

if TYPE_CHECKING:
    from acoustic_mlm.config import TokenizerConfig

LOUDNESS_METHODS = ("kweighted", "lufs", "rms", "none")
LUFS_GATE_DB = -70.0  # ITU-R BS.1770's absolute gate: a clip quieter than this is silence, left as is
# methods kweighted and rms: a window at or below this level (LUFS or dBFS RMS) is silence and keeps gain 1.
# 16-bit audio's quantization noise is -101 dBFS RMS; the floor sweep (-70 to -120) is in docs/tokenizer.md.
WINDOW_SILENCE_DB = -100.0
# methods kweighted and rms: one gain per 8 frames (107 ms); 75 (1 s) measured in docs/tokenizer.md
LOUDNESS_WINDOW_FRAMES = 8
LUFS_MIN_SAMPLES = int(0.4 * encodec.SAMPLE_RATE)  # BS.1770 measures in 400 ms blocks: a shorter clip is left as is


def rms_dbfs(x: np.ndarray) -> float:
    """Root-mean-square level in dB relative to full scale (a full-scale square wave: 0 dBFS); -inf for silence."""
    x = np.asarray(x, dtype=np.float64)
    ms = float(np.mean(x * x)) if len(x) else 0.0
    return 10 * math.log10(ms) if ms > 0 else -math.inf


def loudness_lufs(x: np.ndarray) -> float:
    """Integrated loudness (ITU-R BS.1770-4, gated; pyloudnorm) of a 24 kHz mono clip, in LUFS.

    -inf when every 400 ms block is below the absolute gate (silence); NaN for a clip under 400 ms.
    """
    import pyloudnorm

    if len(x) < LUFS_MIN_SAMPLES:
        return math.nan
    with warnings.catch_warnings(), np.errstate(divide="ignore"):
        warnings.simplefilter("ignore")  # pyloudnorm warns about possible clipping: we measure only
        return float(pyloudnorm.Meter(encodec.SAMPLE_RATE).integrated_loudness(np.asarray(x, dtype=np.float64)))


def window_loudness(clip: np.ndarray, window: int) -> np.ndarray:
    """BS.1770 loudness (K-weighted mean square, -0.691 dB; pyloudnorm's meter) of each window of
    `window` samples of a 24 kHz mono clip, in LUFS; -inf for a silent window.

    The K-weighting filter runs over the whole clip; the last, partial window is measured on its own
    samples. A 0 dBFS 1 kHz sine reads -3.01 LUFS (BS.1770-4's calibration).
    """
    import pyloudnorm

    n_win = -(-len(clip) // window)
    padded = np.zeros(n_win * window, dtype=np.float64)
    padded[: len(clip)] = clip
    meter = pyloudnorm.Meter(encodec.SAMPLE_RATE, block_size=window / encodec.SAMPLE_RATE, overlap=0.0)
    with warnings.catch_warnings(), np.errstate(divide="ignore"):
        warnings.simplefilter("ignore")  # pyloudnorm warns about possible clipping: we measure only
        meter.integrated_loudness(padded)  # fills blockwise_loudness: one value per window, ungated
    loud = np.asarray(meter.blockwise_loudness, dtype=np.float64)[:n_win]
    tail = len(clip) - (n_win - 1) * window
    if tail < window:  # the zero padding diluted the last window's mean square
        loud[-1] += 10 * math.log10(window / tail)
    return loud


def frame_gains(clip: np.ndarray, method: str, target_db: float) -> np.ndarray:
    """The gain the tokenizer applies to each EnCodec frame of `clip` (float32, len(clip) // 320).

    lufs: one gain per clip, bringing its integrated loudness to `target_db` LUFS.
    rms: one gain per window of LOUDNESS_WINDOW_FRAMES frames, bringing its RMS to `target_db` dBFS.
    kweighted: one gain per window of LOUDNESS_WINDOW_FRAMES frames, bringing its BS.1770 loudness
    (K-weighted, `window_loudness`) to `target_db` LUFS.
    none: 1. Silence stays silence: a clip below LUFS_GATE_DB, a window at or below WINDOW_SILENCE_DB,
    or a clip that cannot be measured keeps gain 1 (and digital zeros stay zeros whatever the gain).
    """
    n = len(clip) // encodec.HOP
    gains = np.ones(n, dtype=np.float32)
    if method == "none" or n == 0:
        return gains
    if method == "lufs":
        lufs = loudness_lufs(clip)
        if math.isfinite(lufs) and lufs > LUFS_GATE_DB:
            gains[:] = 10 ** ((target_db - lufs) / 20)
        return gains
    body, window = clip[: n * encodec.HOP], LOUDNESS_WINDOW_FRAMES * encodec.HOP
    if method == "rms":
        return _window_gains(
            np.array([rms_dbfs(body[st : st + window]) for st in range(0, len(body), window)]), n, target_db
        )
    if method == "kweighted":
        return _window_gains(window_loudness(body, window), n, target_db)
    raise _unknown_method(method)


def _unknown_method(method: str) -> TokenizerError:
    return TokenizerError(f"config: 'tokenizer.loudness' must be one of {', '.join(LOUDNESS_METHODS)}, got {method!r}")


def _window_gains(window_db: np.ndarray, n: int, target_db: float) -> np.ndarray:
    """Per-frame gains (float32, n) from one level (dB) per window of LOUDNESS_WINDOW_FRAMES frames:
    each window brought to `target_db`; a window at or below WINDOW_SILENCE_DB keeps gain 1."""
    with np.errstate(over="ignore"):
        gains = np.where(window_db > WINDOW_SILENCE_DB, 10 ** ((target_db - window_db) / 20), 1.0)
    return np.repeat(gains, LOUDNESS_WINDOW_FRAMES)[:n].astype(np.float32)


def scaled_frames(audio: np.ndarray, gains: np.ndarray | None, first: int, end: int) -> np.ndarray:
    """Frames [first, end) of `audio` as float32, each multiplied by its gain (None: as is)."""
    x = as_float(audio[first * encodec.HOP : end * encodec.HOP])
    if gains is None:
        return x
    return x * np.repeat(gains[first:end], encodec.HOP)


def loudness_of(tc: TokenizerConfig) -> dict:
    """What the tokenizer's input is normalised to (recorded in fit.json and tokenizer.json), from the
    typed `tokenizer:` section (`Config.tokenizer`).

    Pretrained mode: EnCodec 24 kHz as released, which does not normalise its input
    (`audio_normalize=False` in encodec/model.py; only the 48 kHz model does): always none. Pitch mode (the
    tone corpus's oracle reads a frame's pitch, whatever its level): none too.
    """
    method = tc.loudness if tc.mode == "calibrated" else "none"
    return loudness_record(method, float(tc.loudness_target) if method != "none" else None)


def loudness_record(method: str, target: float | None = None) -> dict:
    """The description of a normalisation `loudness_of` returns, for `method` (one of LOUDNESS_METHODS)
    at `target` (None for method none): `loudness_record("none")` is what pretrained mode records."""
    if method not in LOUDNESS_METHODS:
        raise _unknown_method(method)
    window = f"window of {LOUDNESS_WINDOW_FRAMES} frames"
    unit = {"lufs": "LUFS", "kweighted": "LUFS", "rms": "dBFS RMS"}.get(method)
    return {
        "method": method,
        "target": target,
        "unit": unit,
        "per": {"lufs": "clip", "rms": window, "kweighted": window}.get(method),
        "silence_gate_db": {"lufs": LUFS_GATE_DB, "rms": WINDOW_SILENCE_DB, "kweighted": WINDOW_SILENCE_DB}.get(method),
        "applies_to": "the tokenizer's input only; the model trains on the raw waveform",
    }


def clip_loudness(audio: np.ndarray, clips, loudness: dict) -> tuple:
    """Each clip's level (RMS dBFS and BS.1770 LUFS, whatever the method) and the gain applied to it
    (the mean over its frames, in dB), and the per-frame gains for `encode_clips` (None for method
    none). `loudness`: what `loudness_of` returns."""
    method, target = loudness["method"], loudness["target"]
    stored = clips["gain"].to_numpy(np.float64) if "gain" in clips else np.ones(len(clips))  # storage gains
    # per-frame gains: loudness normalisation, and the division by a clip's storage gain (prepared.unstored)
    needed = method != "none" or bool((stored != 1.0).any())
    frame_gain = np.ones(len(audio) // encodec.HOP, dtype=np.float32) if needed else None
    rows = []
    offsets, lengths = clips["offset"].to_numpy(np.int64), clips["num_samples"].to_numpy(np.int64)
    for o, n, cid, g in zip(offsets, lengths, clips["clip_id"], stored):
        clip = unstored(as_float(audio[o : o + n]), g)
        gains = frame_gains(clip, method, target or 0.0)
        if frame_gain is not None:
            frame_gain[o // encodec.HOP : o // encodec.HOP + len(gains)] = gains / np.float32(g)
        rows.append(
            (
                cid,
                round(rms_dbfs(clip), 2),
                round(loudness_lufs(clip), 2),
                round(float(np.mean(20 * np.log10(gains))) if len(gains) else 0.0, 2),
            )
        )
    return pd.DataFrame(rows, columns=list(LOUDNESS_COLUMNS)), frame_gain
