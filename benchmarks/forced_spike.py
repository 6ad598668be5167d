"""A loss spike made on purpose on CPU, and the stability diagnostics catching it.

Two arms of a tiny model train on a tiny corpus whose codes the model can learn from context:
a control (`Pre-Norm | Gradient Clip=1`) and a Post-Norm arm without DeepNorm and without
clipping (`norm: post`, `clip: 0`) at the same learning rate, a peak that destabilises it. The
stages are the package's own (train, aggregate, claims' spike explanation, the stability
figure); only the corpus is made here instead of fetched and tokenized, so that the whole
experiment takes a minute:

    corpus  clips of piecewise-constant codes (runs of RUN_FRAMES frames on average) and, per
            frame, a tone whose pitch encodes codebook 0's code, so that a masked frame's codes are
            predictable from its neighbours and the audio around it
    config  config/smoke.yaml with the two arms, FORCED_TRAIN's steps and learning rate

    python benchmarks/forced_spike.py --out results/forced_spike --figure docs/stability_forced_spike.png

writes the runs, loss_curves.csv, diagnostics.csv, the figure (and, with --figure, a copy of its
PNG) and prints what the diagnostics show at every spike. tests/report/test_stability.py runs it.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.artifacts.codes import LOUDNESS_TABLE, MODEL_DIR
from acoustic_mlm.artifacts.prepared import MANIFEST_COLUMNS, shard_name
from acoustic_mlm.report import aggregate, claims, stability
from acoustic_mlm.tokenizer.stage import merge
from acoustic_mlm.train import loop as train

ROOT = Path(__file__).resolve().parents[1]
HOP, RATE = encodec.HOP, encodec.SAMPLE_RATE
CODES = 16  # distinct codes per codebook in the corpus
RUN_FRAMES = 12  # mean length of a run of one code
FORCED_TRAIN = dict(
    steps=240,
    warmup_steps=24,
    lr=0.05,
    batch_size=4,
    crop_seconds=0.4,
    log_interval=5,
    valid_crops=4,
    checkpoint_interval=0,
)  # lr 25 times the default's 2e-3
# Spikes of more than 2 bits (the default 0.5 also counts the row-to-row noise of batches of 4 crops).
FORCED_CLAIMS = dict(spike_threshold=2.0, recovery_margin=0.5)
ARMS = {
    "prenorm_clip1": {
        "label": "Pre-Norm | Gradient Clip=1 (control)",
        "norm": "pre",
        "attention": "softmax",
        "clip": 1.0,
        "seeds": [1],
    },
    "postnorm_noclip": {
        "label": "Post-Norm | no DeepNorm | no clip",
        "norm": "post",
        "attention": "softmax",
        "clip": 0.0,
        "seeds": [1],
    },
}


def write_corpus(root: Path, clips: int = 8, frames: int = 300, seed: int = 0) -> tuple[Path, Path]:
    """A prepared corpus and its codes in the package's layout (one shard, the last clip held out)."""
    rng = np.random.default_rng(seed)
    prepared, codes_dir = Path(root) / "prepared", Path(root) / "codes"
    for d in (prepared / shard_name(0), codes_dir / shard_name(0), codes_dir / MODEL_DIR):
        d.mkdir(parents=True, exist_ok=True)
    t = np.arange(HOP) / RATE
    audio, codes, rows = [], [], []
    for i in range(clips):
        runs = rng.geometric(1 / RUN_FRAMES, size=frames)  # run lengths, more than enough
        c0 = np.repeat(rng.integers(0, CODES, size=frames), runs)[:frames]
        tone = np.sin(2 * np.pi * (150.0 + 90.0 * c0[:, None]) * t[None, :])  # (frames, HOP): pitch = code
        audio.append((0.3 * tone + 0.01 * rng.standard_normal(tone.shape)).reshape(-1).astype(np.float32))
        codes.append(np.stack([(c0 * (2 * k + 1) + k) % CODES for k in range(8)]).astype(np.int16))  # (8, frames)
        rows.append(
            {
                "clip_id": f"tone{i}",
                "path": f"tone{i}.wav",
                "shard": 0,
                "split": "valid" if i == clips - 1 else "train",
                "offset": i * frames * HOP,
                "num_samples": frames * HOP,
                "num_frames": frames,
                "orig_sample_rate": RATE,
                "orig_channels": 1,
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


def forced_config(base: dict | None = None) -> dict:
    """config/smoke.yaml's mapping (or `base`) with the experiment's arms and training settings, validated:
    the file's settings, for a caller to edit further before `run` types them."""
    settings = copy.deepcopy(base if base is not None else C.read_yaml(ROOT / "config" / "smoke.yaml"))
    settings["train"].update(FORCED_TRAIN)
    settings["claims"].update(FORCED_CLAIMS)
    settings["runs"] = copy.deepcopy(ARMS)
    return C.validate(settings, "forced_spike")


def run(out: Path, threads: int = 1, cfg: C.Config | None = None) -> dict:
    """The whole experiment into `out`: corpus, both arms, tidy files, spike explanations, figure.
    `cfg`: forced_config()'s settings typed (`C.from_mapping`, edited or not); default: as they are."""
    out = Path(out)
    cfg = cfg if cfg is not None else C.from_mapping(forced_config(), "forced_spike")
    prepared, codes = write_corpus(out / "data")
    for name in cfg.runs:
        train.run(cfg, name, prepared, codes, out / "runs" / name, threads=threads)
    curves = out / "loss_curves.csv"
    aggregate.run(cfg, out / "runs", curves)
    stats = claims.collect(pd.read_csv(curves), list(cfg.runs), cfg.claims, split=cfg.figure.split)
    explained = claims.explain_spikes(stats, pd.read_csv(out / aggregate.DIAGNOSTICS))
    figures = stability.run(cfg, curves, out / aggregate.DIAGNOSTICS, out / "figures")
    (out / "spikes.md").write_text(claims.spikes_markdown(explained))
    return {"cfg": cfg, "explained": explained, "figures": figures}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("results/forced_spike"), help="working folder (replaced)")
    p.add_argument("--figure", type=Path, default=None, help="also copy the stability PNG here")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    result = run(args.out, args.threads)
    print(claims.spikes_markdown(result["explained"]))
    if args.figure:
        shutil.copyfile(result["figures"][0], args.figure)
        print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
