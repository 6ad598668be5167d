"""A loss spike made on purpose on CPU, and the stability diagnostics catching it.

Two arms of a tiny model train on a tiny corpus whose codes the model can learn from context:
a control (`Pre-Norm | Gradient Clip=1`) and a Post-Norm arm without DeepNorm and without
clipping (`norm: post`, `clip: 0`) at the same learning rate, a peak that destabilises it. The
stages are the package's own (train, aggregate, claims' spike explanation, the stability
figure); only the corpus is made here instead of fetched and tokenized, so that the whole
experiment takes a minute:

    corpus  the rounds' tone corpus (acoustic_mlm.experiments.tone_corpus): clips of piecewise-constant codes
            and, per frame, a tone whose pitch encodes codebook 0's code, so that a masked frame's codes
            are predictable from its neighbours and the audio around it
    config  config/smoke.yaml with the two arms, FORCED_TRAIN's steps and learning rate

    python benchmarks/forced_spike.py --out results/forced_spike --figure docs/stability_forced_spike.png

writes the runs, loss_curves.csv, diagnostics.csv, the figure (and, with --figure, a copy of its
PNG) and prints what the diagnostics show at every spike. tests/report/test_stability.py runs it.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
from pathlib import Path

import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm.experiments.tone_corpus import write_corpus
from acoustic_mlm.report import aggregate, claims, stability
from acoustic_mlm.train import loop as train

ROOT = Path(__file__).resolve().parents[1]
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
