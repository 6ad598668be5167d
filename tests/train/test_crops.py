"""The training data: crops that depend only on the seed and the micro-batch number, start on frame
boundaries and come from every shard, and a crop longer than every clip refused."""

import numpy as np
import pytest
import torch
from helpers import make_config

from acoustic_mlm.artifacts.prepared import load_prepared
from acoustic_mlm.errors import UserError
from acoustic_mlm.train import loop as train
from acoustic_mlm.train.crops import CropData, batches


def test_batches_depend_only_on_seed_and_index(data_dirs, tiny_cfg):
    prepared, codes = data_dirs
    m = make_config(tiny_cfg).model_for("prenorm_clip1")
    corpus = load_prepared(prepared)
    data = CropData(corpus, codes, "train", 30, 2, m, seed=3)
    in_process = [tuple(x.clone() for x in b) for b in batches(data, 4, 8, workers=0, pin=False)]
    two_workers = list(batches(data, 4, 8, workers=2, pin=False))
    direct = data[6]
    for a, b in zip(in_process, two_workers):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(x, y) for x, y in zip(in_process[2], direct))
    wav, codes_b, mask = direct
    assert wav.shape == (2, 30 * 320) and codes_b.shape == (2, 8, 30) and mask.shape == (2, 30)
    # crops start on frame boundaries: the codes are the clip's codes at the same frames of the same shard
    found = 0
    for shard in corpus.shards:
        all_codes = np.load(codes / f"shard-{shard:05d}" / "codes.npy")
        audio = np.load(prepared / f"shard-{shard:05d}" / "audio.npy")
        for row in range(2):
            hits = np.flatnonzero(audio[::320] == wav[row, 0].item())  # the crop's first frame
            if len(hits):
                first = int(hits[0])
                assert np.array_equal(audio[first * 320 : (first + 30) * 320], wav[row].numpy())
                assert np.array_equal(all_codes[:, first : first + 30], codes_b[row].numpy())
                found += 1
    assert found == 2
    # Over many batches, crops come from both shards and both are used (each shard holds train clips).
    shards = {
        int(data.shard[c])
        for i in range(20)
        for c in np.random.default_rng([3, i]).choice(len(data.starts), size=2, p=data.p)
    }
    assert shards == {0, 1}


def test_a_crop_longer_than_every_clip_is_refused_naming_crop_seconds(data_dirs, tiny_cfg, tmp_path):
    prepared, codes = data_dirs
    tiny_cfg["train"]["crop_seconds"] = 3.0
    with pytest.raises(UserError, match="crop_seconds"):
        train.run(make_config(tiny_cfg), "prenorm_clip1", prepared, codes, tmp_path / "r")
