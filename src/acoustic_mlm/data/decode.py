"""Decoding for the prepare stage: one audio file -> mono float32 at the corpus's sample rate in whole
EnCodec frames, or `Unusable` with the reason prepare writes to rejects.csv.

Files are decoded by content (libsndfile), whatever their name, in blocks mixed to mono; a header's
own frame count (`header_frames`) catches WAV, AIFF, AU and Wave64 files holding less than they
declare; resampling is torchaudio's (`_resample`: rates whose ratio would take minutes are taken as
the nearest multiple of 50 Hz). The thresholds below say what counts as unusable. A file is a path, or
its bytes in memory (an archive member read by archive.ZipMembers): both decode to the same samples.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

import numpy as np
import soundfile as sf

from acoustic_mlm import encodec
from acoustic_mlm.errors import one_line


class Unusable(Exception):
    """A file prepare cannot use; the message is the reason written to rejects.csv."""


def _mono_blocks(path: Path | bytes, block: int = 1 << 20) -> tuple[np.ndarray, int, int, int]:
    """Decode in blocks (memory follows what decodes, not what a header claims), mixed to mono.

    Returns (mono float32, sample rate, channels, frames the header declares).
    """
    parts = []
    src = io.BytesIO(path) if isinstance(path, bytes) else str(path)  # libsndfile's virtual I/O for bytes
    with sf.SoundFile(src) as f, np.errstate(invalid="ignore"):  # inf - inf: NaN, caught by the caller
        sr, channels, declared = int(f.samplerate), int(f.channels), int(f.frames)
        # f.read, not f.blocks: blocks() yields its whole buffer even when the decoder stops
        # early, so a truncated file would come back padded with uninitialised memory.
        while len(b := f.read(block, dtype="float32", always_2d=True)):
            parts.append(b.mean(axis=1, dtype=np.float32))
    mono = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return mono, sr, channels, declared


_W64_FMT = bytes.fromhex("666d7420f3acd3118cd100c04f8edb8a")  # Sony Wave64 chunk GUIDs ("fmt ", "data")
_W64_DATA = bytes.fromhex("64617461f3acd3118cd100c04f8edb8a")


def header_frames(path: Path | bytes) -> int:
    """The frames a WAV, AIFF, AU or Wave64 header declares (0: unknown or another format); `path` may be
    the file's bytes.

    libsndfile reports the frames a file holds, not what its header declares: a WAV whose header
    says 4 s but whose data stops at 1.24 s decodes as a clean 1.24 s clip. The header's own count
    tells the two apart, as MP3 and FLAC decoders do themselves.
    """
    import struct

    if isinstance(path, bytes):
        head = path[: 1 << 16]
    else:
        try:
            with open(path, "rb") as fh:
                head = fh.read(1 << 16)
        except OSError:
            return 0
    try:
        if head[:4] in (b"RIFF", b"RIFX") and head[8:12] == b"WAVE":
            end = "<" if head[:4] == b"RIFF" else ">"
            pos, align = 12, 0
            while pos + 8 <= len(head):
                cid, size = head[pos : pos + 4], struct.unpack_from(end + "I", head, pos + 4)[0]
                if cid == b"fmt ":
                    align = struct.unpack_from(end + "H", head, pos + 8 + 12)[0]
                elif cid == b"data":
                    return size // align if align and size not in (0, 0xFFFFFFFF) else 0
                pos += 8 + size + (size & 1)
        elif head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
            pos = 12
            while pos + 8 <= len(head):
                cid, size = head[pos : pos + 4], struct.unpack_from(">I", head, pos + 4)[0]
                if cid == b"COMM":
                    return struct.unpack_from(">I", head, pos + 10)[0]
                pos += 8 + size + (size & 1)
        elif head[:4] == b".snd":
            offset, size, _, _, channels = struct.unpack_from(">IIIII", head, 4)
            width = {1: 1, 2: 1, 3: 2, 4: 3, 5: 4, 6: 4, 7: 8, 27: 1}.get(struct.unpack_from(">I", head, 12)[0], 0)
            return size // (width * channels) if width and channels and size != 0xFFFFFFFF else 0
        elif head[:4] == b"riff" and head[24:32] == bytes.fromhex("77617665f3acd311"):
            pos, align = 40, 0
            while pos + 24 <= len(head):
                guid, size = head[pos : pos + 16], struct.unpack_from("<Q", head, pos + 16)[0]
                if guid == _W64_FMT:
                    align = struct.unpack_from("<H", head, pos + 24 + 12)[0]
                elif guid == _W64_DATA:
                    return (size - 24) // align if align and size > 24 else 0
                pos += (size + 7) // 8 * 8
    except struct.error:  # a header cut inside a chunk: libsndfile decides
        return 0
    return 0


def _resample(mono: np.ndarray, sr: int, sample_rate: int) -> np.ndarray:
    """torchaudio's windowed-sinc resampler.

    Its kernel grows with the reduced ratio (sr / gcd by target / gcd): 44101 -> 24000 Hz takes
    minutes and gigabytes. Such odd rates are resampled as if they were the nearest multiple of
    50 Hz, a pitch and tempo error of at most 25 Hz / sr (0.06% at 44.1 kHz).
    """
    if sr == sample_rate:
        return mono
    import torch
    import torchaudio.functional as AF

    g = math.gcd(sr, sample_rate)
    if (sr // g) * (sample_rate // g) > _MAX_RESAMPLE_RATIO_PRODUCT:
        sr = max(50, round(sr / 50) * 50)
    return AF.resample(torch.from_numpy(np.ascontiguousarray(mono)), sr, sample_rate).numpy()


_MAX_RESAMPLE_RATIO_PRODUCT = 4_000_000  # 5507 x 3000 (44056 Hz) resamples in ~1 s; 44101 x 24000 takes 2 min
TRUNCATION_TOLERANCE = 0.05  # reject when more than this share of the frames a header declares fails to decode
SILENCE_PEAK = 2.0**-15  # a peak at or below one 16-bit step is digital silence
# Integer formats decode to [-1, 1]; float formats may carry headroom above full scale, but a peak
# 60 dB over it is no recording at any sane gain: +-3e38 passed the finite check and made k-means
# and training non-finite. Such files are rejected, never rescaled (their content is unknown).
MAX_ABS_SAMPLE = 1000.0
# Plausible sample rates: 4 kHz (below telephone speech) to 384 kHz (the highest studio rate). A
# header declaring 1 Hz would otherwise be resampled into a clip 24,000 times longer.
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 4_000, 384_000


def decode(path: Path | bytes, sample_rate: int, min_samples: int) -> tuple[np.ndarray, int, int]:
    """One file (a path, or its bytes) -> (mono float32 at sample_rate in whole EnCodec frames, orig rate,
    orig channels).

    Raises Unusable(reason) for: an empty file, one soundfile cannot open or decode (not audio,
    corrupt, truncated FLAC), a sample rate outside MIN_SAMPLE_RATE..MAX_SAMPLE_RATE, a truncated
    or corrupt MP3 (decodes to fewer frames than its header declares), NaN or infinite samples,
    a peak beyond MAX_ABS_SAMPLE, digital silence, or fewer than `min_samples` samples (one
    training crop) once resampled and trimmed to whole frames.
    """
    try:
        size = len(path) if isinstance(path, bytes) else path.stat().st_size
    except OSError as exc:
        raise Unusable(f"cannot read: {one_line(exc)}") from None
    if size == 0:
        raise Unusable("empty file (0 bytes)")
    try:
        mono, sr, channels, declared = _mono_blocks(path)
    except Exception as exc:  # libsndfile: not audio, malformed, lost sync, ...
        raise Unusable(f"not decodable: {_libsndfile_reason(exc)}") from None
    if not MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE:
        raise Unusable(
            f"implausible sample rate: {sr} Hz, outside {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz "
            "(a damaged header or not audio)"
        )
    declared = max(declared, header_frames(path))  # WAV, AIFF, AU: libsndfile reports what is there
    if declared > 0 and len(mono) < (1 - TRUNCATION_TOLERANCE) * declared:
        raise Unusable(f"truncated or corrupt: decoded {len(mono)} of the {declared} frames its header declares")
    if len(mono) == 0:
        raise Unusable("no audio samples")
    if not np.isfinite(mono).all():
        raise Unusable("non-finite samples (NaN or infinity)")
    peak = float(np.abs(mono).max())
    if peak > MAX_ABS_SAMPLE:
        raise Unusable(
            f"samples out of range: peak {peak:.3g}, beyond +-{MAX_ABS_SAMPLE:g} "
            f"({20 * math.log10(MAX_ABS_SAMPLE):.0f} dB over full scale)"
        )
    if peak <= SILENCE_PEAK:
        raise Unusable(f"digital silence (peak {peak:.2g})")
    audio = _resample(mono, sr, sample_rate)
    n = len(audio) // encodec.HOP * encodec.HOP  # whole EnCodec frames only
    if n < min_samples:
        raise Unusable(
            f"shorter than one training crop ({len(audio) / sample_rate:.3f} s < {min_samples / sample_rate:.3f} s)"
        )
    return np.ascontiguousarray(audio[:n], dtype=np.float32), sr, channels


def _libsndfile_reason(exc: BaseException) -> str:
    """libsndfile's message without the absolute path, and without its misleading MP3 wording."""
    msg = re.sub(r"^Error opening .*?: ", "", one_line(exc)).removeprefix("Error : ")
    if msg.startswith("File does not exist or is not a regular file"):  # what it says of an unrecognised .mp3
        return "format not recognised"
    msg = msg.rstrip(".")
    return msg[:1].lower() + msg[1:]
