"""Tokenize stage: calibrated EnCodec codes, alignment with audio.npy, the steps run as separate jobs,
pretrained mode, the fitted loudness, the files table, errors."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import make_config
from tokenizer_helpers import (
    CALIB_FRAMES,
    CALIB_ITERS,
    HOP,
    LOUDNESS,
    SR,
    clip_codes,
    make_prepared,
    saved_checkpoint,
    shard_codes,
    tok_cfg,
)

from acoustic_mlm.tokenizer import codec, loudness, stage
from acoustic_mlm.tokenizer.codec import TokenizerError
from acoustic_mlm.tokenizer.encode import EncodeSettings, encode_clips

MIN_DISTINCT = 200  # measured on this corpus: 1024, 613, 460, 405, 350, 321, 316, 314
MIN_ENTROPY_BITS = 3.0  # measured: 7.7, 6.2, 5.4, 5.2, 4.7, 4.7, 4.8, 4.5


# ----------------------------------------------------------------------------- the calibrated stage


def test_calibrated_stage_outputs(calibrated, prepared):
    manifest = pd.read_csv(prepared / "manifest.csv")
    codes = shard_codes(calibrated)
    assert len(codes) == 3  # 14 clips in shards of 5
    for k, c in enumerate(codes):
        audio = np.load(prepared / f"shard-{k:05d}" / "audio.npy")
        assert c.dtype == np.int16 and c.shape == (8, len(audio) // HOP)
        assert c.min() >= 0 and c.max() < 1024  # every column belongs to a clip here
        enc = json.loads((calibrated / f"shard-{k:05d}" / "encode.json").read_text())
        assert enc["clips"] == (manifest["shard"] == k).sum() and enc["x_real_time"] > 0
    meta = json.loads((calibrated / "tokenizer.json").read_text())
    assert meta["mode"] == "calibrated" and meta["n_codebooks"] == 8 and meta["frame_rate"] == 75
    assert meta["calibration_frames"] == CALIB_FRAMES and meta["calibration_iters"] == CALIB_ITERS
    assert (meta["shards"], meta["clips"]) == (3, len(manifest))
    assert meta["audio_seconds"] == pytest.approx(manifest["num_samples"].sum() / SR)
    every = np.concatenate(codes, axis=1)
    assert meta["distinct_codes"] == [len(np.unique(c)) for c in every]
    assert meta["max_code"] == [int(c.max()) for c in every]
    assert min(meta["distinct_codes"]) > MIN_DISTINCT, meta["distinct_codes"]
    assert all(MIN_ENTROPY_BITS < h <= 10.0 for h in meta["unigram_entropy_bits"]), meta["unigram_entropy_bits"]
    p = np.bincount(every[0], minlength=1024) / every.shape[1]
    assert meta["unigram_entropy_bits"][0] == pytest.approx(-(p[p > 0] * np.log2(p[p > 0])).sum(), abs=1e-4)
    assert meta["encode_seconds"] > 0 and meta["real_time_factor"] > 0
    # config.yaml's
    assert (meta["loudness"]["method"], meta["loudness"]["target"]) == (LOUDNESS["method"], LOUDNESS["target"])
    assert meta["calibration_frames_per_code"] == round(CALIB_FRAMES / 1024, 2)
    shares = [np.bincount(c, minlength=1024).max() / len(c) for c in every]
    assert meta["top_code_share"] == pytest.approx(shares, abs=1e-5)
    files = pd.read_csv(calibrated / "files.csv", keep_default_na=False)
    assert sorted(files["clip_id"]) == sorted(manifest["clip_id"]) and files["gain_db"].notna().all()
    for row in files.itertuples():  # each file's codebook-0 statistics, from its own columns
        clip = manifest.set_index("clip_id").loc[row.clip_id]
        c = codes[clip["shard"]][0, clip["offset"] // HOP : clip["offset"] // HOP + clip["num_frames"]]
        assert row.cb0_codes_used == len(np.unique(c))
        assert row.cb0_top_code_share == pytest.approx(np.bincount(c).max() / len(c), abs=1e-5)
        if LOUDNESS["method"] == "lufs":  # one gain per clip, to the target loudness
            assert row.lufs + row.gain_db == pytest.approx(LOUDNESS["target"], abs=0.02)
        assert row.gain_db != 0.0
    assert sorted(p.name for p in calibrated.iterdir()) == [
        "files.csv",
        "model",
        "shard-00000",
        "shard-00001",
        "shard-00002",
        "tokenizer.json",
    ]
    assert sorted(p.name for p in (calibrated / "model").iterdir()) == ["fit.json", "tokenizer.pt"]


@pytest.mark.slow
def test_codes_aligned_and_equal_to_encodec_encode(calibrated, prepared):
    """tokenizer.pt rebuilds the exact tokenizer; EnCodec's own encode gives the written codes."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    written = clip_codes(prepared, calibrated)
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    torch.load(calibrated / "model" / "tokenizer.pt", weights_only=True)  # loads without unpickling code
    for row, codes in zip(manifest.itertuples(), written):
        audio = np.load(prepared / f"shard-{row.shard:05d}" / "audio.npy", mmap_mode="r")
        clip = np.asarray(audio[row.offset : row.offset + row.num_samples])
        gain = loudness.frame_gains(clip, LOUDNESS["method"], LOUDNESS["target"])  # what the tokenizer saw
        assert not np.all(gain == 1.0)
        wav = torch.from_numpy(clip * np.repeat(gain, HOP))[None, None]
        with torch.no_grad():
            own = model.encode(wav)[0][0][0].numpy()  # (K, T)
        assert own.shape == (8, row.num_samples // HOP)
        np.testing.assert_array_equal(codes, own)


@pytest.mark.slow
def test_sharded_steps_run_separately_match_the_whole_stage(calibrated, prepared, tmp_path):
    """Snakemake runs fit, each shard and merge as separate jobs: the same files as `run`."""
    out, cfg = tmp_path / "steps", tok_cfg()
    stage.fit(make_config(cfg), prepared, out, threads=2)
    with pytest.raises(TokenizerError, match=r"shard-00000/encode\.json: not found \(run `amlm tokenize --shard 0`"):
        stage.merge(make_config(cfg), prepared, out)
    for k in (2, 0, 1):
        stage.encode_shard(make_config(cfg), prepared, out, k, threads=2)
    with pytest.raises(TokenizerError, match="no clips in shard 3"):
        stage.encode_shard(make_config(cfg), prepared, out, 3)
    stage.merge(make_config(cfg), prepared, out)
    for name in ("model/tokenizer.pt", "shard-00000/codes.npy", "shard-00002/codes.npy"):
        assert (out / name).read_bytes() == (calibrated / name).read_bytes(), name
    drop = (
        "encode_seconds",
        "real_time_factor",
        "x_real_time",
        "calibration_encoder_seconds",
        "calibration_kmeans_seconds",
        "calibration_seconds",
    )
    a, b = (json.loads((d / "tokenizer.json").read_text()) for d in (out, calibrated))
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


def test_a_planned_shard_without_usable_clips_gets_empty_codes(calibrated, prepared, tmp_path):
    """Snakemake asks for every shard of the plan; one whose files were all rejected is encoded too."""
    prep, out = tmp_path / "prepared", tmp_path / "codes"
    shutil.copytree(prepared, prep)
    shutil.copytree(calibrated, out)
    (prep / "shard-00003").mkdir()
    np.save(prep / "shard-00003" / "audio.npy", np.zeros(0, np.float32))
    pd.DataFrame({"path": ["bad.wav"], "clip_id": ["bad"], "shard": [3], "skip": [""]}).to_csv(
        prep / "shards.csv", index=False
    )
    stage.encode_shard(tok_cfg(), prep, out, 3)
    assert np.load(out / "shard-00003" / "codes.npy").shape == (8, 0)
    assert json.loads((out / "shard-00003" / "encode.json").read_text())["clips"] == 0
    with pytest.raises(TokenizerError, match="no clips in shard 4"):
        stage.encode_shard(tok_cfg(), prep, out, 4)


@pytest.mark.slow
def test_shard_layout_does_not_change_the_tokenizer_or_the_codes(calibrated, prepared, tmp_path):
    one = make_prepared(tmp_path / "one_shard", shard_clips=100)
    out = tmp_path / "codes"
    stage.run(tok_cfg(), one, out, threads=2)
    first, second = (torch.load(d / "model" / "tokenizer.pt", weights_only=True) for d in (calibrated, out))
    assert all(torch.equal(first[k], second[k]) for k in first)
    for a, b in zip(clip_codes(prepared, calibrated), clip_codes(one, out)):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- pretrained mode


@pytest.mark.slow
def test_pretrained_mode_reproduces_calibrated_codes(calibrated, prepared, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    path = saved_checkpoint(torch.load(calibrated / "model" / "tokenizer.pt", weights_only=True), ckpt)
    out = tmp_path / "pretrained"
    stage.run(tok_cfg(mode="pretrained", checkpoint=str(path)), prepared, out, threads=2)
    # Pretrained mode is EnCodec 24 kHz as released: no loudness normalisation, the raw clips' codes.
    manifest = pd.read_csv(prepared / "manifest.csv")
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    audio = np.load(prepared / "shard-00001" / "audio.npy", mmap_mode="r")
    raw = encode_clips(model, audio, manifest[manifest["shard"] == 1], EncodeSettings(batch_size=1))
    np.testing.assert_array_equal(shard_codes(out)[1], raw)
    # the calibrated mode's codes are of normalised audio
    assert (shard_codes(out)[1] != shard_codes(calibrated)[1]).mean() > 0.2
    meta = json.loads((out / "tokenizer.json").read_text())
    assert meta["loudness"]["method"] == "none"
    assert meta["mode"] == "pretrained" and meta["checkpoint"]["sha256"].startswith(path.stem.split("-")[1])
    assert meta["calibration_frames_requested"] is None
    assert not (out / "model" / "tokenizer.pt").exists()


# ----------------------------------------------------------------------------- the fitted loudness and the files table


def test_a_tokenizer_fitted_at_another_loudness_is_refused(calibrated, prepared, tmp_path):
    shutil.copytree(calibrated, tmp_path / "codes")
    other = "lufs" if LOUDNESS["method"] == "rms" else "rms"
    with pytest.raises(
        TokenizerError,
        match=rf"fit.json: fitted with loudness {LOUDNESS['method']} "
        rf"{LOUDNESS['target']}, the config asks for {other} -20.0 "
        r"\(tokenizer.loudness\); rerun `amlm tokenize --fit`",
    ):
        stage.encode_shard(tok_cfg(loudness=other, loudness_target=-20.0), prepared, tmp_path / "codes", 0)


def test_merge_reports_each_files_loudness_and_warns_once_about_a_crowded_code(data_dirs, tmp_path, caplog):
    prepared, codes_dir = data_dirs
    out = tmp_path / "codes"
    shutil.copytree(codes_dir, out)
    with caplog.at_level(logging.WARNING, logger="acoustic_mlm"):
        meta = stage.merge(tok_cfg(), prepared, out)  # batch_size 1
    every = np.concatenate([np.load(out / f"shard-{k:05d}" / "codes.npy") for k in range(2)], axis=1)
    shares = [np.bincount(c, minlength=1024).max() / len(c) for c in every]
    assert meta["top_code_share"] == pytest.approx(shares, abs=1e-5) and min(shares) > 0.10  # code 0: 16/136
    warnings_ = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    top0 = int(np.bincount(every[0]).argmax())
    assert len(warnings_) == 1, warnings_
    expected = f"one code holds more than 10% of a level's frames: level 0 code {top0} ({100 * shares[0]:.1f}%)"
    assert expected in warnings_[0]
    files = pd.read_csv(out / "files.csv", keep_default_na=False)
    assert files["clip_id"].tolist() == [f"c{i}" for i in range(6)]
    assert list(files.columns) == [
        "clip_id",
        "path",
        "split",
        "seconds",
        "rms_dbfs",
        "lufs",
        "gain_db",
        "cb0_codes_used",
        "cb0_entropy_bits",
        "cb0_top_code_share",
    ]
    c0 = every[0, :150]  # clip c0: the first 150 columns of shard 0
    p = np.bincount(c0) / len(c0)
    assert files.loc[0, "cb0_entropy_bits"] == pytest.approx(-(p[p > 0] * np.log2(p[p > 0])).sum(), abs=1e-4)
    assert files.loc[0, "cb0_codes_used"] == len(np.unique(c0))


# ----------------------------------------------------------------------------- input errors


@pytest.mark.parametrize(
    "breakage, needle",
    [
        ("no_audio", "audio.npy: not found"),
        ("no_manifest", "manifest.csv: not found"),
        ("int_audio", "audio.npy: expected a 1-D float32 or int16 array, got int32"),
        ("no_column", "manifest.csv: missing column(s) num_frames"),
        ("past_end", "manifest.csv: clip 'clip06' (row 8): offset + num_samples exceeds"),
        ("frames", "manifest.csv: clip 'clip01' (row 3): num_frames != num_samples // 320"),
        ("ragged", "manifest.csv: clip 'clip00' (row 2): num_samples is not a positive multiple of 320"),
        ("overlap", "manifest.csv: clip 'clip02' (row 4) overlaps another clip"),
        ("no_train", "manifest.csv: no train clips to calibrate on"),
    ],
)
def test_bad_inputs_fail_in_one_line_naming_the_file(breakage, needle, tmp_path):
    prep = make_prepared(tmp_path / "prep", seconds=[2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0])
    m = pd.read_csv(prep / "manifest.csv")
    if breakage == "no_audio":
        (prep / "shard-00000" / "audio.npy").unlink()
    elif breakage == "no_manifest":
        (prep / "manifest.csv").unlink()
    elif breakage == "int_audio":
        np.save(prep / "shard-00000" / "audio.npy", np.zeros(10, dtype=np.int32))
    elif breakage == "no_column":
        m.drop(columns="num_frames").to_csv(prep / "manifest.csv", index=False)
    elif breakage == "past_end":
        m.loc[6, "offset"] += HOP
    elif breakage == "frames":
        m.loc[1, "num_frames"] += 1
    elif breakage == "ragged":
        m.loc[0, "num_samples"] -= 1
    elif breakage == "overlap":
        m.loc[2, "offset"] -= HOP
    elif breakage == "no_train":
        m["split"] = "valid"
    if breakage in ("past_end", "frames", "ragged", "overlap", "no_train"):
        m.to_csv(prep / "manifest.csv", index=False)
    with pytest.raises(TokenizerError) as err:
        stage.run(tok_cfg(), prep, tmp_path / "out")
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert str(prep) in str(err.value)
    assert not (tmp_path / "out").exists()


def test_the_resume_key_covers_each_shards_audio_not_only_the_manifest(prepared, tmp_path):
    """Clips replaced by other sounds of the same names and lengths leave the manifest as it was; the
    key a resumed tokenize compares changes, so the killed run's model and codes are not taken."""
    from acoustic_mlm.artifacts.prepared import load_prepared

    copy = tmp_path / "prepared"
    shutil.copytree(prepared, copy)
    shards = load_prepared(copy).shards
    before = stage._resume_key(tok_cfg(), copy, shards)
    audio = copy / "shard-00000" / "audio.npy"
    samples = np.load(audio)
    np.save(audio, samples[::-1].copy())  # other sounds, same length and dtype
    after = stage._resume_key(tok_cfg(), copy, shards)
    assert (copy / "manifest.csv").read_bytes() == (prepared / "manifest.csv").read_bytes()
    assert after["manifest_sha256"] == before["manifest_sha256"]
    assert after["audio_sha256"]["shard-00000"] != before["audio_sha256"]["shard-00000"]
    assert after != before and sorted(after["audio_sha256"]) == [f"shard-{k:05d}" for k in shards]


@pytest.mark.parametrize(
    "key, value, named",
    [
        ("seed", 7, "tokenizer.seed 0"),
        ("calibration_iters", CALIB_ITERS + 1, f"tokenizer.calibration_iters {CALIB_ITERS}"),
        ("calibration_frames", CALIB_FRAMES * 2, f"tokenizer.calibration_frames {CALIB_FRAMES}"),
    ],
)
def test_shard_and_merge_refuse_a_model_fitted_under_other_settings(calibrated, prepared, tmp_path, key, value, named):
    out = tmp_path / "codes"
    shutil.copytree(calibrated / "model", out / "model")
    cfg = tok_cfg()
    other = dataclasses.replace(cfg, tokenizer=dataclasses.replace(cfg.tokenizer, **{key: value}))
    with pytest.raises(TokenizerError) as refused:
        stage.encode_shard(other, prepared, out, 0)
    message = str(refused.value)
    assert message.startswith(f"{out / 'model' / 'fit.json'}: fitted with {named}")
    assert "rerun `amlm tokenize --fit` with this configuration" in message
    with pytest.raises(TokenizerError, match="fitted with tokenizer"):
        stage.merge(other, prepared, out)
    assert not (out / "shard-00000").exists()


def test_a_corpus_of_another_sample_format_is_refused(prepared):
    assert stage.read_prepared(prepared, "float32").shards  # prepared as float32: taken
    with pytest.raises(TokenizerError, match=r"audio\.npy: float32 samples, but the configuration says "):
        stage.read_prepared(prepared, "int16")  # data.sample_format: int16 over that corpus


def test_the_clips_encoded_in_segments_are_counted_in_the_records(calibrated, prepared, tmp_path, caplog):
    """A clip longer than tokenizer.segment_seconds is encoded in segments (its codes are not the whole-file
    codes MERT encodes): each shard's encode.json counts them, tokenizer.json sums them and says so."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    seconds = manifest["num_frames"].to_numpy() / 75
    cut = float(np.median(seconds))  # half the clips longer than this
    cfg = dataclasses.replace(tok_cfg(), tokenizer=dataclasses.replace(tok_cfg().tokenizer, segment_seconds=cut))
    out = tmp_path / "codes"
    shutil.copytree(calibrated / "model", out / "model")
    for k in sorted(manifest["shard"].unique()):
        stage.encode_shard(make_config(cfg), prepared, out, int(k), threads=2)
        shard = manifest[manifest["shard"] == k]
        record = json.loads((out / f"shard-{int(k):05d}" / "encode.json").read_text())
        assert record["segmented_clips"] == int((shard["num_frames"] > round(cut * 75)).sum())
    with caplog.at_level(logging.WARNING, logger="acoustic_mlm"):
        stage.merge(make_config(cfg), prepared, out)
    total = int((manifest["num_frames"] > round(cut * 75)).sum())
    assert 0 < total < len(manifest)
    assert json.loads((out / "tokenizer.json").read_text())["segmented_clips"] == total
    assert f"{total} clip(s) longer than tokenizer.segment_seconds" in caplog.text
    whole = json.loads((calibrated / "tokenizer.json").read_text())
    assert whole["segmented_clips"] == 0  # the shipped settings segment none of these clips
