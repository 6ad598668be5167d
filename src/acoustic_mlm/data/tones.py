"""The tone corpus (docs/stability.md, S1): clips of pure tones whose pitch is a code. One definition, read by
the fetch stage's `tones` source (`write_clips`: WAV files in data/raw/), by the tokenizer's oracle
(`tokenizer.mode: pitch`, acoustic_mlm.tokenizer.pitch: `FREQUENCIES`, `codes_of`) and by the rounds'
corpus written straight into the package's layout (acoustic_mlm.experiments.tone_corpus).

Each clip is a run of pure tones, one per EnCodec frame (HOP = 320 samples at 24 kHz): codebook 0's code c
in 0..CODES-1, held for a geometric run of mean RUN_FRAMES frames, sounds at BASE_HZ + STEP_HZ c Hz, its
phase restarting at each frame, at AMPLITUDE plus Gaussian noise of standard deviation NOISE, stored as
float32; codebook k's code is (c (2k + 1) + k) mod CODES. The clips are drawn in order from one generator
seeded by `seed` (`clips`), so the corpus is a function of (number of clips, frames per clip, seed), and a
clip depends on the clips drawn before it. The last clip is held out (`splits`). Clip names sort in the
order the clips are drawn (`clip_name`), so that prepare, which takes files in sorted order, lays them out
in that order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from acoustic_mlm import encodec
from acoustic_mlm.errors import UserError

HOP, RATE = encodec.HOP, encodec.SAMPLE_RATE
CODES = 16  # distinct codes per codebook
RUN_FRAMES = 12  # mean length of a run of one code, in frames
BASE_HZ, STEP_HZ = 150.0, 90.0  # code c sounds at BASE_HZ + STEP_HZ * c Hz
FREQUENCIES = BASE_HZ + STEP_HZ * np.arange(CODES)  # (CODES,) Hz: 150 ... 1500
AMPLITUDE, NOISE = 0.3, 0.01  # the tone's amplitude, the Gaussian noise's standard deviation
FORMAT = ("WAV", "FLOAT")  # soundfile's format and subtype of the fetched clips: float32, lossless


def codes_of(c0: np.ndarray, codebooks: int) -> np.ndarray:
    """(codebooks, frames) int16: codebook 0's codes `c0` and the deeper codebooks' fixed functions of them,
    (c0 (2k + 1) + k) mod CODES for codebook k."""
    c0 = np.asarray(c0, dtype=np.int64)
    return np.stack([(c0 * (2 * k + 1) + k) % CODES for k in range(int(codebooks))]).astype(np.int16)


def clips(n_clips: int, frames: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The corpus, clip by clip: (audio, float32 (frames * HOP,); codebook 0's codes, int64 (frames,)).

    One generator for the whole corpus, drawn in this order per clip: the run lengths, the runs' codes,
    the noise. The order is the corpus: another order gives other clips."""
    rng = np.random.default_rng(seed)
    t = np.arange(HOP) / RATE
    for _ in range(int(n_clips)):
        runs = rng.geometric(1 / RUN_FRAMES, size=frames)  # run lengths, more than enough
        c0 = np.repeat(rng.integers(0, CODES, size=frames), runs)[:frames]
        tone = np.sin(2 * np.pi * (BASE_HZ + STEP_HZ * c0[:, None]) * t[None, :])  # (frames, HOP): pitch = code
        audio = (AMPLITUDE * tone + NOISE * rng.standard_normal(tone.shape)).reshape(-1).astype(np.float32)
        yield audio, c0


def clip_name(i: int, n_clips: int) -> str:
    """Clip i's name (its file's stem, its clip id): tone0 ... tone9 for up to 10 clips, tone00 ... for up
    to 100, so that the names sort in the order the clips are drawn."""
    return f"tone{i:0{len(str(max(int(n_clips) - 1, 0)))}d}"


def frames_in(seconds: float) -> int:
    """The whole EnCodec frames in `seconds`; one line naming the key when it is not a whole number of them."""
    frames = round(float(seconds) * RATE / HOP)
    if frames < 1 or abs(frames * HOP - float(seconds) * RATE) > 1e-6:
        raise UserError(
            f"data.synthetic.clip_seconds: {seconds} s is not a whole number of EnCodec frames ({HOP} samples at "
            f"{RATE} Hz); the tone corpus holds one tone per frame"
        )
    return frames


def write_clips(out_dir: Path, n_clips: int, frames: int, seed: int) -> list[Path]:
    """The corpus as audio files out_dir/<clip_name>.wav (float32 WAV at RATE, mono: the samples exactly);
    returns their paths in the order the clips are drawn. The caller writes into a temporary folder
    (fetch: utils.atomic_dir)."""
    import soundfile as sf

    from acoustic_mlm.utils import Progress

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with Progress(n_clips, "tones", unit="clip") as bar:
        for i, (audio, _) in enumerate(clips(n_clips, frames, seed)):
            path = out_dir / f"{clip_name(i, n_clips)}.wav"
            sf.write(path, audio, RATE, format=FORMAT[0], subtype=FORMAT[1])
            paths.append(path)
            bar.update(1)
    return paths


def splits(clip_ids: list[str], n_clips: int) -> list[str]:
    """Each clip's split: the last clip drawn (`clip_name(n_clips - 1)`) valid, every other train; one line
    when it is not among `clip_ids` or no other clip is."""
    held_out = clip_name(int(n_clips) - 1, n_clips)
    split = ["valid" if c == held_out else "train" for c in clip_ids]
    if "valid" not in split or "train" not in split:
        raise UserError(
            f"prepare: the tone corpus holds out its last clip, {held_out}, and trains on the others; the prepared "
            f"clips are {', '.join(clip_ids[:4])}{' ...' if len(clip_ids) > 4 else ''} (data.synthetic.n_clips is "
            f"{n_clips}: rerun fetch)"
        )
    return split
