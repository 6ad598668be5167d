"""Calibration of the untrained EnCodec's quantizer: the crops it fits on, its refusals, and a
tokenizer that depends only on the seed, not on --threads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizer_helpers import HOP, SR, shard_codes, tok_cfg

from acoustic_mlm.tokenizer import calibration, codec, stage
from acoustic_mlm.tokenizer.codec import TokenizerError

CROPS = [(0, st, 0, 4) for st in range(0, 40, 4)]  # ten crops of 4 frames of chunk 0


def test_crop_windows_cut_every_chunk_and_take_left_context_inside_it():
    chunks = [np.zeros(10 * HOP, np.float32), np.zeros(3 * HOP + 5, np.float32)]
    assert calibration._crop_windows(chunks, 4, 2) == [(0, 0, 0, 4), (0, 4, 2, 4), (0, 8, 2, 2), (1, 0, 0, 3)]


def test_picked_crops_stop_once_they_hold_the_frames_asked_for():
    picked = calibration._pick_crops(CROPS, 10, 8, torch.Generator().manual_seed(0))
    assert picked == calibration._pick_crops(CROPS, 10, 8, torch.Generator().manual_seed(0))  # the seed decides
    assert len(set(picked)) == 3 and set(picked) <= set(CROPS)  # 12 frames: the first draw past 10
    everything = calibration._pick_crops(CROPS, 100, 8, torch.Generator().manual_seed(0))  # fewer than asked: all
    assert sorted(everything) == CROPS


def test_fewer_train_frames_than_codes_are_refused():
    with pytest.raises(TokenizerError, match="calibration needs at least 1024 train frames; the train split has 40"):
        calibration._pick_crops(CROPS, 3000, 1024, torch.Generator().manual_seed(0))


def test_calibrate_needs_a_frame_per_code_and_leaves_the_thread_count_alone():
    model = codec.build_encodec(6.0, 0)
    torch.set_num_threads(1)
    with pytest.raises(ValueError, match=r"frames \(100\) must be at least the codebook size \(1024\)"):
        calibration.calibrate(model, [np.zeros(SR, np.float32)], 100, 1, 0)
    assert torch.get_num_threads() == 1  # CALIBRATION_THREADS only while it runs


@pytest.mark.slow
def test_tokenizer_deterministic_for_seed_whatever_the_threads(calibrated, prepared, tmp_path):
    """Same seed, other --threads: the identical tokenizer; codes equal up to float near-ties."""
    again = tmp_path / "again"
    stage.run(tok_cfg(), prepared, again, threads=1)
    first, second = (torch.load(d / "model" / "tokenizer.pt", weights_only=True) for d in (calibrated, again))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    same = (np.concatenate(shard_codes(again), 1) == np.concatenate(shard_codes(calibrated), 1)).mean(axis=1)
    assert same.min() > 0.995, same  # measured: 1.0 on level 0, >= 0.9995 on the others
