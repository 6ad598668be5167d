"""The tone corpus in the package's layout: the rounds' plateau (the codes' unigram entropy) and a
held-out clip, the same bytes for the same seed."""

from __future__ import annotations

import numpy as np
import pandas as pd

from acoustic_mlm.experiments import tone_corpus as corpus
from acoustic_mlm.report.decisive import plateau_bits


def test_the_tone_corpus_has_its_plateau_and_one_held_out_clip(tmp_path):
    prepared, codes = corpus.write_corpus(tmp_path / "a", clips=4, frames=120, seed=0)
    manifest = pd.read_csv(prepared / "manifest.csv")
    assert list(manifest["split"]) == ["train"] * 3 + ["valid"]
    c = np.load(codes / "shard-00000" / "codes.npy") if (codes / "shard-00000").exists() else None
    found = c if c is not None else np.load(next(codes.glob("*/codes.npy")))
    assert found.shape == (8, 4 * 120) and found.max() < corpus.CODES
    assert 0 < plateau_bits(codes) <= np.log2(corpus.CODES)
    again, _ = corpus.write_corpus(tmp_path / "b", clips=4, frames=120, seed=0)
    assert (prepared / "manifest.csv").read_bytes() == (again / "manifest.csv").read_bytes()
