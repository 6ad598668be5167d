"""The GPU presets' data path on the smoke corpus, offline: prepared audio stored as int16 PCM (2 bytes per
sample, read back by tokenization and training as the stored samples scaled to float), codes from
EnCodec in pretrained mode with a checkpoint in the official format made here (the state dict of encodec's
24 kHz model, named with its sha256 prefix as torch.hub names encodec_24khz-d7cc33bc.th), and the smoke
model trained on those codes. A missing checkpoint, or one of another hash, is refused in one line."""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import make_config

from acoustic_mlm import config as C
from acoustic_mlm.artifacts.prepared import AUDIO, as_float, load_prepared, shard_name
from acoustic_mlm.data import fetch, prepare
from acoustic_mlm.errors import UserError
from acoustic_mlm.tokenizer import stage
from acoustic_mlm.train import loop as train
from acoustic_mlm.train.crops import CropData

# A prepared and tokenized corpus per module (gpu_data): minutes. Its tests on one xdist worker, so
# that it is made once under `pytest -n 2 --dist loadgroup`.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pretrained_int16")]


def official_format_checkpoint(folder: Path, seed: int = 0) -> Path:
    """encodec's 24 kHz model's state dict, every key of the released file, saved with torch.save and named
    encodec_24khz-<first 8 hex digits of its sha256>.th. An untrained model's RVQ codebooks are zero (it
    emits code 0 only): each level's 1024 codewords are filled here with frames of what that level
    quantises (the encoder's output for tones of random pitch and level, then the residuals level by level),
    so that the codes vary with the music as the released weights' do."""
    from encodec import EncodecModel

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = EncodecModel.encodec_model_24khz(pretrained=False)
    t = np.arange(12_000) / 24_000
    wav = np.concatenate(
        [rng.uniform(0.02, 0.5) * np.sin(2 * np.pi * rng.uniform(60, 2000) * t + rng.uniform(0, 6)) for _ in range(40)]
    )
    with torch.no_grad():
        x = model.encoder(torch.from_numpy(wav.astype(np.float32))[None, None])[0].T  # (frames, 128)
        x = x[torch.from_numpy(rng.choice(len(x), 1024, replace=len(x) < 1024))]
        for layer in model.quantizer.vq.layers:
            cb = layer._codebook
            cb.embed.copy_(x + 1e-3 * torch.randn_like(x))
            cb.embed_avg.copy_(cb.embed)
            cb.cluster_size.fill_(1.0)
            cb.inited.fill_(1.0)
            x = x - cb.embed[torch.cdist(x, cb.embed).argmin(1)]  # the next level's input
            x = x[torch.randperm(len(x))] + 1e-3 * torch.randn_like(x)
    tmp = folder / "state.th"
    torch.save(model.state_dict(), tmp)
    prefix = hashlib.sha256(tmp.read_bytes()).hexdigest()[:8]
    return tmp.rename(folder / f"encodec_24khz-{prefix}.th")


def npy_bytes_per_sample(path: Path) -> float:
    n = len(np.load(path, mmap_mode="r"))
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        header = f.tell()
    return (path.stat().st_size - header) / n


@pytest.fixture(scope="module")
def gpu_data(tmp_path_factory, smoke_cfg_module):
    """The smoke corpus fetched once and prepared twice (float32 and int16), the int16 one tokenized in
    pretrained mode with a checkpoint made here."""
    base = tmp_path_factory.mktemp("gpu_data")
    ckpt_dir = base / "ckpt"
    ckpt_dir.mkdir()
    ckpt = official_format_checkpoint(ckpt_dir)
    cfg = copy.deepcopy(smoke_cfg_module)
    cfg["tokenizer"].update(mode="pretrained", checkpoint=str(ckpt))
    fetch.run(make_config(cfg), base / "raw")
    dirs = {}
    for fmt in ("float32", "int16"):
        cfg["data"]["sample_format"] = fmt
        prepare.run(make_config(cfg), base / "raw", base / f"prepared_{fmt}")
        dirs[fmt] = base / f"prepared_{fmt}"
    stage.run(make_config(cfg), dirs["int16"], base / "codes", threads=2)
    return cfg, dirs, base / "codes", ckpt


@pytest.fixture(scope="module")
def smoke_cfg_module():
    import yaml

    return yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "smoke.yaml").read_text())


def test_int16_prepared_audio_takes_two_bytes_per_sample_and_reads_back_as_the_float32_corpus(gpu_data):
    _, dirs, _, _ = gpu_data
    f32, i16 = load_prepared(dirs["float32"]), load_prepared(dirs["int16"])
    pd.testing.assert_frame_equal(f32.manifest, i16.manifest)  # the same clips, offsets and split
    for k in f32.shards:
        assert npy_bytes_per_sample(dirs["int16"] / shard_name(k) / AUDIO) == 2.0
        assert npy_bytes_per_sample(dirs["float32"] / shard_name(k) / AUDIO) == 4.0
        stored = i16.audio(k)
        assert stored.dtype == np.int16 and f32.audio(k).dtype == np.float32
        # int16 is the float32 corpus rounded to the nearest step of 1/32768 (the synthetic clips peak below 1)
        assert np.abs(as_float(stored) - f32.audio(k)).max() <= 0.5 / 32768 + 1e-9
        assert np.array_equal(stored, np.rint(np.asarray(f32.audio(k), dtype=np.float64) * 32768).astype(np.int16))
    int16_bytes = sum((dirs["int16"] / shard_name(k) / AUDIO).stat().st_size for k in i16.shards)
    float_bytes = sum((dirs["float32"] / shard_name(k) / AUDIO).stat().st_size for k in f32.shards)
    assert int16_bytes < 0.51 * float_bytes
    assert np.array_equal(i16.clip(0), as_float(i16.audio(int(i16.manifest["shard"].iloc[0]))[: len(i16.clip(0))]))


def test_training_reads_the_int16_corpus_as_its_stored_samples(gpu_data):
    cfg, dirs, codes, _ = gpu_data
    typed = make_config(cfg)
    corpus = load_prepared(dirs["int16"])
    data = CropData(corpus, codes, "train", 20, 2, typed.model_for("prenorm_clip1"), seed=1)
    wav, _, _ = data[0]
    assert wav.dtype == torch.float32
    hits = 0
    for k in corpus.shards:
        pcm = corpus.audio(k)
        for row in wav:
            first = np.flatnonzero(pcm[::320] == round(float(row[0]) * 32768))
            for f in first:
                if np.array_equal(as_float(pcm[f * 320 : f * 320 + len(row)]), row.numpy()):
                    hits += 1
                    break
    assert hits == 2  # each crop is a slice of a shard's int16 samples / 32768


def test_the_smoke_model_trains_on_pretrained_mode_codes(gpu_data, tmp_path):
    cfg, dirs, codes, ckpt = gpu_data
    tok = json.loads((codes / "tokenizer.json").read_text())
    assert tok["mode"] == "pretrained" and tok["checkpoint"]["sha256"].startswith(ckpt.stem.split("-")[1])
    assert tok["loudness"]["method"] == "none"  # EnCodec 24 kHz as released: no input normalisation
    assert tok["distinct_codes"][0] >= 50  # codebook 0 carries information, not one code
    cfg = copy.deepcopy(cfg)
    cfg["train"].update(steps=12, warmup_steps=2, log_interval=4, batch_size=2, valid_crops=3, crop_seconds=0.4)
    train.run(make_config(cfg), "prenorm_clip1", dirs["int16"], codes, tmp_path / "run")
    metrics = pd.read_csv(tmp_path / "run" / "metrics.csv")
    assert metrics["step"].max() == 12
    loss = metrics["loss_cb0_bits"] if "loss_cb0_bits" in metrics else metrics.filter(like="cb0").iloc[:, 0]
    assert np.isfinite(loss).all() and 5.0 < float(loss.iloc[0]) < 11.0


def test_a_missing_checkpoint_or_another_hash_is_refused_in_one_line(gpu_data, tmp_path):
    cfg, dirs, _, ckpt = gpu_data
    prefix = ckpt.stem.split("-")[1]
    missing = tmp_path / f"encodec_24khz-{prefix}.th"
    cfg = copy.deepcopy(cfg)
    cfg["tokenizer"]["checkpoint"] = str(missing)
    with pytest.raises(UserError) as err:
        stage.fit(make_config(cfg), dirs["int16"], tmp_path / "codes")
    msg = str(err.value)
    assert "\n" not in msg and str(missing) in msg and "not found" in msg and prefix in msg
    other = tmp_path / "encodec_24khz-d7cc33bc.th"  # the official name, another file's content
    other.write_bytes(ckpt.read_bytes())
    cfg["tokenizer"]["checkpoint"] = str(other)
    with pytest.raises(UserError) as err:
        stage.fit(make_config(cfg), dirs["int16"], tmp_path / "codes")
    msg = str(err.value)
    digest = hashlib.sha256(other.read_bytes()).hexdigest()
    assert "\n" not in msg and str(other) in msg and "d7cc33bc" in msg and digest in msg
    assert not (tmp_path / "codes" / "model").exists()  # nothing half-written


def test_the_documented_command_writes_the_smoke_preset_with_real_recordings_and_pretrained_targets(gpu_data, tmp_path):
    """docs/tokenizer.md's command (its first part, which writes the config; snakemake then runs it)."""
    import re
    import shlex
    import shutil
    import subprocess
    import sys

    _, _, _, ckpt = gpu_data
    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "tokenizer.md").read_text()
    command = re.search(r"^(python -c .*) && snakemake --cores all --configfile (\S+)$", doc, flags=re.M)
    assert command is not None and command.group(2) == "results/smoke-real.yaml"
    argv = shlex.split(command.group(1))
    (tmp_path / "config").mkdir()
    (tmp_path / "results").mkdir()
    shutil.copy(root / "config" / "smoke.yaml", tmp_path / "config")
    music = tmp_path / "music"
    music.mkdir()
    proc = subprocess.run([sys.executable, *argv[1:3], str(music), str(ckpt)], cwd=tmp_path, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    cfg = C.load(tmp_path / "results" / "smoke-real.yaml")
    assert (cfg.data.source, cfg.data.folder) == ("folder", str(music))
    assert (cfg.tokenizer.mode, cfg.tokenizer.checkpoint) == ("pretrained", str(ckpt))
    assert argv[3:] == ["../shared/audio/librosa", "~/.cache/torch/hub/checkpoints/encodec_24khz-d7cc33bc.th"]
