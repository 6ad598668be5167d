"""The tone corpus (data/tones.py), the `tones` source of the fetch stage and prepare's split of it: the
same clips for a seed, tones at the pitch of their codes, float32 WAV files that hold the samples exactly,
the last clip held out, and a configuration that cannot make the corpus refused in one line naming the key."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
from helpers import make_config

from acoustic_mlm import config as C
from acoustic_mlm.data import fetch, prepare, tones
from acoustic_mlm.errors import UserError


def test_the_corpus_is_the_same_for_a_seed_and_another_for_another_seed():
    a, b, c = (list(tones.clips(3, 50, seed)) for seed in (0, 0, 1))
    for (xa, ca), (xb, cb), (xc, _) in zip(a, b, c):
        assert xa.dtype == np.float32 and xa.shape == (50 * 320,) and ca.shape == (50,)
        assert np.array_equal(xa, xb) and np.array_equal(ca, cb)
        assert not np.array_equal(xa, xc)
    # the clips are drawn in order from one generator: the first clips do not depend on how many follow
    assert all(np.array_equal(x, y) for (x, _), (y, _) in zip(tones.clips(2, 50, 0), a))


def test_a_frame_is_a_tone_at_its_codes_pitch_and_the_deeper_codes_are_fixed_functions():
    audio, c0 = next(tones.clips(1, 600, 0))
    assert c0.min() >= 0 and c0.max() <= 15 and len(np.unique(c0)) == 16
    runs = 1 + np.count_nonzero(np.diff(c0))  # runs of one code: geometric, mean 12 frames (a repeat may join two)
    assert 600 / runs == pytest.approx(12 * 16 / 15, rel=0.25)
    t = np.arange(320) / 24000
    tone = 0.3 * np.sin(2 * np.pi * (150.0 + 90.0 * c0[:, None]) * t[None, :])  # phase restarts at each frame
    noise = audio.reshape(600, 320) - tone
    assert noise.std() == pytest.approx(0.01, rel=0.02) and abs(noise.mean()) < 1e-3
    assert tones.FREQUENCIES[[0, 1, 15]].tolist() == [150.0, 240.0, 1500.0]
    codes = tones.codes_of(np.array([0, 1, 15]), 3)
    assert codes.dtype == np.int16 and codes.tolist() == [[0, 1, 15], [1, 4, 14], [2, 7, 13]]  # (c (2k+1) + k) % 16


def test_clip_names_sort_in_the_order_the_clips_are_drawn():
    assert [tones.clip_name(i, 4) for i in range(4)] == ["tone0", "tone1", "tone2", "tone3"]
    names = [tones.clip_name(i, 24) for i in range(24)]
    assert names[:2] == ["tone00", "tone01"] and names[-1] == "tone23" and sorted(names) == names
    assert tones.clip_name(99, 100) == "tone99" and tones.clip_name(0, 101) == "tone000"


def test_whole_frames_only():
    assert tones.frames_in(8.0) == 600 and tones.frames_in(1.6) == 120
    with pytest.raises(UserError, match=r"^data\.synthetic\.clip_seconds: 1\.001 s is not a whole number") as exc:
        tones.frames_in(1.001)
    assert "\n" not in str(exc.value)


def test_the_wav_files_hold_the_samples_exactly_and_are_the_same_bytes_for_a_seed(tmp_path):
    paths = tones.write_clips(tmp_path / "a", 3, 40, 5)
    again = tones.write_clips(tmp_path / "b", 3, 40, 5)
    assert [p.name for p in paths] == ["tone0.wav", "tone1.wav", "tone2.wav"]
    assert all(p.read_bytes() == q.read_bytes() for p, q in zip(paths, again))
    for path, (audio, _) in zip(paths, tones.clips(3, 40, 5)):
        info = sf.info(str(path))
        assert (info.samplerate, info.channels, info.frames, info.subtype) == (24000, 1, 40 * 320, "FLOAT")
        back, _ = sf.read(str(path), dtype="float32")
        assert back.tobytes() == audio.tobytes()


def tones_cfg(**overrides):
    return make_config("tones.yaml", **{"data.synthetic.n_clips": 4, "data.synthetic.clip_seconds": 1.6, **overrides})


def test_fetch_and_prepare_make_the_tone_clips_with_the_last_one_held_out(tmp_path):
    cfg = tones_cfg()
    fetch.run(cfg, tmp_path / "raw")
    record = json.loads((tmp_path / "raw" / "SOURCE.json").read_text())
    assert record["source"] == "tones" and record["files"] == 4 and record["frames_per_clip"] == 120
    assert record["held_out"] == "tone3" and record["format"] == "WAV FLOAT" and record["total_seconds"] == 6.4
    assert record["params"] == {"n_clips": 4, "clip_seconds": 1.6, "sample_rate": 24000, "seed": 0}
    prepare.run(cfg, tmp_path / "raw", tmp_path / "prepared")
    manifest = pd.read_csv(tmp_path / "prepared" / "manifest.csv")
    assert manifest["clip_id"].tolist() == ["tone0", "tone1", "tone2", "tone3"]
    assert manifest["split"].tolist() == ["train", "train", "train", "valid"]  # not data.valid_fraction's hash split
    assert manifest["offset"].tolist() == [0, 38400, 76800, 115200] and set(manifest["num_frames"]) == {120}
    audio = np.load(tmp_path / "prepared" / "shard-00000" / "audio.npy")
    assert audio.tobytes() == np.concatenate([x for x, _ in tones.clips(4, 120, 0)]).tobytes()


def test_the_split_needs_the_held_out_clip_and_another():
    assert tones.splits(["tone0", "tone1", "tone2"], 3) == ["train", "train", "valid"]
    with pytest.raises(UserError, match="holds out its last clip, tone3") as exc:
        tones.splits(["tone0", "tone1", "tone2"], 4)
    assert "\n" not in str(exc.value) and "data.synthetic.n_clips is 4" in str(exc.value)


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("data.synthetic.sample_rate", 32000, "'data.synthetic.sample_rate' must be 24000 for data.source tones"),
        ("data.synthetic.clip_seconds", 1.001, "'data.synthetic.clip_seconds' is not a whole number"),
    ],
)
def test_a_configuration_that_cannot_make_the_corpus_is_refused_in_one_line(root, key, value, needle):
    mapping = C.read_yaml(root / "config" / "tones.yaml")
    section, sub, name = key.split(".")
    mapping[section][sub][name] = value
    with pytest.raises(C.ConfigError) as exc:
        C.validate(mapping, source="tones.yaml")
    assert needle in str(exc.value) and str(exc.value).startswith("tones.yaml: ") and "\n" not in str(exc.value)
