"""The tone corpus of the small-scale rounds (docs/stability.md, S1): codes learnable from context, in
the package's own layout, so that every stage after tokenize reads it as it reads a tokenized corpus.

Each clip is a run of pure tones: codebook 0's code is the tone's pitch (CODES codes, held for about
RUN_FRAMES frames), the deeper codebooks fixed functions of it; the last clip is held out. The codes'
unigram entropy (the plateau) is about 4 bits; a perfect reader of the visible frames scores about 1.16
bits on masked frames. tokenizer.json is written by the tokenize stage's own merge.

The corpus is defined once, in acoustic_mlm.data.tones (the clips, their names, their codes): the
package's own stages make the same corpus from config/tones.yaml (fetch's `tones` source, prepare,
tokenize's `pitch` mode; experiments.corpora.stage_tones), whose prepared audio.npy and codes.npy are byte for byte
`write_corpus`'s (tests/tokenizer/test_pitch.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.artifacts.codes import LOUDNESS_TABLE, MODEL_DIR
from acoustic_mlm.artifacts.prepared import MANIFEST_COLUMNS, shard_name
from acoustic_mlm.data import tones
from acoustic_mlm.tokenizer.stage import merge

ROOT = Path(__file__).resolve().parents[3]
HOP, RATE = encodec.HOP, encodec.SAMPLE_RATE
CODES = tones.CODES  # distinct codes per codebook in the corpus
RUN_FRAMES = tones.RUN_FRAMES  # mean length of a run of one code
CLIPS, FRAMES = 24, 600  # the rounds' corpus: 23 training clips of 8 s and one held out
PRESET = ROOT / "config" / "tones.yaml"  # the same corpus through the package's stages (corpora.stage_tones)


def write_corpus(root: Path, clips: int = 8, frames: int = 300, seed: int = 0) -> tuple[Path, Path]:
    """A prepared corpus and its codes in the package's layout (one shard, the last clip held out)."""
    prepared, codes_dir = Path(root) / "prepared", Path(root) / "codes"
    for d in (prepared / shard_name(0), codes_dir / shard_name(0), codes_dir / MODEL_DIR):
        d.mkdir(parents=True, exist_ok=True)
    audio, codes, rows = [], [], []
    for i, (clip, c0) in enumerate(tones.clips(clips, frames, seed)):
        audio.append(clip)
        codes.append(tones.codes_of(c0, 8))  # (8, frames)
        rows.append(
            {
                "clip_id": tones.clip_name(i, clips),
                "path": f"{tones.clip_name(i, clips)}.wav",
                "shard": 0,
                "split": "valid" if i == clips - 1 else "train",
                "offset": i * frames * HOP,
                "num_samples": frames * HOP,
                "num_frames": frames,
                "orig_sample_rate": RATE,
                "orig_channels": 1,
                "gain": 1.0,  # a storage gain, where the manifest has one (the tones are stored as written)
                "duration_s": frames * HOP / RATE,
            }
        )
    np.save(prepared / shard_name(0) / "audio.npy", np.concatenate(audio))
    np.save(codes_dir / shard_name(0) / "codes.npy", np.concatenate(codes, axis=1))
    (codes_dir / shard_name(0) / "encode.json").write_text(
        json.dumps({"clips": clips, "audio_seconds": clips * frames * HOP / RATE, "encode_seconds": 0.0})
    )
    pd.DataFrame(
        {
            "clip_id": [r["clip_id"] for r in rows],
            "rms_dbfs": -13.5,
            "lufs": -13.5,  # tones at 0.3
            "gain_db": 0.0,
        }
    ).to_csv(codes_dir / shard_name(0) / LOUDNESS_TABLE, index=False)
    pd.DataFrame(rows)[list(MANIFEST_COLUMNS)].to_csv(prepared / "manifest.csv", index=False)
    (codes_dir / MODEL_DIR / "fit.json").write_text(json.dumps({"mode": "calibrated"}))
    smoke = C.read_yaml(ROOT / "config" / "smoke.yaml")
    smoke["tokenizer"]["batch_size"] = 1
    merge(C.from_mapping(smoke, "smoke.yaml"), prepared, codes_dir)  # tokenizer.json, as the stage writes it
    return prepared, codes_dir


def stage_config(clips: int = 8, frames: int = 300, seed: int = 0) -> dict:
    """config/tones.yaml's mapping for `clips` clips of `frames` frames under `seed`, in one shard as
    `write_corpus`'s."""
    m = C.read_yaml(PRESET)
    m["data"]["synthetic"].update(n_clips=int(clips), clip_seconds=int(frames) * HOP / RATE, seed=int(seed))
    m["data"]["shard_files"] = max(int(clips), m["data"]["shard_files"])
    C.from_mapping(m, f"{PRESET} ({clips} clips of {frames} frames, seed {seed})")  # refused here, in one line
    return m
