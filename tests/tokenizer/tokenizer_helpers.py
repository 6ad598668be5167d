"""The tokenizer tests' data: a prepared folder of synthetic music as the prepare stage writes it,
its codes read back per shard and per clip, the tokenize config the tests run, and EnCodec-named
checkpoints."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from acoustic_mlm import config

ROOT = Path(__file__).resolve().parents[2]
SR, HOP = 24_000, 320
CLIP_SECONDS = [4.0, 5.0, 3.2, 6.0, 4.48, 5.0, 2.56] * 2  # about 60 s; clips 3 and 10 are valid
CALIB_FRAMES, CALIB_ITERS = 3000, 6


def synth_clip(rng: np.random.Generator, seconds: float) -> np.ndarray:
    """Chords of decaying harmonic tones, with noise-burst 'drums', as a 24 kHz float32 clip."""
    n = int(round(seconds * SR)) // HOP * HOP
    y, pos = np.zeros(n), 0
    while pos < n:
        seg_t = np.arange(min(int(rng.uniform(0.2, 0.6) * SR), n - pos)) / SR
        seg = np.zeros(len(seg_t))
        root = rng.integers(40, 70)
        for midi in root + np.array([0, rng.choice([3, 4]), 7, rng.choice([10, 11, 12])]):
            f = 440.0 * 2 ** ((midi - 69) / 12)
            for h in (1, 2, 3):
                seg += np.sin(2 * np.pi * f * h * seg_t + rng.uniform(0, 2 * np.pi)) / (4 * h)
        seg *= np.exp(-seg_t * rng.uniform(1, 6))
        if rng.random() < 0.5:
            seg += rng.normal(0, 0.3, len(seg)) * np.exp(-seg_t * 40)
        y[pos : pos + len(seg)] = seg
        pos += len(seg)
    y += rng.normal(0, 0.01, n)
    return (0.3 * y / np.abs(y).max()).astype(np.float32)


def make_prepared(folder: Path, seconds=CLIP_SECONDS, seed: int = 0, shard_clips: int = 5) -> Path:
    """A prepared folder as the prepare stage writes it: shard-<k>/audio.npy + manifest.csv."""
    from acoustic_mlm.artifacts.prepared import shard_name

    rng = np.random.default_rng(seed)
    clips = [synth_clip(rng, s) for s in seconds]
    shards = [i // shard_clips for i in range(len(clips))]
    offsets = []
    for k in sorted(set(shards)):
        mine = [c for c, sh in zip(clips, shards) if sh == k]
        offsets += np.concatenate([[0], np.cumsum([len(c) for c in mine])[:-1]]).tolist()
        (folder / shard_name(k)).mkdir(parents=True, exist_ok=True)
        np.save(folder / shard_name(k) / "audio.npy", np.concatenate(mine))
    manifest = pd.DataFrame(
        {
            "clip_id": [f"clip{i:02d}" for i in range(len(clips))],
            "path": [f"synthetic/clip{i:02d}.wav" for i in range(len(clips))],
            "shard": shards,
            "split": ["valid" if i % 7 == 3 else "train" for i in range(len(clips))],
            "offset": offsets,
            "num_samples": [len(c) for c in clips],
            "num_frames": [len(c) // HOP for c in clips],
            "seconds": [len(c) / SR for c in clips],
        }
    )
    manifest.to_csv(folder / "manifest.csv", index=False)
    return folder


def shard_codes(folder: Path) -> list[np.ndarray]:
    return [np.load(p) for p in sorted(folder.glob("shard-*/codes.npy"))]


def clip_codes(prepared: Path, codes_dir: Path) -> list[np.ndarray]:
    """Each clip's (K, frames) codes, in manifest order, whatever the shard layout."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    codes = shard_codes(codes_dir)
    return [codes[r.shard][:, r.offset // HOP : r.offset // HOP + r.num_frames] for r in manifest.itertuples()]


_DEFAULT = config.load(ROOT / "config" / "config.yaml").tokenizer
LOUDNESS = {"method": _DEFAULT.loudness, "target": _DEFAULT.loudness_target}  # what the default preset normalises to


def tok_cfg(**tokenizer_keys) -> config.Config:
    """The default preset (typed) with a quicker calibration, one clip per batch and these tokenizer keys."""
    cfg = config.read_yaml(ROOT / "config" / "config.yaml")
    cfg["tokenizer"].update(
        calibration_frames=CALIB_FRAMES, calibration_iters=CALIB_ITERS, batch_size=1, **tokenizer_keys
    )
    return config.from_mapping(cfg)


def saved_checkpoint(state: dict, folder: Path) -> Path:
    """Save, hash, rename to encodec_24khz-<first 8 hex of sha256>.th, as EnCodec names its files."""
    tmp = folder / "state.th"
    torch.save(state, tmp)
    prefix = hashlib.sha256(tmp.read_bytes()).hexdigest()[:8]
    return tmp.rename(folder / f"encodec_24khz-{prefix}.th")
