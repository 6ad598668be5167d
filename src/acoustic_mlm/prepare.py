"""Prepare stage: raw audio files -> one 24 kHz mono float32 array, a manifest and a split.

Output folder (written atomically):

- `audio.npy`: ONE 1-D float32 array, every clip concatenated in manifest order; read it with
  `np.load(..., mmap_mode="r")` (see `load_prepared`).
- `manifest.csv`: one row per clip: clip_id, path (relative to the raw folder), split
  (train | valid), offset (first sample in audio.npy), num_samples (a multiple of 320),
  num_frames (num_samples // 320, EnCodec frames), orig_sample_rate, orig_channels, duration_s.
- `prepare.json`: clips and seconds per split, sample rate, skipped files.

The split is a pure function of (split_seed, clip_id): adding, removing or reordering other
files never moves a clip between train and valid (except the guarantee that neither split
is empty, which moves the clip nearest the threshold).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import soundfile as sf

from acoustic_mlm.config import ENCODEC_HOP
from acoustic_mlm.utils import Progress, atomic_dir, log, write_json

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
MANIFEST_COLUMNS = ("clip_id", "path", "split", "offset", "num_samples", "num_frames",
                    "orig_sample_rate", "orig_channels", "duration_s")
_MANIFEST_DTYPES = {"clip_id": str, "path": str, "split": str, "offset": np.int64, "num_samples": np.int64,
                    "num_frames": np.int64, "orig_sample_rate": np.int64, "orig_channels": np.int64,
                    "duration_s": np.float64}


def find_audio(raw_dir: Path) -> list[Path]:
    """Audio files under raw_dir (recursive, hidden folders skipped), sorted by relative path."""
    raw_dir = Path(raw_dir)
    found = [
        p for p in raw_dir.rglob("*")
        if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(raw_dir).parts)
    ]
    return sorted(found, key=lambda p: p.relative_to(raw_dir).as_posix())


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


def load_audio(path: Path, sample_rate: int) -> tuple[np.ndarray, int, int]:
    """Decode (soundfile), mix to mono (channel mean), resample: (float32 1-D, orig rate, orig channels)."""
    data, sr = sf.read(str(path), dtype="float32", always_2d=True)  # (samples, channels)
    mono = data.mean(axis=1, dtype=np.float32)
    if sr != sample_rate:
        import torch
        import torchaudio.functional as AF

        mono = AF.resample(torch.from_numpy(mono), sr, sample_rate).numpy()
    return np.ascontiguousarray(mono, dtype=np.float32), int(sr), int(data.shape[1])


def run(cfg: dict, raw_dir: Path, out_dir: Path) -> None:
    """Decode every audio file under raw_dir into `out_dir` (audio.npy, manifest.csv, prepare.json)."""
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    sample_rate = int(cfg["data"]["sample_rate"])
    files = find_audio(raw_dir)
    if not files:
        raise FileNotFoundError(f"prepare: no audio files ({', '.join(AUDIO_SUFFIXES)}) under {raw_dir}")
    rel = [p.relative_to(raw_dir).as_posix() for p in files]
    ids = clip_ids(rel)

    rows, clips, skipped = [], [], []
    with Progress(len(files), "prepare", unit="file") as bar:
        for path, rel_path, clip_id in zip(files, rel, ids):
            audio, orig_sr, orig_ch = load_audio(path, sample_rate)
            n = len(audio) // ENCODEC_HOP * ENCODEC_HOP  # whole EnCodec frames only
            bar.update(1)
            if n == 0:
                log.warning("prepare: skipping %s: %d samples at %d Hz is shorter than one frame (%d)",
                            rel_path, len(audio), sample_rate, ENCODEC_HOP)
                skipped.append(rel_path)
                continue
            clips.append(audio[:n])
            rows.append(dict(clip_id=clip_id, path=rel_path, num_samples=n, num_frames=n // ENCODEC_HOP,
                             orig_sample_rate=orig_sr, orig_channels=orig_ch, duration_s=n / sample_rate))

    manifest = pd.DataFrame(rows)
    if manifest.empty:
        raise ValueError(f"prepare: every audio file under {raw_dir} is shorter than one frame")
    manifest["split"] = assign_splits(manifest["clip_id"].tolist(), cfg["data"]["valid_fraction"],
                                      cfg["data"]["split_seed"])
    manifest["offset"] = np.cumsum(manifest["num_samples"].to_numpy()) - manifest["num_samples"].to_numpy()
    manifest = manifest[list(MANIFEST_COLUMNS)]

    with atomic_dir(out_dir) as tmp:
        total = int(manifest["num_samples"].sum())
        audio = np.lib.format.open_memmap(tmp / "audio.npy", mode="w+", dtype=np.float32, shape=(total,))
        for off, clip in zip(manifest["offset"].tolist(), clips):
            audio[off : off + len(clip)] = clip
        audio.flush()
        del audio
        manifest.to_csv(tmp / "manifest.csv", index=False)
        by_split = manifest.groupby("split")
        write_json(tmp / "prepare.json", {
            "sample_rate": sample_rate,
            "hop": ENCODEC_HOP,
            "clips": {s: int(by_split.size().get(s, 0)) for s in ("train", "valid")},
            "seconds": {s: round(float(by_split["duration_s"].sum().get(s, 0.0)), 3) for s in ("train", "valid")},
            "total_samples": total,
            "valid_fraction": cfg["data"]["valid_fraction"],
            "split_seed": cfg["data"]["split_seed"],
            "skipped": skipped,
        })
    log.info("prepare: %d clips (%d train, %d valid), %.1f s at %d Hz in %s", len(manifest),
             (manifest["split"] == "train").sum(), (manifest["split"] == "valid").sum(),
             total / sample_rate, sample_rate, out_dir)


def load_prepared(prepared_dir: Path) -> tuple[np.memmap, pd.DataFrame]:
    """The prepared corpus: (audio.npy memory-mapped read-only, manifest with typed columns).

    Clip i is `audio[offset : offset + num_samples]`.
    """
    prepared_dir = Path(prepared_dir)
    audio = np.load(prepared_dir / "audio.npy", mmap_mode="r")
    # keep_default_na: a clip called "NA" or "null" stays a string
    manifest = pd.read_csv(prepared_dir / "manifest.csv", dtype=_MANIFEST_DTYPES, keep_default_na=False)
    end = int((manifest["offset"] + manifest["num_samples"]).max()) if len(manifest) else 0
    if audio.ndim != 1 or end != len(audio):
        raise ValueError(f"{prepared_dir}: manifest.csv (ends at sample {end}) does not match audio.npy "
                         f"({audio.shape}); rerun prepare")
    return audio, manifest
