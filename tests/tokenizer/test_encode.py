"""Encoding clips to codes: longest-first padded batches, long clips in segments with left context,
and columns without a clip set to -1."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from tokenizer_helpers import HOP, tok_cfg

from acoustic_mlm.tokenizer import codec, encode, loudness
from acoustic_mlm.tokenizer.encode import EncodeSettings, encode_clips


def test_pieces_cut_long_clips_into_segments_with_left_context():
    # clips of 10 and 3 frames at offsets 0 and 12 frames; segments of 4 frames, 2 frames of context
    assert encode.pieces([0, 12 * HOP], [10 * HOP, 3 * HOP], 4, 2) == [
        (0, 4, 0, 0),
        (2, 6, 2, 4),
        (6, 4, 2, 8),
        (12, 3, 0, 12),
    ]
    assert encode.pieces([0], [10 * HOP], 0, 2) == [(0, 10, 0, 0)]  # 0: never segment


def test_padded_batches_are_longest_first():
    assert encode.padded_batches([5, 9, 9, 1, 7], 2) == [[1, 2], [4, 0], [3]]
    assert encode.padded_batches([3, 3], 8) == [[0, 1]]


def test_encode_settings_from_config_round_seconds_to_frames():
    tc = replace(tok_cfg().tokenizer, batch_size=2, segment_seconds=60.0, context_seconds=0.11)  # 8.25 frames
    assert EncodeSettings.from_config(tc, "cpu") == EncodeSettings(
        batch_size=2, segment_frames=4500, context_frames=8, device="cpu"
    )


@pytest.mark.slow
def test_padded_batches_trim_each_clip_to_its_own_codes(calibrated, prepared):
    """Zero padding on the right does not change a clip's codes (the encoder is causal): batched
    codes equal one-clip-at-a-time codes but for rare float near-ties."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    clips = manifest[manifest["shard"] == 0]
    assert clips["num_samples"].nunique() > 2  # unequal lengths: real padding
    audio = np.load(prepared / "shard-00000" / "audio.npy", mmap_mode="r")
    alone = encode_clips(model, audio, clips, EncodeSettings(batch_size=1))
    batched = encode_clips(model, audio, clips, EncodeSettings(batch_size=4))
    assert (batched >= 0).all() and batched.shape == alone.shape
    same = (batched == alone).mean(axis=1)
    assert same[0] > 0.999 and same.min() > 0.99, same  # measured: 1.0 on level 0
    # Padding alone (one clip per batch, padded far past its end) changes nothing at all.
    with torch.no_grad():
        wav = torch.from_numpy(np.asarray(audio[: clips.num_samples[0]]).copy())
        plain = model.encode(wav[None, None])[0][0]
        padded = model.encode(torch.nn.functional.pad(wav, (0, 7 * HOP + 5))[None, None])[0][0]
    assert torch.equal(padded[..., : plain.shape[-1]], plain)


@pytest.mark.slow
def test_long_clips_encoded_in_segments_keep_their_codes(calibrated, prepared):
    """Segments with 1 s of left context give the whole clip's codes (the encoder forgets fast);
    without context, each segment's codes are exactly those of the segment alone."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    clips = manifest[manifest["shard"] == 0]
    audio = np.load(prepared / "shard-00000" / "audio.npy", mmap_mode="r")
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    whole = encode_clips(model, audio, clips)
    segmented = encode_clips(model, audio, clips, EncodeSettings(batch_size=3, segment_frames=75, context_frames=75))
    same = (segmented == whole).mean(axis=1)
    assert (segmented >= 0).all() and same.min() > 0.999, same  # measured: 1.0 on every level
    bare = encode_clips(model, audio, clips, EncodeSettings(segment_frames=75, context_frames=0))
    first = clips.offset.iloc[1] // HOP + 75  # the second segment of the second clip
    with torch.no_grad():
        alone = model.encode(torch.from_numpy(np.asarray(audio[first * HOP : (first + 75) * HOP]).copy())[None, None])
    np.testing.assert_array_equal(bare[:, first : first + 75], alone[0][0][0].numpy())


@pytest.mark.slow
def test_clipless_columns_are_minus_one(calibrated, prepared):
    audio = np.load(prepared / "shard-00000" / "audio.npy", mmap_mode="r")
    manifest = pd.read_csv(prepared / "manifest.csv")
    clips = manifest[manifest["shard"] == 0]
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    normalised = loudness.loudness_of(tok_cfg().tokenizer)  # as the stage normalised them
    _, gain = loudness.clip_loudness(audio, clips, normalised)
    codes = encode_clips(model, audio, clips.drop(index=2).iloc[::-1], frame_gain=gain)  # any order
    gap = slice(manifest.offset[2] // HOP, manifest.offset[2] // HOP + manifest.num_frames[2])
    assert (codes[:, gap] == -1).all()
    full = np.load(calibrated / "shard-00000" / "codes.npy")
    full[:, gap] = -1
    np.testing.assert_array_equal(codes, full)
