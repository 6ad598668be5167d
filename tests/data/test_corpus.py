"""The refusal of a train split too small to calibrate the tokenizer on, by prepare and by the
tokenizer's fit (the prepared corpus's files and readers: tests/artifacts/test_prepared.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf
from data_helpers import SR, make_cfg, sine
from helpers import make_config

from acoustic_mlm import config as C
from acoustic_mlm.artifacts.codes import MODEL_DIR
from acoustic_mlm.artifacts.prepared import load_prepared
from acoustic_mlm.data import prepare
from acoustic_mlm.errors import UserError
from acoustic_mlm.tokenizer import stage as tokenizer


def test_a_corpus_too_small_to_calibrate_on_is_refused_with_the_minutes_needed(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(4):  # 4 clips of 3 s (225 frames): the train split holds under 1024 frames (13.65 s)
        sf.write(raw / f"c{i}.wav", sine(300 + 50 * i, 3.0, SR), SR)
    cfg = make_cfg(valid_fraction=0.25)
    cfg["tokenizer"].update(mode="calibrated", calibration_frames=4096)
    with pytest.raises(UserError) as err:
        prepare.run(make_config(cfg), raw, tmp_path / "prepared")
    msg = str(err.value)
    train_frames = int(msg.split("holds ")[1].split(" ")[0])
    assert train_frames in (675, 450)  # 3 or 2 train clips of 225 frames
    need = (1024 - train_frames) / 75 / 60 / 0.75
    assert msg == (
        f"prepare: the train split holds {train_frames} EnCodec frames ({train_frames / 75 / 60:.2f} min); "
        "the calibrated tokenizer needs at least 1024 (0.23 min of train audio, about 0.30 min in all "
        f"with data.valid_fraction 0.25): add at least {need:.2f} min of audio, or set tokenizer.mode: "
        "pretrained"
    )
    assert not (tmp_path / "prepared").exists()
    cfg["tokenizer"]["mode"] = "pretrained"  # EnCodec's own codebooks need no fit: the same corpus is fine
    prepare.run(make_config(cfg), raw, tmp_path / "prepared")
    assert len(load_prepared(tmp_path / "prepared").manifest) == 4
    # Back to calibrated: prepare does not rerun on the mode alone, so the fit refuses the same way
    smoke = Path(__file__).resolve().parents[2] / "config" / "smoke.yaml"
    cfg["tokenizer"] = {**C.read_yaml(smoke)["tokenizer"], "mode": "calibrated"}
    with pytest.raises(UserError) as again:
        tokenizer.fit(make_config(cfg), tmp_path / "prepared", tmp_path / "codes")
    assert str(again.value) == msg.replace("prepare: ", f"{tmp_path / 'prepared' / 'manifest.csv'}: ", 1)
    assert not (tmp_path / "codes" / MODEL_DIR).exists()
