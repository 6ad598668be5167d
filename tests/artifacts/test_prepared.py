"""The prepared corpus's files: shard folders' names, the plan, a shard's audio written clip by clip
and its tables, the manifest written and read back with load_prepared's checks (a manifest that does
not match the audio, a shard's audio missing: one line naming the file)."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil

import numpy as np
import pandas as pd
import pytest
from helpers import read_refused, real_audio_dir, real_audio_missing

from acoustic_mlm import encodec
from acoustic_mlm.artifacts.prepared import (
    AUDIO,
    CLIPS,
    MANIFEST,
    MANIFEST_COLUMNS,
    PLAN,
    PLAN_COLUMNS,
    RECORD,
    REJECTS,
    SHARD_RECORD,
    AudioWriter,
    as_float,
    load_prepared,
    read_audio,
    read_plan,
    read_record,
    read_shard_record,
    read_shard_tables,
    shard_name,
    shard_problem,
    storage_gain,
    to_stored,
    unstored,
    write_manifest,
    write_plan,
    write_record,
    write_shard_record,
    write_shard_tables,
)
from acoustic_mlm.errors import UserError


def test_shard_name_is_five_digits():
    assert [shard_name(k) for k in (0, 1, 12345)] == ["shard-00000", "shard-00001", "shard-12345"]
    assert shard_name(3.0) == shard_name(3)  # a shard read from a frame may be a float


def test_the_plan_written_reads_back_and_a_bad_plan_is_named(tmp_path):
    plan = pd.DataFrame(
        {
            "path": ["a.wav", "b.txt", "c.wav"],
            "clip_id": ["a", "b.txt", "c"],
            "shard": [0, 0, 1],
            "skip": ["", "not audio", ""],
        }
    )
    write_plan(tmp_path, plan[["shard", "path", "skip", "clip_id"]])  # written in the plan's own column order
    assert (tmp_path / PLAN).read_text().splitlines()[0] == ",".join(PLAN_COLUMNS)
    back = read_plan(tmp_path)
    assert list(back.columns) == list(PLAN_COLUMNS) and back["shard"].tolist() == [0, 0, 1]
    assert back["skip"].tolist() == ["", "not audio", ""]
    with pytest.raises(UserError, match=r"shards\.csv: not found \(run `amlm prepare --plan` first\)"):
        read_plan(tmp_path / "none")
    write_plan(tmp_path, plan.assign(shard=[0, -1, 1]))
    with pytest.raises(UserError, match=r"shards\.csv: a negative shard; rerun the prepare --plan stage") as err:
        read_plan(tmp_path)
    assert "\n" not in str(err.value)


def test_the_audio_writer_matches_np_save(tmp_path):
    clips = [np.random.default_rng(i).standard_normal(n).astype(np.float32) for i, n in enumerate((5, 0, 1000, 17))]
    with AudioWriter(tmp_path / "w.npy") as w:
        offsets = [w.append(c) for c in clips]
    np.save(tmp_path / "s.npy", np.concatenate(clips))
    assert (tmp_path / "w.npy").read_bytes() == (tmp_path / "s.npy").read_bytes()
    assert offsets == [0, 5, 5, 1005]
    assert np.array_equal(read_audio(tmp_path / "w.npy"), np.concatenate(clips))
    np.save(tmp_path / "two.npy", np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(UserError, match=r"two\.npy: expected a 1-D float32 or int16 array, got float32 \(2, 3\)"):
        read_audio(tmp_path / "two.npy")
    np.save(tmp_path / "f64.npy", np.zeros(3))
    with pytest.raises(UserError, match=r"f64\.npy: expected a 1-D float32 or int16 array, got float64"):
        read_audio(tmp_path / "f64.npy")


def test_int16_audio_is_np_save_of_the_rounded_pcm_and_reads_back_within_half_a_step(tmp_path):
    clips = [np.array([0.0, 0.5, -0.5, 32767 / 32768, -1.0, 0.25, 3e-5], dtype=np.float32), np.linspace(-0.9, 0.9, 999)]
    with AudioWriter(tmp_path / "w.npy", "int16") as w:
        offsets = [w.append(c) for c in clips]
        assert w.last_gain == 1.0  # within full scale: stored as it is
    pcm = np.concatenate([to_stored(c, "int16") for c in clips])
    assert pcm[:7].tolist() == [0, 16384, -16384, 32767, -32768, 8192, 1]  # rounded to int16 steps
    np.save(tmp_path / "s.npy", pcm)
    assert (tmp_path / "w.npy").read_bytes() == (tmp_path / "s.npy").read_bytes() and offsets == [0, 7]
    stored = read_audio(tmp_path / "w.npy")
    assert stored.dtype == np.int16 and (tmp_path / "w.npy").stat().st_size == 128 + 2 * 1006  # 2 bytes per sample
    back = as_float(stored)
    assert back.dtype == np.float32 and back[1] == 0.5 and back[4] == -1.0 and back[5] == 0.25
    assert np.abs(back[7:] - clips[1]).max() <= 0.5 / 32768 + 1e-9
    f = np.arange(4, dtype=np.float32)
    assert as_float(f) is f  # float32 is read as it is stored: no copy, the same values
    with pytest.raises(UserError, match="data.sample_format: 'int8' is not one of float32, int16"):
        AudioWriter(tmp_path / "x.npy", "int8")


def test_a_shards_tables_read_back_and_a_missing_file_names_the_shard_to_rerun(tmp_path):
    rows = [
        dict(
            clip_id="a",
            path="a.wav",
            offset=0,
            num_samples=640,
            num_frames=2,
            orig_sample_rate=44100,
            orig_channels=2,
            duration_s=640 / 24000,
        )
    ]
    write_shard_tables(tmp_path, rows, [("b.wav", "empty")])
    with pytest.raises(UserError, match=r"audio\.npy: not found \(run `amlm prepare --shard 3` first\)"):
        read_shard_tables(tmp_path, 3)
    np.save(tmp_path / AUDIO, np.zeros(640, dtype=np.float32))
    clips, rejects = read_shard_tables(tmp_path, 3)
    assert clips["num_samples"].tolist() == [640] and clips["orig_channels"].dtype == np.int64
    assert rejects.values.tolist() == [["b.wav", "empty"]]
    (tmp_path / REJECTS).write_text("path,reason\nb.wav")
    with pytest.raises(UserError, match="cut short.*rerun the prepare --shard 3 stage"):
        read_shard_tables(tmp_path, 3)
    (tmp_path / CLIPS).unlink()
    with pytest.raises(UserError, match=r"clips\.csv: not found"):
        read_shard_tables(tmp_path, 3)


def test_the_manifest_written_loads_with_its_audio(data_dirs, tmp_path):
    prepared, _ = data_dirs
    copy = tmp_path / "prepared"
    shutil.copytree(prepared, copy)
    manifest = pd.read_csv(prepared / MANIFEST, keep_default_na=False)
    write_manifest(copy, manifest[list(reversed(MANIFEST_COLUMNS))])  # written in MANIFEST_COLUMNS' order
    assert (copy / MANIFEST).read_bytes() == (prepared / MANIFEST).read_bytes()
    corpus = load_prepared(copy)
    assert corpus.shards == [0, 1] and corpus.audio_path(1) == copy / shard_name(1) / AUDIO
    row = corpus.manifest.iloc[4]
    assert np.array_equal(corpus.clip(4), corpus.audio(1)[row["offset"] : row["offset"] + row["num_samples"]])
    again = pickle.loads(pickle.dumps(corpus))  # data-loader workers: no memory map is pickled
    assert again._audio == {} and np.array_equal(again.clip(4), corpus.clip(4))


def test_load_prepared_detects_a_mismatch(data_dirs, tmp_path):
    prepared, _ = data_dirs
    bad = tmp_path / "bad"
    shutil.copytree(prepared, bad)
    audio = np.load(bad / "shard-00001" / "audio.npy")
    np.save(bad / "shard-00001" / "audio.npy", audio[: -encodec.HOP])
    with pytest.raises(UserError, match=r"clip 'c5' \(row 7\): offset \+ num_samples exceeds its shard's audio"):
        load_prepared(bad)
    shutil.rmtree(bad / "shard-00001")
    with pytest.raises(UserError, match=r"shard-00001/audio\.npy: not found"):
        load_prepared(bad)
    (bad / MANIFEST).unlink()
    with pytest.raises(UserError, match=r"manifest\.csv: not found \(run the prepare stage first\)"):
        load_prepared(bad)


def test_the_shard_and_corpus_records_read_back_and_damage_is_one_line(tmp_path):
    shard = {"shard": 0, "files": 4, "kept": 3, "rejected": 1, "samples": 3}
    np.save(tmp_path / "audio.npy", np.zeros(3, np.int16))  # the record is written after the audio, its sha256 read
    write_shard_record(tmp_path, shard)
    path = tmp_path / SHARD_RECORD
    shard["audio_sha256"] = hashlib.sha256((tmp_path / "audio.npy").read_bytes()).hexdigest()
    assert path.read_text() == json.dumps(shard, indent=2, sort_keys=True) + "\n"  # keys sorted, as before
    assert read_shard_record(path) == shard
    assert shard_problem(tmp_path) is None
    np.save(tmp_path / "audio.npy", np.zeros(1, np.int16))
    assert shard_problem(tmp_path) == "its audio.npy holds 1 samples where shard.json records 3"
    np.save(tmp_path / "audio.npy", np.ones(3, np.int16))
    assert shard_problem(tmp_path) == "its audio.npy is not the audio shard.json records (sha256 differs)"
    (tmp_path / "audio.npy").write_bytes(b"\x93NUMPY")
    assert shard_problem(tmp_path).startswith("its audio.npy is not a readable .npy array")
    with pytest.raises(ValueError, match="shard.json's keys"):
        write_shard_record(tmp_path, {k: v for k, v in shard.items() if k != "audio_sha256"} | {"extra": 1})
    path.write_text(json.dumps({**shard, "kept": 2.5}))
    read_refused(lambda: read_shard_record(path), path, "'kept' is 2.5, not int", "prepare")
    path.write_text('{"shard": 0, "files": 4')
    read_refused(lambda: read_shard_record(path), path, "not valid JSON")

    record = {
        "sample_rate": 24000,
        "hop": 320,
        "shards": 3,
        "shard_files": 4,
        "clips": {"train": 10, "valid": 2},
        "seconds": {"train": 60.0, "valid": 12.0},
        "total_samples": 1728000,
        "valid_fraction": 0.2,
        "split_seed": 0,
        "min_seconds": 0.49333333333333335,
        "kept": 12,
        "rejected": 0,
        "rejected_by_reason": {},
    }
    write_record(tmp_path, record)
    path = tmp_path / RECORD
    assert path.read_text() == json.dumps(record, indent=2, sort_keys=True) + "\n"
    assert read_record(path) == record
    path.write_text(json.dumps({k: v for k, v in record.items() if k != "hop"}))
    read_refused(lambda: read_record(path), path, "lacks 'hop'")
    path.write_text(json.dumps({**record, "clips": {"train": 10}}))
    read_refused(lambda: read_record(path), path, "'clips' must hold a number per split")
    path.write_text(json.dumps({**record, "seconds": {"train": 60.0, "valid": "12"}}))
    read_refused(lambda: read_record(path), path, "'seconds' must hold a number per split")


@pytest.mark.parametrize("peak", [1.0 + 1e-4, 1.5, 5.0, 1000.0])
def test_an_int16_clip_above_full_scale_is_stored_with_a_gain_never_clipped(tmp_path, peak):
    """A float clip whose samples exceed full scale (78 % of a peak-5 WAV's samples were clipped on the
    rail before): stored times its gain, read back divided by it, within half a step of its own range."""
    rng = np.random.default_rng(0)
    x = (peak * np.tanh(rng.standard_normal(24000))).astype(np.float32)
    x[100] = peak  # the peak itself
    gain = storage_gain(x, "int16")
    assert 0 < gain < 1 and np.float32(gain) == gain
    with pytest.raises(ValueError, match="does not fit int16"):  # never clipped: refused without the gain
        to_stored(x, "int16")
    pcm = to_stored(x, "int16", gain)
    assert pcm.max() == 32767 and pcm.min() > -32768  # the peak at the top step
    back = unstored(as_float(pcm), gain)
    assert np.abs(back - x).max() <= peak / 65534 + np.spacing(np.float32(peak))  # half a step of the clip's own range
    assert storage_gain(x, "float32") == 1.0 and storage_gain(np.zeros(5, np.float32), "int16") == 1.0
    with AudioWriter(tmp_path / "w.npy", "int16") as w:
        w.append(x)
        assert w.last_gain == gain
    assert np.array_equal(read_audio(tmp_path / "w.npy"), pcm)


def test_a_manifests_gain_is_applied_by_the_corpus_and_checked(tmp_path):
    x = np.linspace(-3, 3, 640).astype(np.float32)
    g = storage_gain(x, "int16")
    (tmp_path / "shard-00000").mkdir()
    with AudioWriter(tmp_path / "shard-00000" / AUDIO, "int16") as w:
        w.append(x)
    row = dict(clip_id="a", path="a.wav", shard=0, split="train", offset=0, num_samples=640, num_frames=2)
    row.update(orig_sample_rate=24000, orig_channels=1, duration_s=640 / 24000, gain=g)
    write_manifest(tmp_path, pd.DataFrame([row]))
    clip = load_prepared(tmp_path).clip(0)
    assert np.abs(clip - x).max() <= 3 / 65534 + np.spacing(np.float32(3)) and np.abs(clip).max() > 2.99
    manifest = pd.read_csv(tmp_path / MANIFEST)
    manifest.loc[0, "gain"] = 1.5
    manifest.to_csv(tmp_path / MANIFEST, index=False)
    with pytest.raises(UserError, match=r"clip 'a' \(row 2\): gain 1.5 is not in \(0, 1\]"):
        load_prepared(tmp_path)
    manifest.drop(columns="gain").to_csv(tmp_path / MANIFEST, index=False)
    assert (load_prepared(tmp_path).gains == 1.0).all()  # a corpus prepared before the gain: none had one


@pytest.mark.skipif(real_audio_missing() is not None, reason=str(real_audio_missing()))
@pytest.mark.parametrize("peak", [1.5, 5.0])
def test_real_recordings_above_full_scale_are_stored_within_the_stated_bound(peak):
    """librosa's 14 recordings, decoded at 24 kHz as prepare does and brought to a peak above full
    scale (what a loud float master or MP3 overshoot gives): stored int16 with their gain, every
    sample comes back within peak / 65534 (measured: the bound itself; SNR at least 72 dB), where
    clipping had put up to 99.8 % of a recording's samples on the rail (docs/recipe.md)."""
    from acoustic_mlm.data.decode import decode

    files = sorted(real_audio_dir().glob("*.ogg"))
    assert len(files) >= 10
    for path in files:
        x, _, _ = decode(path, encodec.SAMPLE_RATE, encodec.HOP)
        x = (x * (peak / np.abs(x).max())).astype(np.float32)
        gain = storage_gain(x, "int16")
        assert gain < 1, path.name
        back = unstored(as_float(to_stored(x, "int16", gain)), gain).astype(np.float64)
        error = back - x
        assert np.abs(error).max() <= peak / 65534 + np.spacing(np.float32(peak)), path.name
        snr = 10 * np.log10(np.mean(x.astype(np.float64) ** 2) / np.mean(error**2))
        assert snr > 56, (path.name, snr)  # the quietest (pibble, 14 dB crest over its RMS) measures 72.5 dB


def test_a_corpus_stored_otherwise_than_data_sample_format_is_refused(tmp_path):
    (tmp_path / "shard-00000").mkdir()
    with AudioWriter(tmp_path / "shard-00000" / AUDIO, "float32") as w:
        w.append(np.zeros(640, np.float32))
    row = dict(clip_id="a", path="a.wav", shard=0, split="train", offset=0, num_samples=640, num_frames=2)
    write_manifest(tmp_path, pd.DataFrame([{**row, "orig_sample_rate": 24000, "orig_channels": 1, "duration_s": 0.03}]))
    assert load_prepared(tmp_path, "float32").shards == [0]
    with pytest.raises(UserError) as refused:
        load_prepared(tmp_path, "int16")
    assert str(refused.value).startswith(
        f"{tmp_path / 'shard-00000' / AUDIO}: float32 samples, but the configuration says data.sample_format: int16"
    )
