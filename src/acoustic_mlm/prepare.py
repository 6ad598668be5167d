"""Prepare stage: raw audio files -> one 24 kHz mono float32 array, a manifest and a split.

Output folder (written atomically):

- `audio.npy`: ONE 1-D float32 array, every clip concatenated in manifest order; read it with
  `np.load(..., mmap_mode="r")` (see `load_prepared`).
- `manifest.csv`: one row per clip: clip_id, path (relative to the raw folder), split
  (train | valid), offset (first sample in audio.npy), num_samples (a multiple of 320),
  num_frames (num_samples // 320, EnCodec frames), orig_sample_rate, orig_channels, duration_s.
- `rejects.csv`: path, reason for every audio-named file that is not in the manifest (empty,
  not decodable, truncated or corrupt, NaN or infinite samples, digital silence, shorter than one
  training crop, hidden). Every audio-named file under the raw folder is in exactly one of the two.
- `prepare.json`: clips and seconds per split, sample rate, kept and rejected counts by reason.

Memory is bounded by the largest file: clips are decoded one at a time and appended to audio.npy.

The split is a pure function of (split_seed, clip_id): adding, removing or reordering other
files never moves a clip between train and valid (except the guarantee that neither split
is empty, which moves the clip nearest the threshold).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import soundfile as sf

from acoustic_mlm.config import ENCODEC_HOP
from acoustic_mlm.sources import AUDIO_SUFFIXES, find_audio  # noqa: F401  (re-exported: prepare.find_audio)
from acoustic_mlm.utils import Progress, atomic_dir, log, write_json

MANIFEST_COLUMNS = ("clip_id", "path", "split", "offset", "num_samples", "num_frames",
                    "orig_sample_rate", "orig_channels", "duration_s")
REJECTS_COLUMNS = ("path", "reason")  # rejects.csv: audio-named files left out, and why
REQUIRED_COLUMNS = ("clip_id", "split", "offset", "num_samples", "num_frames")  # what readers need
_MANIFEST_DTYPES = {"clip_id": str, "path": str, "split": str, "offset": np.int64, "num_samples": np.int64,
                    "num_frames": np.int64, "orig_sample_rate": np.int64, "orig_channels": np.int64,
                    "duration_s": np.float64}


def clip_ids(rel_paths: list[str]) -> list[str]:
    """File stems; where stems collide, the relative path without suffix (then with it)."""
    stems = [Path(r).stem for r in rel_paths]
    stem_count = Counter(stems)
    ids = [s if stem_count[s] == 1 else str(Path(r).with_suffix("").as_posix()) for s, r in zip(stems, rel_paths)]
    id_count = Counter(ids)
    return [i if id_count[i] == 1 else r for i, r in zip(ids, rel_paths)]  # a/x.wav and a/x.flac


def split_hash(split_seed: int, clip_id: str) -> float:
    """A stable uniform number in [0, 1) for (seed, clip): sha256, not Python's salted hash()."""
    digest = hashlib.sha256(f"{split_seed}\x00{clip_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_splits(ids: list[str], valid_fraction: float, split_seed: int) -> list[str]:
    """'valid' where the clip's hash < valid_fraction, else 'train'; neither split left empty."""
    if len(ids) < 2:
        raise ValueError(f"prepare: {len(ids)} usable clip(s); a train and a valid split need at least 2")
    u = [split_hash(split_seed, i) for i in ids]
    split = ["valid" if x < valid_fraction else "train" for x in u]
    if "valid" not in split:  # the clip closest to the threshold from above
        split[min(range(len(ids)), key=lambda k: (u[k], ids[k]))] = "valid"
    if "train" not in split:
        split[max(range(len(ids)), key=lambda k: (u[k], ids[k]))] = "train"
    return split


class Unusable(Exception):
    """A file prepare cannot use; the message is the reason written to rejects.csv."""


def scan(raw_dir: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """(audio files to decode, as find_audio; [(relative path, reason)] for audio-named paths it leaves out).

    Hidden audio files and folders, and audio-named paths that are not regular files (broken
    links, FIFOs), are listed rather than silently dropped.
    """
    raw_dir = Path(raw_dir)
    files = find_audio(raw_dir)
    chosen = set(files)
    left_out = []
    for p in raw_dir.rglob("*"):
        if p.suffix.lower() not in AUDIO_SUFFIXES or p in chosen or p.is_dir():
            continue
        rel = p.relative_to(raw_dir)
        hidden = any(part.startswith(".") for part in rel.parts)
        left_out.append((rel.as_posix(), "hidden file or folder" if hidden else "not a regular file"))
    return files, sorted(left_out)


def _mono_blocks(path: Path, block: int = 1 << 20) -> tuple[np.ndarray, int, int, int]:
    """Decode in blocks (memory follows what decodes, not what a header claims), mixed to mono.

    Returns (mono float32, sample rate, channels, frames the header declares).
    """
    parts = []
    with sf.SoundFile(str(path)) as f, np.errstate(invalid="ignore"):  # inf - inf: NaN, caught by the caller
        sr, channels, declared = int(f.samplerate), int(f.channels), int(f.frames)
        # f.read, not f.blocks: blocks() yields its whole buffer even when the decoder stops
        # early, so a truncated file would come back padded with uninitialised memory.
        while len(b := f.read(block, dtype="float32", always_2d=True)):
            parts.append(b.mean(axis=1, dtype=np.float32))
    mono = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return mono, sr, channels, declared


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


def decode(path: Path, sample_rate: int, min_samples: int) -> tuple[np.ndarray, int, int]:
    """One file -> (mono float32 at sample_rate in whole EnCodec frames, orig rate, orig channels).

    Raises Unusable(reason) for: an empty file, one soundfile cannot open or decode (not audio,
    corrupt, truncated FLAC), a truncated or corrupt MP3 (decodes to fewer frames than its header
    declares), NaN or infinite samples, digital silence, or fewer than `min_samples` samples
    (one training crop) once resampled and trimmed to whole frames.
    """
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise Unusable(f"cannot read: {_one_line(exc)}") from None
    if size == 0:
        raise Unusable("empty file (0 bytes)")
    try:
        mono, sr, channels, declared = _mono_blocks(path)
    except Exception as exc:  # libsndfile: not audio, malformed, lost sync, ...
        raise Unusable(f"not decodable: {_libsndfile_reason(exc)}") from None
    if declared > 0 and len(mono) < (1 - TRUNCATION_TOLERANCE) * declared:
        raise Unusable(f"truncated or corrupt: decoded {len(mono)} of the {declared} frames its header declares")
    if len(mono) == 0:
        raise Unusable("no audio samples")
    if not np.isfinite(mono).all():
        raise Unusable("non-finite samples (NaN or infinity)")
    peak = float(np.abs(mono).max())
    if peak <= SILENCE_PEAK:
        raise Unusable(f"digital silence (peak {peak:.2g})")
    audio = _resample(mono, sr, sample_rate)
    n = len(audio) // ENCODEC_HOP * ENCODEC_HOP  # whole EnCodec frames only
    if n < min_samples:
        raise Unusable(f"shorter than one training crop ({len(audio) / sample_rate:.3f} s < {min_samples / sample_rate:.3f} s)")
    return np.ascontiguousarray(audio[:n], dtype=np.float32), sr, channels


def load_audio(path: Path, sample_rate: int) -> tuple[np.ndarray, int, int]:
    """Decode (soundfile), mix to mono (channel mean), resample: (float32 1-D, orig rate, orig channels)."""
    mono, sr, channels, _ = _mono_blocks(Path(path))
    return np.ascontiguousarray(_resample(mono, sr, sample_rate), dtype=np.float32), sr, channels


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _libsndfile_reason(exc: BaseException) -> str:
    """libsndfile's message without the absolute path, and without its misleading MP3 wording."""
    msg = re.sub(r"^Error opening .*?: ", "", _one_line(exc)).removeprefix("Error : ")
    if msg.startswith("File does not exist or is not a regular file"):  # what it says of an unrecognised .mp3
        return "format not recognised"
    msg = msg.rstrip(".")
    return msg[:1].lower() + msg[1:]


def reason_kind(reason: str) -> str:
    """'digital silence (peak 0)' -> 'digital silence': the part of a reason that names its kind."""
    return reason.split(":")[0].split(" (")[0]


class NpyWriter:
    """A 1-D float32 .npy file written clip by clip, so the corpus never sits in memory.

    numpy pads a 1-D header with room for any length (GROWTH_AXIS_MAX_DIGITS), so the header is
    written for length 0 first and rewritten in place with the final length: the file is then
    byte for byte what np.save would write.
    """

    def __init__(self, path: Path):
        self.path, self.n = Path(path), 0
        self.f = open(self.path, "wb")
        self.header_bytes = self._header()

    def _header(self) -> int:
        self.f.seek(0)
        np.lib.format.write_array_header_1_0(self.f, {"descr": "<f4", "fortran_order": False, "shape": (self.n,)})
        return self.f.tell()

    def append(self, x: np.ndarray) -> int:
        """Write x; return its offset (in samples)."""
        offset = self.n
        np.ascontiguousarray(x, dtype="<f4").tofile(self.f)
        self.n += len(x)
        return offset

    def close(self) -> None:
        """Write the final length into the header."""
        with self.f:
            if self._header() != self.header_bytes:  # cannot happen with numpy's padded headers
                raise RuntimeError(f"{self.path}: the .npy header changed length")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            self.f.close()


def run(cfg: dict, raw_dir: Path, out_dir: Path) -> None:
    """Decode every audio file under raw_dir into `out_dir` (audio.npy, manifest.csv, rejects.csv, prepare.json).

    Files that cannot serve as training audio are listed in rejects.csv (path, reason) rather
    than stopping the stage; every audio-named file under raw_dir is in exactly one of the two.
    """
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    sample_rate = int(cfg["data"]["sample_rate"])
    crop_frames = int(round(cfg["train"]["crop_seconds"] * sample_rate)) // ENCODEC_HOP  # as train.py
    min_samples = max(1, crop_frames) * ENCODEC_HOP
    if not raw_dir.is_dir():
        raise FileNotFoundError(f"prepare: {raw_dir} is not a folder; run fetch first")
    files, rejects = scan(raw_dir)
    if not files and not rejects:
        raise FileNotFoundError(f"prepare: no audio files ({', '.join(AUDIO_SUFFIXES)}) under {raw_dir}")
    rel = [p.relative_to(raw_dir).as_posix() for p in files]
    ids = clip_ids(rel)

    rows = []
    with atomic_dir(out_dir) as tmp:
        with NpyWriter(tmp / "audio.npy") as writer, Progress(len(files), "prepare", unit="file") as bar:
            for path, rel_path, clip_id in zip(files, rel, ids):
                try:
                    audio, orig_sr, orig_ch = decode(path, sample_rate, min_samples)
                except Unusable as why:
                    log.warning("prepare: rejected %s: %s", rel_path, why)
                    rejects.append((rel_path, str(why)))
                else:
                    n = len(audio)
                    rows.append(dict(clip_id=clip_id, path=rel_path, offset=writer.append(audio), num_samples=n,
                                     num_frames=n // ENCODEC_HOP, orig_sample_rate=orig_sr, orig_channels=orig_ch,
                                     duration_s=n / sample_rate))
                bar.update(1, kept=len(rows), rejected=len(rejects))
        rejects.sort()
        by_kind = dict(sorted(Counter(reason_kind(r) for _, r in rejects).items()))
        log.info("prepare: kept %d files, rejected %d%s", len(rows), len(rejects),
                 f" ({', '.join(f'{v} {k}' for k, v in by_kind.items())}); see rejects.csv" if rejects else "")
        if not rows:
            raise ValueError(f"prepare: no usable audio under {raw_dir}: all {len(rejects)} audio files rejected "
                             f"({', '.join(f'{v} {k}' for k, v in by_kind.items())})")

        manifest = pd.DataFrame(rows)
        manifest["split"] = assign_splits(manifest["clip_id"].tolist(), cfg["data"]["valid_fraction"],
                                          cfg["data"]["split_seed"])
        manifest = manifest[list(MANIFEST_COLUMNS)]
        total = int(manifest["num_samples"].sum())
        manifest.to_csv(tmp / "manifest.csv", index=False)
        pd.DataFrame(rejects, columns=list(REJECTS_COLUMNS)).to_csv(tmp / "rejects.csv", index=False)
        by_split = manifest.groupby("split")
        write_json(tmp / "prepare.json", {
            "sample_rate": sample_rate,
            "hop": ENCODEC_HOP,
            "clips": {s: int(by_split.size().get(s, 0)) for s in ("train", "valid")},
            "seconds": {s: round(float(by_split["duration_s"].sum().get(s, 0.0)), 3) for s in ("train", "valid")},
            "total_samples": total,
            "valid_fraction": cfg["data"]["valid_fraction"],
            "split_seed": cfg["data"]["split_seed"],
            "min_seconds": min_samples / sample_rate,
            "kept": len(rows),
            "rejected": len(rejects),
            "rejected_by_reason": by_kind,
        })
    log.info("prepare: %d clips (%d train, %d valid), %.1f s at %d Hz in %s", len(manifest),
             (manifest["split"] == "train").sum(), (manifest["split"] == "valid").sum(),
             total / sample_rate, sample_rate, out_dir)


def load_prepared(prepared_dir: Path) -> tuple[np.memmap, pd.DataFrame]:
    """The prepared corpus: (audio.npy memory-mapped read-only, manifest with typed columns),
    checked against each other; every problem is one line naming the file (and the clip).

    Clip i is `audio[offset : offset + num_samples]`. Tokenization and training both read the
    corpus through here.
    """
    prepared_dir = Path(prepared_dir)
    audio_path, manifest_path = prepared_dir / "audio.npy", prepared_dir / "manifest.csv"
    for p in (audio_path, manifest_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p}: not found (run the prepare stage first)")
    try:
        audio = np.load(audio_path, mmap_mode="r")
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line error
        raise ValueError(f"{audio_path}: not a readable .npy array ({exc})") from None
    if audio.ndim != 1 or audio.dtype != np.float32:
        raise ValueError(f"{audio_path}: expected a 1-D float32 array, got {audio.dtype} {audio.shape}")
    try:  # keep_default_na: a clip called "NA" or "null" stays a string
        manifest = pd.read_csv(manifest_path, dtype=_MANIFEST_DTYPES, keep_default_na=False)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"{manifest_path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in manifest.columns]
    if missing:
        raise ValueError(f"{manifest_path}: missing column(s) {', '.join(missing)}")
    if manifest.empty:
        raise ValueError(f"{manifest_path}: no clips")
    bad_split = sorted(set(manifest["split"].astype(str)) - {"train", "valid"})
    if bad_split:
        raise ValueError(f"{manifest_path}: split must be train or valid, found {bad_split[0]!r}")
    o, s, nf = (manifest[c].to_numpy(np.int64) for c in ("offset", "num_samples", "num_frames"))
    checks = [
        ((s <= 0) | (s % ENCODEC_HOP != 0), f"num_samples is not a positive multiple of {ENCODEC_HOP}"),
        (nf != s // ENCODEC_HOP, f"num_frames != num_samples // {ENCODEC_HOP}"),
        ((o < 0) | (o % ENCODEC_HOP != 0), f"offset is not a non-negative multiple of {ENCODEC_HOP}"),
        (o + s > len(audio), f"offset + num_samples exceeds the {len(audio)} samples of {audio_path.name} "
                             f"(the manifest does not match the audio; rerun prepare)"),
    ]
    for bad, what in checks:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{manifest_path}: clip {manifest['clip_id'].iloc[i]!r} (row {i + 2}): {what}")
    order = np.argsort(o, kind="stable")
    overlap = o[order][1:] < (o + s)[order][:-1]
    if overlap.any():
        i = int(order[1:][overlap][0])
        raise ValueError(f"{manifest_path}: clip {manifest['clip_id'].iloc[i]!r} (row {i + 2}) overlaps another clip")
    return audio, manifest
