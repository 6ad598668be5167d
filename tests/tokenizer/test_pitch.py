"""The tone corpus's oracle tokenizer (tokenizer/pitch.py, `tokenizer.mode: pitch`): every frame of the tone
corpus read back exactly, its deeper codebooks the corpus's, other audio refused; and the decisive check: the
corpus `amlm fetch`, `amlm prepare` and `amlm tokenize` make from config/tones.yaml is the rounds' corpus
(experiments.tone_corpus.write_corpus), its prepared audio, codes and manifest byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import make_config

from acoustic_mlm import config as C
from acoustic_mlm.data import tones
from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import corpora, tone_corpus
from acoustic_mlm.tokenizer import pitch
from acoustic_mlm.tokenizer.codec import TokenizerError, n_codebooks

AUDIO, CODES, MANIFEST = "prepared/shard-00000/audio.npy", "codes/shard-00000/codes.npy", "prepared/manifest.csv"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_frame_of_the_rounds_corpus_is_read_back_exactly(seed):
    """24 clips of 600 frames (14,400 frames a seed): every code recovered, the best tone's fit at least 25
    times the runner-up's, and explaining over 99 % of the frame's energy (the refusal is under 90 %)."""
    audio, c0 = zip(*tones.clips(tone_corpus.CLIPS, tone_corpus.FRAMES, seed))
    frames = np.concatenate(audio).reshape(-1, 320)
    code, share = pitch.read_frames(frames)
    assert len(code) == 14_400 and np.array_equal(code, np.concatenate(c0))
    assert share.min() > 0.99
    basis, inv = pitch._fits()
    p = frames.astype(np.float64) @ basis
    p = np.stack([p[:, :16], p[:, 16:]], -1)
    fitted = np.sort(np.einsum("nfi,fij,nfj->nf", p, inv, p), axis=1)
    assert (fitted[:, -1] / fitted[:, -2]).min() > 25


def test_encode_gives_the_corpus_codes_at_the_bandwidths_codebooks_and_zero_where_padded():
    (a, ca), (b, cb) = tones.clips(2, 30, 7)
    wav = np.zeros((2, 1, 30 * 320), np.float32)
    wav[0, 0], wav[1, 0, : 20 * 320] = a, b[: 20 * 320]  # the second clip cut to 20 frames, zero-padded
    model = pitch.PitchTokenizer(8)
    assert n_codebooks(model) == 8 and model.to("cpu") is model
    [(codes, scale)] = model.encode(torch.from_numpy(wav))
    assert scale is None and codes.shape == (2, 8, 30)
    assert np.array_equal(codes[0].numpy(), tones.codes_of(ca, 8))
    assert np.array_equal(codes[1, :, :20].numpy(), tones.codes_of(cb[:20], 8))
    assert (codes[1, 0, 20:] == 0).all()  # silence: code 0, trimmed by the stage
    assert codes[0, 2, 0] == (ca[0] * 5 + 2) % 16


@pytest.mark.parametrize("what", ["noise", "two tones"])
def test_audio_that_is_not_the_tone_corpus_is_refused_in_one_line(what):
    t = np.arange(320 * 4) / 24000
    rng = np.random.default_rng(0)
    x = (
        0.3 * rng.standard_normal(t.shape)
        if what == "noise"
        else 0.3 * (np.sin(2 * np.pi * 240 * t) + np.sin(2 * np.pi * 960 * t))
    )
    with pytest.raises(TokenizerError, match=r"^tokenizer\.mode pitch: a frame is no tone of the tone corpus") as exc:
        pitch.PitchTokenizer(8).encode(torch.from_numpy(x.astype(np.float32))[None, None])
    assert "\n" not in str(exc.value) and "explains" in str(exc.value)


def test_pitch_mode_reads_only_the_tone_corpus(root):
    mapping = C.read_yaml(root / "config" / "tones.yaml")
    mapping["data"]["source"] = "synthetic"
    mapping["data"]["synthetic"]["sample_rate"] = 32000
    with pytest.raises(C.ConfigError) as exc:
        C.validate(mapping, source="tones.yaml")
    assert str(exc.value) == (
        "tones.yaml: 'tokenizer.mode' is pitch, the tone corpus's oracle: it reads only 'data.source' tones "
        "(not synthetic)"
    )


def test_the_stages_make_write_corpus_s_corpus_whatever_its_size(tmp_path, monkeypatch):
    """corpora.stage_tones (fetch, prepare, tokenize from config/tones.yaml) at another size and seed than the rounds':
    the same bytes as write_corpus's; the records are the stages' own. Its folder given relative to the working
    folder, as the runner's default work folder is (the stages run in that folder: it was read twice relative)."""
    ref = tone_corpus.write_corpus(tmp_path / "ref", clips=5, frames=90, seed=3)
    monkeypatch.chdir(tmp_path)
    made = corpora.stage_tones(Path("made"), clips=5, frames=90, seed=3)
    assert made == (tmp_path.resolve() / "made" / "prepared", tmp_path.resolve() / "made" / "codes")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made", "ref"]
    assert sorted(p.name for p in (tmp_path / "made").iterdir()) == [
        "codes",
        "downloads",
        "prepared",
        "raw",
        "tones.yaml",
    ]
    for rel in (AUDIO, CODES, MANIFEST):
        assert (tmp_path / "made" / rel).read_bytes() == (tmp_path / "ref" / rel).read_bytes(), rel
    fit = json.loads((made[1] / "model" / "fit.json").read_text())
    assert fit["mode"] == "pitch" and fit["pitch"]["frequencies_hz"][:2] == [150.0, 240.0]
    summary = json.loads((made[1] / "tokenizer.json").read_text())
    assert (
        summary["unigram_entropy_bits"] == json.loads((ref[1] / "tokenizer.json").read_text())["unigram_entropy_bits"]
    )
    assert (made[1] / "model" / "tokenizer.pt").exists() is False


def test_the_cli_stages_make_the_rounds_corpus_byte_for_byte(root, tmp_path):
    """The decisive check: `amlm fetch`, `amlm prepare`, `amlm tokenize --config config/tones.yaml` against
    tone_corpus.write_corpus(clips=CLIPS, frames=FRAMES, seed=0), what the rounds train on."""
    ref = tmp_path / "ref"
    tone_corpus.write_corpus(ref, clips=tone_corpus.CLIPS, frames=tone_corpus.FRAMES, seed=0)
    made, preset = tmp_path / "made", str(root / "config" / "tones.yaml")
    amlm = [sys.executable, "-m", "acoustic_mlm"]
    for step in (
        ["fetch", "--out", made / "raw", "--downloads", made / "downloads"],
        ["prepare", "--raw", made / "raw", "--out", made / "prepared"],
        ["tokenize", "--prepared", made / "prepared", "--out", made / "codes"],
    ):
        run = subprocess.run(
            [*amlm, *map(str, step), "--config", preset, "-q"], capture_output=True, text=True, cwd=tmp_path
        )
        assert run.returncode == 0, run.stderr
    for rel in (AUDIO, CODES, MANIFEST):  # 18,432,128, 230,528 and 1,555 bytes
        assert (made / rel).read_bytes() == (ref / rel).read_bytes(), rel
    manifest = pd.read_csv(made / MANIFEST)
    assert manifest["clip_id"].tolist() == [f"tone{i:02d}" for i in range(24)]
    assert manifest["split"].tolist() == ["train"] * 23 + ["valid"] and set(manifest["num_frames"]) == {600}
    codes = np.load(made / CODES)
    assert codes.shape == (8, 14_400) and codes.dtype == np.int16 and codes.min() == 0 and codes.max() == 15
    summary = json.loads((made / "codes" / "tokenizer.json").read_text())
    assert summary["mode"] == "pitch" and summary["n_codebooks"] == 8 and summary["clips"] == 24
    assert summary["unigram_entropy_bits"][0] == 3.984  # the rounds' plateau
    loudness = pd.read_csv(made / "codes" / "shard-00000" / "loudness.csv")  # measured, not write_corpus's -13.5
    assert loudness["rms_dbfs"].between(-13.48, -13.45).all() and (loudness["gain_db"] == 0.0).all()
    assert sorted(p.name for p in (made / "raw").iterdir())[:2] == ["SOURCE.json", "tone00.wav"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made", "ref"]  # nothing written outside the folders named


def test_a_pitch_fit_is_not_taken_for_another_mode(tmp_path):
    """fit.json records the mode: a pitch fit is refused by a configuration of another mode, in one line."""
    from acoustic_mlm.data import fetch, prepare
    from acoustic_mlm.tokenizer import stage

    cfg = make_config(tone_corpus.stage_config(clips=3, frames=90))
    fetch.run(cfg, tmp_path / "raw")
    prepare.run(cfg, tmp_path / "raw", tmp_path / "prepared")
    stage.fit(cfg, tmp_path / "prepared", tmp_path / "codes")
    other = make_config(cfg, **{"tokenizer.mode": "pretrained"})
    with pytest.raises(TokenizerError, match="fitted with tokenizer.mode 'pitch', the configuration says 'pretrained'"):
        stage.check_fit(other, tmp_path / "codes" / "model" / "fit.json")


def test_a_stage_that_fails_is_one_line_naming_the_stage(tmp_path):
    """Clips shorter than a training crop (10 frames against 75): prepare rejects them all."""
    with pytest.raises(UserError) as exc:
        corpora.stage_tones(tmp_path, clips=3, frames=10)
    msg = str(exc.value)
    assert msg.startswith(f"{tmp_path / 'tones.yaml'}: amlm prepare failed: ") and "\n" not in msg
    assert "no usable audio" in msg and not (tmp_path / "codes").exists()
