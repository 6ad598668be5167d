"""Fetch (synthetic) and prepare: 24 kHz mono, whole EnCodec frames, a stable split."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf

from acoustic_mlm import config as C
from acoustic_mlm.data import fetch
from acoustic_mlm.data import prepare
from acoustic_mlm.data.corpus import load_prepared
from acoustic_mlm.tokenizer import stage as tokenizer
from acoustic_mlm.errors import UserError
from acoustic_mlm import encodec

SR = 24000


def make_cfg(n_clips: int = 4, clip_seconds: float = 1.1, valid_fraction: float = 0.25, split_seed: int = 0,
             crop_seconds: float = 0.1, shard_files: int = 3) -> dict:
    return {
        "data": {
            "source": "synthetic", "sample_rate": SR, "valid_fraction": valid_fraction, "split_seed": split_seed,
            "shard_files": shard_files,
            "synthetic": {"n_clips": n_clips, "clip_seconds": clip_seconds, "sample_rate": 32000, "seed": 0},
        },
        "train": {"crop_seconds": crop_seconds},  # clips shorter than one crop are rejected
    }


def sine(hz: float, seconds: float, sr: int, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * hz * np.arange(int(seconds * sr)) / sr)).astype(np.float32)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    cfg = make_cfg()
    fetch.run(cfg, root / "raw")
    prepare.run(cfg, root / "raw", root / "prepared")
    return cfg, root


def test_fetch_writes_flac_and_source_json(prepared):
    _, root = prepared
    names = sorted(p.name for p in (root / "raw").iterdir())
    assert names == ["SOURCE.json"] + [f"synth_{i:05d}.flac" for i in range(4)]
    source = json.loads((root / "raw" / "SOURCE.json").read_text())
    assert source["source"] == "synthetic" and source["files"] == 4
    assert source["params"] == {"n_clips": 4, "clip_seconds": 1.1, "sample_rate": 32000, "seed": 0}
    assert source["total_seconds"] == pytest.approx(4.4)
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_fetch_rejects_an_unknown_source(tmp_path):
    cfg = make_cfg()
    cfg["data"]["source"] = "cassette"
    with pytest.raises(UserError, match=r"^data\.source: unknown source 'cassette'") as err:
        fetch.run(cfg, tmp_path / "raw")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "raw").exists()


def test_prepared_audio_is_24khz_mono_in_whole_frames(prepared):
    _, root = prepared
    corpus = load_prepared(root / "prepared")
    manifest = corpus.manifest
    assert list(manifest.columns) == list(prepare.MANIFEST_COLUMNS)
    assert manifest["clip_id"].tolist() == [f"synth_{i:05d}" for i in range(4)]
    assert manifest["path"].tolist() == [f"synth_{i:05d}.flac" for i in range(4)]
    assert manifest["shard"].tolist() == [0, 0, 0, 1]  # shards of 3 files, in path order
    # 1.1 s at 32 kHz -> 26400 samples at 24 kHz -> 82 frames of 320
    assert (manifest["num_samples"] == 82 * encodec.HOP).all()
    assert (manifest["num_frames"] == manifest["num_samples"] // encodec.HOP).all()
    assert (manifest["orig_sample_rate"] == 32000).all()
    assert set(manifest["orig_channels"]) <= {1, 2}
    assert np.allclose(manifest["duration_s"], manifest["num_samples"] / SR)
    for shard, clips in manifest.groupby("shard"):  # each shard's clips tile its audio.npy in order
        audio = corpus.audio(shard)
        assert isinstance(audio, np.memmap) and audio.dtype == np.float32 and audio.ndim == 1
        ends = (clips["offset"] + clips["num_samples"]).to_numpy()
        assert clips["offset"].iloc[0] == 0 and (clips["offset"].to_numpy()[1:] == ends[:-1]).all()
        assert ends[-1] == len(audio)
        assert np.isfinite(audio).all() and np.abs(audio).max() <= 1.0
    for i in range(len(manifest)):  # every clip carries sound
        assert np.abs(corpus.clip(i)).max() > 0.05


def test_shards_join_into_the_corpus_one_shard_makes(prepared, tmp_path):
    """Shard size changes only the layout: the clips, their audio and the split are the same."""
    cfg, root = prepared
    one = make_cfg(shard_files=1000)
    prepare.run(one, root / "raw", tmp_path / "one")
    a, b = load_prepared(root / "prepared"), load_prepared(tmp_path / "one")
    assert b.shards == [0] and a.shards == [0, 1]
    cols = ["clip_id", "path", "split", "num_samples", "orig_sample_rate", "orig_channels"]
    pd.testing.assert_frame_equal(a.manifest[cols], b.manifest[cols])
    for i in range(len(a.manifest)):
        assert np.array_equal(a.clip(i), b.clip(i))
    plan = pd.read_csv(root / "prepared" / "shards.csv", keep_default_na=False)
    assert list(plan.columns) == list(prepare.PLAN_COLUMNS) and plan["shard"].tolist() == [0, 0, 0, 1]


def test_sharded_steps_run_separately_match_the_whole_stage(prepared, tmp_path):
    """Snakemake runs plan, each shard and merge as separate jobs: the same files as `run`."""
    cfg, root = prepared
    out = tmp_path / "steps"
    todo = prepare.plan(cfg, root / "raw", out)
    for shard in sorted(todo["shard"].unique(), reverse=True):  # any order
        prepare.prepare_shard(cfg, root / "raw", out, shard)
    with pytest.raises(UserError, match=r"shards\.csv: no shard 7 \(the plan has shards 0-1\)"):
        prepare.prepare_shard(cfg, root / "raw", out, 7)
    prepare.merge(cfg, out)
    for name in ("manifest.csv", "rejects.csv", "prepare.json", "shards.csv", "shard-00000/audio.npy",
                 "shard-00001/clips.csv"):
        assert (out / name).read_bytes() == (root / "prepared" / name).read_bytes(), name


def test_merge_names_a_missing_shard(prepared, tmp_path):
    cfg, root = prepared
    out = tmp_path / "partial"
    prepare.plan(cfg, root / "raw", out)
    prepare.prepare_shard(cfg, root / "raw", out, 0)
    with pytest.raises(UserError, match=r"shard-00001/clips\.csv: not found \(run `amlm prepare --shard 1`"):
        prepare.merge(cfg, out)
    assert not (out / "manifest.csv").exists()


def test_prepare_summary_and_both_splits(prepared):
    _, root = prepared
    manifest = load_prepared(root / "prepared").manifest
    summary = json.loads((root / "prepared" / "prepare.json").read_text())
    assert summary["sample_rate"] == SR and summary["hop"] == encodec.HOP
    assert (summary["shards"], summary["shard_files"]) == (2, 3)
    counts = manifest["split"].value_counts()
    assert counts["train"] >= 1 and counts["valid"] >= 1
    assert summary["clips"] == {"train": int(counts["train"]), "valid": int(counts["valid"])}
    assert sum(summary["seconds"].values()) == pytest.approx(manifest["duration_s"].sum(), abs=1e-3)
    assert (summary["kept"], summary["rejected"], summary["rejected_by_reason"]) == (4, 0, {})
    assert (root / "prepared" / "rejects.csv").read_text() == "path,reason\n"


def test_prepare_is_deterministic(prepared, tmp_path):
    cfg, root = prepared
    prepare.run(cfg, root / "raw", tmp_path / "again")
    for name in ("shard-00000/audio.npy", "shard-00001/audio.npy", "manifest.csv", "rejects.csv", "prepare.json"):
        assert (tmp_path / "again" / name).read_bytes() == (root / "prepared" / name).read_bytes()


def test_split_is_a_function_of_seed_and_clip_id():
    ids = [f"clip_{i:04d}" for i in range(1000)]
    split = dict(zip(ids, prepare.assign_splits(ids, 0.1, split_seed=0)))
    assert 0.07 < sum(s == "valid" for s in split.values()) / len(ids) < 0.13
    shuffled = list(np.random.default_rng(0).permutation(ids))
    assert dict(zip(shuffled, prepare.assign_splits(shuffled, 0.1, split_seed=0))) == split  # order-free
    subset = ids[::7]
    assert prepare.assign_splits(subset, 0.1, 0) == [split[i] for i in subset]  # others don't matter
    assert prepare.assign_splits(ids, 0.1, split_seed=1) != [split[i] for i in ids]  # the seed does


@pytest.mark.parametrize("fraction", [1e-12, 1 - 1e-12])
def test_neither_split_is_ever_empty(fraction):
    for n in (2, 3, 5):
        ids = [f"x{i}" for i in range(n)]
        split = prepare.assign_splits(ids, fraction, 0)
        assert {"train", "valid"} <= set(split)
        assert prepare.assign_splits(ids[::-1], fraction, 0) == split[::-1]


def test_one_clip_cannot_be_split():
    with pytest.raises(UserError, match="at least 2"):
        prepare.assign_splits(["only"], 0.1, 0)


def test_empty_folder_is_a_one_line_error(tmp_path):
    (tmp_path / "raw").mkdir()
    with pytest.raises(UserError, match="no files") as err:
        prepare.run(make_cfg(), tmp_path / "raw", tmp_path / "prepared")
    assert str(tmp_path / "raw") in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "raw" / "notes.txt").write_text("not audio")  # a file, judged by content: not audio
    with pytest.raises(UserError, match=r"^prepare: no usable audio: all 1 files rejected \(1 not audio\)$"):
        prepare.run(make_cfg(), tmp_path / "raw", tmp_path / "prepared")
    assert not (tmp_path / "prepared").exists()


def test_44k_stereo_wav_is_mixed_and_resampled(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    left = sine(440.0, 0.5, 44100, amp=0.5)
    sf.write(raw / "tone.wav", np.stack([left, np.zeros_like(left)], axis=1), 44100)  # right channel silent
    sf.write(raw / "other.wav", sine(220.0, 0.5, 44100)[:, None], 44100)
    prepare.run(make_cfg(), raw, tmp_path / "prepared")
    corpus = load_prepared(tmp_path / "prepared")
    row = corpus.manifest.set_index("clip_id").loc["tone"]
    assert (row.orig_sample_rate, row.orig_channels) == (44100, 2)
    assert row.num_samples == (int(0.5 * SR) // encodec.HOP) * encodec.HOP == 11840
    x = np.asarray(corpus.clip(int(np.flatnonzero(corpus.manifest["clip_id"] == "tone")[0])), dtype=np.float64)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    peak_hz = np.fft.rfftfreq(len(x), 1 / SR)[np.argmax(spectrum)]
    assert abs(peak_hz - 440.0) < 3.0  # bin width 2 Hz
    middle = x[1000:-1000]
    assert np.abs(middle).max() == pytest.approx(0.25, abs=0.01)  # mean of 0.5 and 0


def test_formats_nesting_stem_collisions_and_short_files(tmp_path, caplog):
    raw = tmp_path / "raw"
    (raw / "a").mkdir(parents=True)
    (raw / "b").mkdir()
    (raw / ".hidden").mkdir()
    sf.write(raw / "a" / "song.wav", sine(330, 0.3, 16000)[:, None], 16000)
    sf.write(raw / "b" / "song.flac", sine(330, 0.3, SR)[:, None], SR)
    sf.write(raw / "007.ogg", sine(330, 0.3, 22050)[:, None], 22050, format="OGG", subtype="VORBIS")
    sf.write(raw / "b" / "take.mp3", sine(330, 0.5, 48000)[:, None], 48000, format="MP3", subtype="MPEG_LAYER_III")
    sf.write(raw / "tiny.WAV", sine(330, 0.005, SR)[:, None], SR)  # 120 samples < one frame
    sf.write(raw / ".hidden" / "x.wav", sine(330, 0.3, SR)[:, None], SR)
    with caplog.at_level(logging.WARNING, logger="acoustic_mlm"):
        prepare.run(make_cfg(), raw, tmp_path / "prepared")
    assert any("tiny.WAV" in r.getMessage() for r in caplog.records)
    manifest = load_prepared(tmp_path / "prepared").manifest
    assert manifest["path"].tolist() == ["007.ogg", "a/song.wav", "b/song.flac", "b/take.mp3"]
    assert manifest["clip_id"].tolist() == ["007", "a/song", "b/song", "take"]  # "007" stays a string
    assert (manifest["num_samples"] % encodec.HOP == 0).all() and (manifest["num_samples"] > 0).all()
    assert manifest["orig_sample_rate"].tolist() == [22050, 16000, SR, 48000]
    rejects = pd.read_csv(tmp_path / "prepared" / "rejects.csv")
    assert rejects["path"].tolist() == [".hidden/x.wav", "tiny.WAV"]
    assert rejects["reason"].tolist()[0] == "hidden file or folder"
    assert rejects["reason"].tolist()[1].startswith("shorter than one training crop (0.005 s < 0.093 s)")


def test_clip_ids_fall_back_to_full_relative_paths():
    assert prepare.clip_ids(["x/a.wav", "x/a.flac", "y/a.wav", "b.mp3"]) == ["x/a.wav", "x/a.flac", "y/a", "b"]


def test_load_prepared_detects_a_mismatch(prepared, tmp_path):
    _, root = prepared
    bad = tmp_path / "bad"
    shutil.copytree(root / "prepared", bad)
    audio = np.load(bad / "shard-00001" / "audio.npy")
    np.save(bad / "shard-00001" / "audio.npy", audio[:-encodec.HOP])
    with pytest.raises(UserError, match=r"clip 'synth_00003' \(row 5\): offset \+ num_samples exceeds its shard's audio"):
        load_prepared(bad)
    shutil.rmtree(bad / "shard-00001")
    with pytest.raises(UserError, match=r"shard-00001/audio\.npy: not found"):
        load_prepared(bad)


# ------------------------------------------------------------------------------------------
# Robust decoding: every audio-named file ends in the manifest or in rejects.csv


def _write(path, x: np.ndarray, sr: int, **kw) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, x, sr, **kw)
    return path.read_bytes()


def _scramble(data: bytes, start: float, stop: float) -> bytes:
    b = bytearray(data)
    for i in range(int(len(b) * start), int(len(b) * stop)):
        b[i] = (b[i] * 7 + 13) % 256
    return bytes(b)


def make_messy_folder(folder) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Good files of many shapes next to bad files of every kind.

    Returns ({good path: (orig rate, orig channels)}, {bad path: expected reason kind}).
    """
    one = sine(440.0, 1.0, SR)
    good = {
        "good/mono_24k.wav": (SR, 1),
        "good/stereo_48k.flac": (48000, 2),
        "good/six_channels_8k.wav": (8000, 6),
        "good/vorbis_22k.ogg": (22050, 1),
        "good/lame_44k.mp3": (44100, 1),
        "good/float_96k.wav": (96000, 1),
        "good/odd_rate_44101.wav": (44101, 1),  # resampled as 44100 Hz: exact would take minutes
    }
    _write(folder / "good/mono_24k.wav", one, SR)
    _write(folder / "good/stereo_48k.flac", np.stack([sine(440, 1.0, 48000), sine(660, 1.0, 48000)], 1), 48000)
    _write(folder / "good/six_channels_8k.wav", np.stack([sine(200 + 50 * c, 1.0, 8000) for c in range(6)], 1), 8000)
    _write(folder / "good/vorbis_22k.ogg", sine(440, 1.0, 22050), 22050, format="OGG", subtype="VORBIS")
    mp3 = _write(folder / "good/lame_44k.mp3", sine(440, 1.0, 44100), 44100, format="MP3")
    _write(folder / "good/float_96k.wav", sine(440, 1.0, 96000), 96000, subtype="FLOAT")
    _write(folder / "good/odd_rate_44101.wav", sine(440, 1.0, 44101), 44101)

    bad_dir = folder / "bad"
    bad_dir.mkdir()
    flac = _write(bad_dir / "corrupt.flac", sine(440, 1.0, SR), SR)
    (bad_dir / "corrupt.flac").write_bytes(_scramble(flac, 0.3, 0.5))
    (bad_dir / "truncated.flac").write_bytes(flac[: len(flac) // 2])
    (bad_dir / "truncated.mp3").write_bytes(mp3[: len(mp3) // 2])
    (bad_dir / "corrupt.mp3").write_bytes(_scramble(mp3, 0.2, 0.6))
    (bad_dir / "empty.wav").write_bytes(b"")
    (bad_dir / "notes.wav").write_text("these are lecture notes, not audio\n" * 20)
    (bad_dir / "cover.mp3").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF" + bytes(range(256)) * 4)  # a JPEG
    (bad_dir / "html.ogg").write_text("<html><body>404 Not Found</body></html>")
    x = one.copy()
    x[100] = np.nan
    _write(bad_dir / "nan.wav", x, SR, subtype="FLOAT")
    x = one.copy()
    x[200] = np.inf
    _write(bad_dir / "inf.wav", x, SR, subtype="FLOAT")
    _write(bad_dir / "silence.flac", np.zeros(SR, np.float32), SR)
    _write(bad_dir / "cancelling_stereo.wav", np.stack([one, -one], 1), SR)  # mono mix is silent
    _write(bad_dir / "short.wav", sine(440, 0.3, SR), SR)  # shorter than one 0.5 s crop
    bad = {
        "bad/corrupt.flac": "not decodable",  # libsndfile: "flac decoder lost sync"
        "bad/truncated.flac": "not decodable",
        "bad/truncated.mp3": "truncated or corrupt",  # mpg123 decodes what is there: fewer frames than declared
        "bad/corrupt.mp3": ("truncated or corrupt", "not decodable"),  # depends on where mpg123 resyncs
        "bad/empty.wav": "empty file",
        "bad/notes.wav": "not decodable",
        "bad/cover.mp3": "not decodable",
        "bad/html.ogg": "not decodable",
        "bad/nan.wav": "non-finite samples",
        "bad/inf.wav": "non-finite samples",
        "bad/silence.flac": "digital silence",
        "bad/cancelling_stereo.wav": "digital silence",
        "bad/short.wav": "shorter than one training crop",
    }
    return good, bad


def test_folder_with_good_and_bad_files(tmp_path, caplog):
    good, bad = make_messy_folder(tmp_path / "music")
    cfg = make_cfg(crop_seconds=0.5)
    cfg["data"].update(source="folder", folder=str(tmp_path / "music"))
    fetch.run(cfg, tmp_path / "data" / "raw")
    with caplog.at_level(logging.INFO, logger="acoustic_mlm"):
        prepare.run(cfg, tmp_path / "data" / "raw", tmp_path / "data" / "prepared")
    corpus = load_prepared(tmp_path / "data" / "prepared")
    manifest = corpus.manifest
    assert sorted(manifest["path"]) == sorted(good)
    for _, row in manifest.iterrows():
        assert (row.orig_sample_rate, row.orig_channels) == good[row.path], row.path
        assert row.num_samples == 75 * encodec.HOP or row.path.endswith(".mp3"), row  # 1 s = 75 frames
        assert abs(row.duration_s - 1.0) < 0.06, row
    assert all(np.isfinite(corpus.audio(k)).all() for k in corpus.shards)

    rejects = pd.read_csv(tmp_path / "data" / "prepared" / "rejects.csv", keep_default_na=False)
    assert list(rejects.columns) == ["path", "reason"]
    got = dict(zip(rejects["path"], rejects["reason"]))
    assert sorted(got) == sorted(bad)
    for path, kind in bad.items():
        assert prepare.reason_kind(got[path]) in ((kind,) if isinstance(kind, str) else kind), (path, got[path])
        assert "\n" not in got[path]
    summary = json.loads((tmp_path / "data" / "prepared" / "prepare.json").read_text())
    assert (summary["kept"], summary["rejected"]) == (len(good), len(bad))
    assert sum(summary["rejected_by_reason"].values()) == len(bad)
    assert f"kept {len(good)} files, rejected {len(bad)}" in caplog.text


def test_odd_sample_rate_is_resampled_quickly_and_nearly_exactly(tmp_path):
    x = sine(441.0, 2.0, 44101)
    (tmp_path / "raw").mkdir()
    sf.write(tmp_path / "raw" / "a.wav", x, 44101)
    sf.write(tmp_path / "raw" / "b.wav", x, 44101)
    prepare.run(make_cfg(), tmp_path / "raw", tmp_path / "prepared")
    corpus = load_prepared(tmp_path / "prepared")
    assert corpus.manifest["orig_sample_rate"].tolist() == [44101, 44101]
    y = np.asarray(corpus.clip(0), dtype=np.float64)
    peak_hz = np.fft.rfftfreq(len(y), 1 / SR)[np.argmax(np.abs(np.fft.rfft(y * np.hanning(len(y)))))]
    assert abs(peak_hz - 441.0) < 1.0


def test_every_path_is_in_the_manifest_or_the_rejects(tmp_path):
    """Hidden files, odd names, links, FIFOs, devices, non-audio and unsupported formats: each path
    lands in exactly one of manifest.csv and rejects.csv; audio is decoded by content, not by name."""
    raw = tmp_path / "raw"
    (raw / ".trash").mkdir(parents=True)
    (raw / "sub").mkdir()
    for name in ("a.flac", "b.flac", ".trash/c.wav", "._a.wav", ".DS_Store"):
        sf.write(raw / name, sine(440, 0.5, SR), SR, format="FLAC" if name.endswith(".flac") else "WAV")
    sf.write(raw / "take.dat", sine(330, 0.5, SR), SR, format="AIFF")  # AIFF under an odd name
    sf.write(raw / "sub" / "voice.bin", sine(220, 0.5, SR), SR, format="OGG", subtype="OPUS")
    sf.write(raw / "song.aiff", sine(550, 0.5, SR), SR, format="AIFF")
    (raw / "track.m4a").write_bytes(b"\x00\x00\x00\x20ftypM4A " + bytes(64))
    (raw / "notes.txt").write_text("liner notes\n")
    (raw / "cover.jpg").write_bytes(b"\xff\xd8\xff\xe0 not audio")
    (raw / "gone.flac").symlink_to(raw / "nowhere.flac")
    (raw / "loop.wav").symlink_to(raw / "loop.wav")
    (raw / "up").symlink_to(raw / "sub")  # a link to a folder is not followed
    (raw / "null.wav").symlink_to("/dev/null")
    (raw / "folder.wav").mkdir()  # a folder with an audio name is a folder
    (raw / ".snakemake_timestamp").write_text("")  # Snakemake's mark on a folder output: not a file of the corpus
    os.mkfifo(raw / "pipe.wav")  # never opened: must not block
    (raw / os.fsdecode(b"bad\xff.wav")).write_bytes((raw / "a.flac").read_bytes())  # a good file, a bad name
    prepare.run(make_cfg(), raw, tmp_path / "prepared")
    manifest = load_prepared(tmp_path / "prepared").manifest
    assert manifest["path"].tolist() == ["a.flac", "b.flac", "song.aiff", "sub/voice.bin", "take.dat"]
    assert manifest["clip_id"].tolist() == ["a", "b", "song", "sub/voice.bin", "take.dat"]
    rejects = pd.read_csv(tmp_path / "prepared" / "rejects.csv", keep_default_na=False)
    assert dict(zip(rejects["path"], rejects["reason"])) == {
        "._a.wav": "hidden file or folder", ".DS_Store": "hidden file or folder",
        ".trash/c.wav": "hidden file or folder",
        "bad\\xff.wav": "file name is not valid UTF-8 (rename the file to include it)",
        "cover.jpg": "not audio (libsndfile does not recognise its content)",
        "gone.flac": "broken symbolic link",
        "loop.wav": "symbolic link loop",
        "notes.txt": "not audio (libsndfile does not recognise its content)",
        "null.wav": "not a regular file (character device)",
        "pipe.wav": "not a regular file (FIFO)",
        "track.m4a": "unsupported audio format (.m4a): convert it to FLAC, WAV, Ogg or MP3",
        "up": "symbolic link to a folder (not followed)",
    }
    summary = json.loads((tmp_path / "prepared" / "prepare.json").read_text())
    assert (summary["kept"], summary["rejected"]) == (5, 12)


def test_files_fetch_did_not_take_are_in_the_rejects(tmp_path):
    """A folder source: what fetch leaves behind (SOURCE.json's `skipped`) reaches rejects.csv."""
    src = tmp_path / "music"
    src.mkdir()
    for name in ("a.flac", "b.flac"):
        sf.write(src / name, sine(440, 0.5, SR), SR)
    sf.write(src / "c.snd.dat", sine(440, 0.5, SR), SR, format="AIFF")
    (src / "track.m4a").write_bytes(b"\x00\x00\x00\x20ftypM4A " + bytes(64))
    (src / "cover.jpg").write_bytes(b"\xff\xd8\xff\xe0 not audio")
    (src / "gone.wav").symlink_to(src / "nowhere.wav")
    os.mkfifo(src / "pipe.flac")
    (src / os.fsdecode(b"bad\xff.wav")).write_bytes((src / "a.flac").read_bytes())
    cfg = make_cfg()
    cfg["data"].update(source="folder", folder=str(src))
    fetch.run(cfg, tmp_path / "raw")
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["SOURCE.json", "a.flac", "b.flac", "c.snd.dat"]
    prepare.run(cfg, tmp_path / "raw", tmp_path / "prepared")
    manifest = load_prepared(tmp_path / "prepared").manifest
    rejects = pd.read_csv(tmp_path / "prepared" / "rejects.csv", keep_default_na=False)
    assert manifest["path"].tolist() == ["a.flac", "b.flac", "c.snd.dat"]
    assert sorted(rejects["path"]) == ["bad\\xff.wav", "cover.jpg", "gone.wav", "pipe.flac", "track.m4a"]
    assert rejects.set_index("path").loc["track.m4a", "reason"].startswith("unsupported audio format (.m4a)")


def test_only_bad_files_is_a_one_line_error(tmp_path):
    _, bad = make_messy_folder(tmp_path / "music")
    shutil.rmtree(tmp_path / "music" / "good")
    with pytest.raises(UserError, match=rf"^prepare: no usable audio: all {len(bad)} files rejected \(") as err:
        prepare.run(make_cfg(crop_seconds=0.5), tmp_path / "music", tmp_path / "prepared")
    assert "\n" not in str(err.value) and "digital silence" in str(err.value)
    assert not (tmp_path / "prepared").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_one_usable_file_cannot_be_split(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    sf.write(raw / "a.wav", sine(440, 0.5, SR), SR)
    (raw / "b.wav").write_bytes(b"")
    with pytest.raises(UserError, match="1 usable clip"):
        prepare.run(make_cfg(), raw, tmp_path / "prepared")


def test_npy_writer_matches_np_save(tmp_path):
    clips = [np.random.default_rng(i).standard_normal(n).astype(np.float32) for i, n in enumerate((5, 0, 1000, 17))]
    with prepare.NpyWriter(tmp_path / "w.npy") as w:
        offsets = [w.append(c) for c in clips]
    np.save(tmp_path / "s.npy", np.concatenate(clips))
    assert (tmp_path / "w.npy").read_bytes() == (tmp_path / "s.npy").read_bytes()
    assert offsets == [0, 5, 5, 1005]


def test_missing_raw_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(UserError, match="run fetch first"):
        prepare.run(make_cfg(), tmp_path / "nope", tmp_path / "prepared")


def test_a_corpus_too_small_to_calibrate_on_is_refused_with_the_minutes_needed(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(4):  # 4 clips of 3 s (225 frames): the train split holds under 1024 frames (13.65 s)
        sf.write(raw / f"c{i}.wav", sine(300 + 50 * i, 3.0, SR), SR)
    cfg = make_cfg(valid_fraction=0.25)
    cfg["tokenizer"] = {"mode": "calibrated", "calibration_frames": 4096}
    with pytest.raises(UserError) as err:
        prepare.run(cfg, raw, tmp_path / "prepared")
    msg = str(err.value)
    train_frames = int(msg.split("holds ")[1].split(" ")[0])
    assert train_frames in (675, 450)  # 3 or 2 train clips of 225 frames
    need = (1024 - train_frames) / 75 / 60 / 0.75
    assert msg == (f"prepare: the train split holds {train_frames} EnCodec frames ({train_frames / 75 / 60:.2f} min); "
                   f"the calibrated tokenizer needs at least 1024 (0.23 min of train audio, about 0.30 min in all "
                   f"with data.valid_fraction 0.25): add at least {need:.2f} min of audio, or set tokenizer.mode: "
                   "pretrained")
    assert not (tmp_path / "prepared").exists()
    cfg["tokenizer"]["mode"] = "pretrained"  # EnCodec's own codebooks need no fit: the same corpus is fine
    prepare.run(cfg, raw, tmp_path / "prepared")
    assert len(load_prepared(tmp_path / "prepared").manifest) == 4
    # Back to calibrated: prepare does not rerun on the mode alone, so the fit refuses the same way
    smoke = Path(__file__).resolve().parents[2] / "config" / "smoke.yaml"
    cfg["tokenizer"] = {**C.load(smoke)["tokenizer"], "mode": "calibrated"}
    with pytest.raises(UserError) as again:
        tokenizer.fit(cfg, tmp_path / "prepared", tmp_path / "codes")
    assert str(again.value) == msg.replace("prepare: ", f"{tmp_path / 'prepared' / 'manifest.csv'}: ", 1)
    assert not (tmp_path / "codes" / tokenizer.MODEL_DIR).exists()
