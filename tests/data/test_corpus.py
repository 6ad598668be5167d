"""The prepared corpus read back: load_prepared's checks, the shard plan (read_plan), shard folders'
names, and the refusal of a train split too small to calibrate the tokenizer on."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
from data_helpers import SR, make_cfg, sine

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.data import prepare
from acoustic_mlm.data.corpus import PLAN, PLAN_COLUMNS, load_prepared, read_plan, shard_name
from acoustic_mlm.errors import UserError
from acoustic_mlm.tokenizer import stage as tokenizer


def test_load_prepared_detects_a_mismatch(prepared, tmp_path):
    _, root = prepared
    bad = tmp_path / "bad"
    shutil.copytree(root / "prepared", bad)
    audio = np.load(bad / "shard-00001" / "audio.npy")
    np.save(bad / "shard-00001" / "audio.npy", audio[:-encodec.HOP])
    with pytest.raises(UserError,
                       match=r"clip 'synth_00003' \(row 5\): offset \+ num_samples exceeds its shard's audio"):
        load_prepared(bad)
    shutil.rmtree(bad / "shard-00001")
    with pytest.raises(UserError, match=r"shard-00001/audio\.npy: not found"):
        load_prepared(bad)


def test_a_corpus_too_small_to_calibrate_on_is_refused_with_the_minutes_needed(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(4):  # 4 clips of 3 s (225 frames): the train split holds under 1024 frames (13.65 s)
        sf.write(raw / f"c{i}.wav", sine(300 + 50 * i, 3.0, SR), SR)
    cfg = make_cfg(valid_fraction=0.25)
    cfg["tokenizer"].update(mode="calibrated", calibration_frames=4096)
    with pytest.raises(UserError) as err:
        prepare.run(cfg, raw, tmp_path / "prepared")
    msg = str(err.value)
    train_frames = int(msg.split("holds ")[1].split(" ")[0])
    assert train_frames in (675, 450)  # 3 or 2 train clips of 225 frames
    need = (1024 - train_frames) / 75 / 60 / 0.75
    assert msg == (f"prepare: the train split holds {train_frames} EnCodec frames ({train_frames / 75 / 60:.2f} min); "
                   "the calibrated tokenizer needs at least 1024 (0.23 min of train audio, about 0.30 min in all "
                   f"with data.valid_fraction 0.25): add at least {need:.2f} min of audio, or set tokenizer.mode: "
                   "pretrained")
    assert not (tmp_path / "prepared").exists()
    cfg["tokenizer"]["mode"] = "pretrained"  # EnCodec's own codebooks need no fit: the same corpus is fine
    prepare.run(cfg, raw, tmp_path / "prepared")
    assert len(load_prepared(tmp_path / "prepared").manifest) == 4
    # Back to calibrated: prepare does not rerun on the mode alone, so the fit refuses the same way
    smoke = Path(__file__).resolve().parents[2] / "config" / "smoke.yaml"
    cfg["tokenizer"] = {**C.read_yaml(smoke)["tokenizer"], "mode": "calibrated"}
    with pytest.raises(UserError) as again:
        tokenizer.fit(cfg, tmp_path / "prepared", tmp_path / "codes")
    assert str(again.value) == msg.replace("prepare: ", f"{tmp_path / 'prepared' / 'manifest.csv'}: ", 1)
    assert not (tmp_path / "codes" / tokenizer.MODEL_DIR).exists()


def test_shard_name_is_five_digits():
    assert [shard_name(k) for k in (0, 1, 12345)] == ["shard-00000", "shard-00001", "shard-12345"]
    assert shard_name(3.0) == shard_name(3)  # a shard read from a frame may be a float


def test_read_plan_reads_what_prepare_plans_and_names_a_bad_plan(prepared, tmp_path):
    _, root = prepared
    plan = read_plan(root / "prepared")
    assert list(plan.columns) == list(PLAN_COLUMNS)
    assert plan["path"].tolist() == [f"synth_{i:05d}.flac" for i in range(4)]
    assert plan["shard"].tolist() == [0, 0, 0, 1] and (plan["skip"] == "").all()
    with pytest.raises(UserError, match=r"shards\.csv: not found \(run `amlm prepare --plan` first\)"):
        read_plan(tmp_path)
    plan = pd.DataFrame({"path": ["a.wav"], "clip_id": ["a"], "shard": [-1], "skip": [""]})
    plan.to_csv(tmp_path / PLAN, index=False)
    with pytest.raises(UserError, match=r"shards\.csv: a negative shard; rerun the prepare --plan stage") as err:
        read_plan(tmp_path)
    assert "\n" not in str(err.value)
