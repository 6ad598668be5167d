"""The GPU presets' corpora without the network: fma_large and fma_full resolved as the FMA README
publishes them, fetched from fixture archives of their layout served on 127.0.0.1 and prepared as int16;
and prepare and tokenize resuming a run killed mid-corpus without redoing its finished shards."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml
from data_helpers import SR, files_under, preset, tone_bytes
from helpers import make_config, make_zip, sha256

from acoustic_mlm.artifacts.prepared import AUDIO, load_prepared, shard_name
from acoustic_mlm.data import fetch, prepare, sources

ROOT = Path(__file__).resolve().parents[2]
# github.com/mdeff/fma README, "Usage": the sha1 of each archive
FMA_README_SHA1 = {
    "fma_large": "497109f4dd721066b5ce5e5f250ec604dc78939e",
    "fma_full": "0f0ace23fbe9ba30ecb7e95f763e435ea802b8ab",
}


def test_fma_full_is_resolved_as_the_fma_readme_publishes_it():
    for name, digest in FMA_README_SHA1.items():
        s = sources.ARCHIVES[name]
        assert s.url == f"https://os.unil.cloud.switch.ch/fma/{name}.zip" and s.known_hash == f"sha1:{digest}"
        assert s.expects(f"{name}/000/000002.mp3") and not s.expects(f"{name}/000/2.mp3")
        assert s.excluded(f"{name}/133/133297.mp3")  # the known-corrupt tracks, in every size


@pytest.mark.parametrize("name,seconds", [("fma_large", 1.0), ("fma_full", 3.0)])  # clips of 30 s; untrimmed tracks
def test_fma_large_and_full_fixture_archives_fetch_and_prepare_as_int16(server, tmp_path, monkeypatch, name, seconds):
    members = {
        f"{name}/000/000002.mp3": tone_bytes("mp3", seconds=seconds, hz=330),
        f"{name}/000/000005.mp3": tone_bytes("mp3", seconds=seconds + 0.5, hz=550, channels=2),
        f"{name}/133/133297.mp3": tone_bytes("mp3", seconds=seconds, hz=440),  # known corrupt: never extracted
        f"{name}/README.txt": b"FMA\n",
        f"{name}/checksums": b"",
    }
    blob = make_zip(members)
    url = server.serve(f"/fma/{name}.zip", blob)
    monkeypatch.setitem(sources.ARCHIVES, name, replace(sources.ARCHIVES[name], url=url, known_hash=sha256(blob)))
    monkeypatch.delitem(sources.KNOWN_CORPORA, name)  # a small fixture in its place: no disk plan
    cfg = preset(source=name, url=None, known_hash=None, folder=None, sample_rate=SR, sample_format="int16")
    cfg["train"]["crop_seconds"] = 0.5
    data = tmp_path / "data"
    fetch.run(make_config(cfg), data / "raw", retries=0, timeout=10)
    assert files_under(data / "raw") == ["SOURCE.json"]  # read in place by prepare: nothing extracted
    info = json.loads((data / "raw" / "SOURCE.json").read_text())
    assert info["excluded_known_corrupt"] == [f"{name}/133/133297.mp3"] and info["archive"] == f"{name}.zip"
    assert info["members"] == [f"{name}/000/000002.mp3", f"{name}/000/000005.mp3"]
    prepare.run(make_config(cfg), data / "raw", data / "prepared")
    assert not [p for p in tmp_path.rglob("*.mp3")]  # no member was ever written to disk
    corpus = load_prepared(data / "prepared")
    assert sorted(corpus.manifest["clip_id"]) == ["000002", "000005"]
    assert corpus.audio(0).dtype == np.int16
    n = int(corpus.manifest["num_samples"].sum())
    assert (data / "prepared" / shard_name(0) / AUDIO).stat().st_size == 128 + 2 * n  # 2 bytes per sample
    for i, row in corpus.manifest.iterrows():
        x = corpus.clip(i)
        assert x.dtype == np.float32 and abs(row["duration_s"] - (seconds + 0.5 * (row["clip_id"] == "000005"))) < 0.1
        assert 0.3 < np.abs(x).max() < 0.6  # the tones' 0.5 peak, scaled back from int16


# ------------------------------------------------------------------------------------------
# resuming a killed run


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src")
    return env


def _kill_when(cmd: list[str], ready, timeout: float = 240) -> None:
    """Start `cmd`, SIGKILL it once `ready()` holds (a hard kill: nothing of its own cleans up)."""
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the stage ended before it could be killed: " + proc.stderr.read()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def _finished(tmp_path: Path, out: str, record: str) -> list[str]:
    return sorted(p.parent.name for p in tmp_path.glob(f".{out}.tmp-*/shard-*/{record}"))


@pytest.fixture()
def raw_corpus(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    rng = np.random.default_rng(0)
    for i in range(24):
        sf.write(raw / f"c{i:02d}.wav", (0.1 * rng.standard_normal(int(2.0 * 44100))).astype(np.float32), 44100)
    cfg = preset(source="folder", folder=str(raw), shard_files=2, sample_format="int16")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return raw, cfg, path


@pytest.mark.slow
def test_prepare_killed_mid_corpus_resumes_without_redoing_finished_shards(raw_corpus, tmp_path, monkeypatch):
    raw, cfg, path = raw_corpus
    out = tmp_path / "prepared"
    cmd = [sys.executable, "-m", "acoustic_mlm", "prepare", "--config", str(path), "--raw", str(raw), "--out", str(out)]
    _kill_when(cmd, lambda: len(_finished(tmp_path, "prepared", "shard.json")) >= 3)
    finished = _finished(tmp_path, "prepared", "shard.json")
    assert 3 <= len(finished) < 12 and not out.exists()
    done_bytes = {s: (next(tmp_path.glob(f".prepared.tmp-*/{s}")) / AUDIO).read_bytes() for s in finished}

    redone = []
    real = prepare.prepare_shard
    monkeypatch.setattr(prepare, "prepare_shard", lambda c, r, o, shard: redone.append(shard) or real(c, r, o, shard))
    prepare.run(make_config(cfg), raw, out)
    assert sorted(shard_name(s) for s in redone) == sorted(set(shard_name(k) for k in range(12)) - set(finished))
    assert all((out / s / AUDIO).read_bytes() == b for s, b in done_bytes.items())  # taken as they were
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml", "prepared", "raw"]  # nothing left beside
    assert "resume.json" not in {p.name for p in out.iterdir()}

    fresh = tmp_path / "fresh"  # the resumed corpus is the corpus a run from scratch prepares
    prepare.run(make_config(cfg), raw, fresh)
    assert (fresh / "manifest.csv").read_bytes() == (out / "manifest.csv").read_bytes()
    assert all(
        (fresh / shard_name(k) / AUDIO).read_bytes() == (out / shard_name(k) / AUDIO).read_bytes() for k in range(12)
    )


@pytest.mark.slow
def test_a_killed_runs_shards_of_other_settings_are_not_taken(raw_corpus, tmp_path, monkeypatch):
    raw, cfg, path = raw_corpus
    out = tmp_path / "prepared"
    cmd = [sys.executable, "-m", "acoustic_mlm", "prepare", "--config", str(path), "--raw", str(raw), "--out", str(out)]
    _kill_when(cmd, lambda: len(_finished(tmp_path, "prepared", "shard.json")) >= 1)
    redone = []
    real = prepare.prepare_shard
    monkeypatch.setattr(prepare, "prepare_shard", lambda c, r, o, shard: redone.append(shard) or real(c, r, o, shard))
    other = copy.deepcopy(cfg)
    other["data"]["sample_format"] = "float32"  # another format: every shard is prepared again
    prepare.run(make_config(other), raw, out)
    assert sorted(redone) == list(range(12)) and load_prepared(out).audio(0).dtype == np.float32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml", "prepared", "raw"]


@pytest.mark.slow
def test_tokenize_killed_mid_corpus_resumes_without_redoing_finished_shards(raw_corpus, tmp_path, monkeypatch):
    from acoustic_mlm.tokenizer import stage

    sys.path.insert(0, str(ROOT / "tests" / "pipeline"))
    from test_pretrained_int16 import official_format_checkpoint

    raw, cfg, path = raw_corpus
    (tmp_path / "ckpt").mkdir()
    cfg["tokenizer"].update(checkpoint=str(official_format_checkpoint(tmp_path / "ckpt")), threads=1)
    path.write_text(yaml.safe_dump(cfg))
    prepared, codes = tmp_path / "prepared", tmp_path / "codes"
    prepare.run(make_config(cfg), raw, prepared)
    cmd = [sys.executable, "-m", "acoustic_mlm", "tokenize", "--config", str(path), "--prepared", str(prepared)]
    _kill_when(cmd + ["--out", str(codes)], lambda: len(_finished(tmp_path, "codes", "encode.json")) >= 2)
    finished = _finished(tmp_path, "codes", "encode.json")
    redone = []
    real = stage.encode_shard
    monkeypatch.setattr(
        stage, "encode_shard", lambda c, p, o, shard, t=1: redone.append(shard) or real(c, p, o, shard, t)
    )
    stage.run(make_config(cfg), prepared, codes, threads=1)
    assert sorted(shard_name(s) for s in redone) == sorted(set(shard_name(k) for k in range(12)) - set(finished))
    assert json.loads((codes / "tokenizer.json").read_text())["shards"] == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml", "ckpt", "codes", "prepared", "raw"]
