"""Fetch (synthetic) and prepare: 24 kHz mono, whole EnCodec frames, a stable split."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
from data_helpers import SR, make_cfg, make_messy_folder, sine
from helpers import make_config

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.artifacts.prepared import MANIFEST_COLUMNS, load_prepared
from acoustic_mlm.data import fetch, prepare
from acoustic_mlm.errors import UserError


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
    with pytest.raises(C.ConfigError, match=r"'data\.source'") as err:  # the mapping: the schema refuses it
        fetch.run(make_config(cfg), tmp_path / "raw")
    assert "\n" not in str(err.value)
    cfg["data"]["source"] = "synthetic"
    typed = C.from_mapping(cfg)  # a Config made otherwise: the stage refuses the source itself
    typed = replace(typed, data=replace(typed.data, source="cassette"))
    with pytest.raises(UserError, match=r"^data\.source: unknown source 'cassette'") as err:
        fetch.run(typed, tmp_path / "raw")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "raw").exists()


def test_prepared_audio_is_24khz_mono_in_whole_frames(prepared):
    _, root = prepared
    corpus = load_prepared(root / "prepared")
    manifest = corpus.manifest
    assert list(manifest.columns) == list(MANIFEST_COLUMNS)
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
    prepare.run(make_config(one), root / "raw", tmp_path / "one")
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
    todo = prepare.plan(make_config(cfg), root / "raw", out)
    for shard in sorted(todo["shard"].unique(), reverse=True):  # any order
        prepare.prepare_shard(make_config(cfg), root / "raw", out, shard)
    with pytest.raises(UserError, match=r"shards\.csv: no shard 7 \(the plan has shards 0-1\)"):
        prepare.prepare_shard(make_config(cfg), root / "raw", out, 7)
    prepare.merge(make_config(cfg), out)
    for name in (
        "manifest.csv",
        "rejects.csv",
        "prepare.json",
        "shards.csv",
        "shard-00000/audio.npy",
        "shard-00001/clips.csv",
    ):
        assert (out / name).read_bytes() == (root / "prepared" / name).read_bytes(), name


def test_merge_names_a_missing_shard(prepared, tmp_path):
    cfg, root = prepared
    out = tmp_path / "partial"
    prepare.plan(make_config(cfg), root / "raw", out)
    prepare.prepare_shard(make_config(cfg), root / "raw", out, 0)
    with pytest.raises(UserError, match=r"shard-00001/clips\.csv: not found \(run `amlm prepare --shard 1`"):
        prepare.merge(make_config(cfg), out)
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
    prepare.run(make_config(cfg), root / "raw", tmp_path / "again")
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
        prepare.run(make_config(make_cfg()), tmp_path / "raw", tmp_path / "prepared")
    assert str(tmp_path / "raw") in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "raw" / "notes.txt").write_text("not audio")  # a file, judged by content: not audio
    with pytest.raises(UserError, match=r"^prepare: no usable audio: all 1 files rejected \(1 not audio\)$"):
        prepare.run(make_config(make_cfg()), tmp_path / "raw", tmp_path / "prepared")
    assert not (tmp_path / "prepared").exists()


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
        prepare.run(make_config(make_cfg()), raw, tmp_path / "prepared")
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


# ------------------------------------------------------------------------------------------
# Every audio-named file ends in the manifest or in rejects.csv (each reason: test_decode.py)


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
    prepare.run(make_config(make_cfg()), raw, tmp_path / "prepared")
    manifest = load_prepared(tmp_path / "prepared").manifest
    assert manifest["path"].tolist() == ["a.flac", "b.flac", "song.aiff", "sub/voice.bin", "take.dat"]
    assert manifest["clip_id"].tolist() == ["a", "b", "song", "sub/voice.bin", "take.dat"]
    rejects = pd.read_csv(tmp_path / "prepared" / "rejects.csv", keep_default_na=False)
    assert dict(zip(rejects["path"], rejects["reason"])) == {
        "._a.wav": "hidden file or folder",
        ".DS_Store": "hidden file or folder",
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
    fetch.run(make_config(cfg), tmp_path / "raw")
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["SOURCE.json", "a.flac", "b.flac", "c.snd.dat"]
    prepare.run(make_config(cfg), tmp_path / "raw", tmp_path / "prepared")
    manifest = load_prepared(tmp_path / "prepared").manifest
    rejects = pd.read_csv(tmp_path / "prepared" / "rejects.csv", keep_default_na=False)
    assert manifest["path"].tolist() == ["a.flac", "b.flac", "c.snd.dat"]
    assert sorted(rejects["path"]) == ["bad\\xff.wav", "cover.jpg", "gone.wav", "pipe.flac", "track.m4a"]
    assert rejects.set_index("path").loc["track.m4a", "reason"].startswith("unsupported audio format (.m4a)")


def test_only_bad_files_is_a_one_line_error(tmp_path):
    _, bad = make_messy_folder(tmp_path / "music")
    shutil.rmtree(tmp_path / "music" / "good")
    with pytest.raises(UserError, match=rf"^prepare: no usable audio: all {len(bad)} files rejected \(") as err:
        prepare.run(make_config(make_cfg(crop_seconds=0.5)), tmp_path / "music", tmp_path / "prepared")
    assert "\n" not in str(err.value) and "digital silence" in str(err.value)
    assert not (tmp_path / "prepared").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_one_usable_file_cannot_be_split(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    sf.write(raw / "a.wav", sine(440, 0.5, SR), SR)
    (raw / "b.wav").write_bytes(b"")
    with pytest.raises(UserError, match="1 usable clip"):
        prepare.run(make_config(make_cfg()), raw, tmp_path / "prepared")


def test_missing_raw_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(UserError, match="run fetch first"):
        prepare.run(make_config(make_cfg()), tmp_path / "nope", tmp_path / "prepared")


def _killed_prepare(cfg, root, final) -> Path:
    """The temporary folder a prepare killed after its last shard left for `final`: a copy of the
    finished corpus's plan and shards with the inputs record the run wrote."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = final.parent / f".{final.name}.tmp-{int(dead.stdout)}-x"  # a process id that is gone
    left.mkdir(parents=True)
    shutil.copy(root / "prepared" / "shards.csv", left / "shards.csv")
    for shard in sorted((root / "prepared").glob("shard-*")):
        shutil.copytree(shard, left / shard.name)
    key = prepare._resume_key(make_config(cfg), root / "raw", left / "shards.csv")
    (left / "resume.json").write_text(json.dumps(key))
    return left


@pytest.mark.parametrize("damage", ["cut", "other_content"])
def test_a_resumed_prepare_checks_each_finished_shard_against_its_record(prepared, tmp_path, caplog, damage):
    """A killed run's shard whose audio.npy was cut to a third, or holds other samples, with its
    shard.json intact, is prepared again, never taken: the corpus equals an uninterrupted run's."""
    cfg, root = prepared
    final = tmp_path / "prepared"
    left = _killed_prepare(cfg, root, final)
    audio = left / "shard-00001" / "audio.npy"
    data = audio.read_bytes()
    if damage == "cut":
        audio.write_bytes(data[: len(data) // 3])
    else:
        header = len(data) - 2 * np.load(audio).size  # int16 or float32: flip the last sample's bytes
        audio.write_bytes(data[:-4] + bytes(b ^ 0xFF for b in data[-4:]))
        assert header > 0
    with caplog.at_level(logging.INFO, logger="acoustic_mlm"):
        prepare.run(make_config(cfg), root / "raw", final)
    why = "holds" if damage == "cut" else "sha256 differs"
    assert "prepare shard-00001: left by the killed earlier run but its audio.npy" in caplog.text
    assert why in caplog.text or "not a readable .npy" in caplog.text
    assert "prepare shard-00000: finished by the killed earlier run, checked against its record" in caplog.text
    for name in ("manifest.csv", "shard-00000/audio.npy", "shard-00001/audio.npy", "shard-00001/shard.json"):
        assert (final / name).read_bytes() == (root / "prepared" / name).read_bytes(), name


def test_a_shards_record_holds_its_audios_sha256(prepared):
    from acoustic_mlm.artifacts.prepared import read_shard_record, shard_problem
    from acoustic_mlm.utils import file_sha256

    _, root = prepared
    shard = root / "prepared" / "shard-00000"
    record = read_shard_record(shard / "shard.json")
    assert record["audio_sha256"] == file_sha256(shard / "audio.npy")
    assert record["samples"] == len(np.load(shard / "audio.npy")) and shard_problem(shard) is None


def test_a_loud_float_wav_prepared_as_int16_keeps_every_sample(tmp_path):
    """The issue's case: a float WAV of peak 5 (78 % of its samples above full scale) under
    data.sample_format int16 was clipped on the rail; it is now stored with its gain, recorded in the
    manifest, and read back within half a step of its own range. A clip within full scale keeps gain 1."""
    from data_helpers import preset

    raw = tmp_path / "raw"
    raw.mkdir()
    t = np.arange(48000) / 24000
    loud = (5.0 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    assert (np.abs(loud) > 1).mean() > 0.78
    sf.write(raw / "loud.wav", loud, 24000, subtype="FLOAT")
    sf.write(raw / "quiet.wav", loud / 10, 24000, subtype="FLOAT")
    sf.write(raw / "other.wav", loud / 20, 24000, subtype="FLOAT")
    cfg = preset(source="folder", folder=str(raw), sample_format="int16")
    prepare.run(make_config(cfg), raw, tmp_path / "prepared")
    corpus = load_prepared(tmp_path / "prepared")
    rows = {cid: i for i, cid in enumerate(corpus.manifest["clip_id"])}
    gains = dict(zip(corpus.manifest["clip_id"], corpus.manifest["gain"]))
    assert gains["quiet"] == 1.0 and gains["other"] == 1.0 and 0.19 < gains["loud"] < 0.2
    clip = corpus.clip(rows["loud"])
    assert corpus.audio(0).dtype == np.int16 and np.abs(clip).max() > 4.99
    assert np.abs(clip - loud[: len(clip)]).max() <= 5.0 / 65534 + np.spacing(np.float32(5.0))
