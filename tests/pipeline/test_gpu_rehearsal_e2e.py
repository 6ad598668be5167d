"""config/gpu-rehearsal.yaml: gpu-small's path rehearsed on a CPU.

- its keys equal config/gpu-small.yaml's except those in `DIFFERS` (sizes, the CPU's devices and thread
  counts, where the corpus is served), the one list of what may differ;
- from fetch to figure through Snakemake (slow tier): a zip in FMA's layout (tests/fma_rehearsal.py, MP3s,
  FMA's README.txt and checksums) served on 127.0.0.1, prepared as int16, encoded by EnCodec in pretrained
  mode with a checkpoint in the official format made here, the four arms trained in fp16_fairseq.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
import pytest
import yaml
from fma_rehearsal import ROOT_FOLDER, SECONDS, TRACKS, archive, member
from helpers import RUN_NAMES, copy_repo, tool_env

from acoustic_mlm import config as C

ROOT = Path(__file__).resolve().parents[2]
REHEARSAL = ROOT / "config" / "gpu-rehearsal.yaml"
GPU_SMALL = ROOT / "config" / "gpu-small.yaml"

# The keys gpu-rehearsal may set otherwise than gpu-small; every other key is equal.
DIFFERS = {
    # sizes: the corpus, the model, the batch, the crop, the schedule and its logging
    "data.shard_files",
    "model.conv_layers",  # channels only: MERT's kernels and strides (checked below)
    "model.dim",
    "model.layers",
    "model.heads",
    "model.ffn_dim",
    "train.steps",
    "train.total_updates",
    "train.warmup_steps",
    "train.batch_size",
    "train.accum_steps",
    "train.crop_seconds",
    "train.mask_group",
    "train.log_interval",
    "train.valid_crops",
    "train.checkpoint_interval",
    # a CPU in place of a GPU
    "tokenizer.device",
    "train.device",
    "train.threads",
    "train.workers",
    # the corpus in FMA's layout, served on 127.0.0.1 (the fma_* sources name FMA's own host)
    "data.source",
    "data.url",
    "data.known_hash",
}


def flat(mapping: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and key != "runs":
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_the_rehearsal_equals_gpu_small_but_for_its_sizes_devices_and_corpus_location():
    rehearsal, small = flat(C.read_yaml(REHEARSAL)), flat(C.read_yaml(GPU_SMALL))
    assert set(rehearsal) == set(small)
    differ = {k for k in small if rehearsal[k] != small[k]}
    assert differ == DIFFERS  # each listed key is in fact changed, and nothing else is
    # the size keys shrink; the conv front end keeps MERT's kernels and strides
    for key in ("model.dim", "model.layers", "model.heads", "model.ffn_dim", "train.steps", "train.batch_size"):
        assert rehearsal[key] < small[key], key
    assert [k[1:] for k in rehearsal["model.conv_layers"]] == [k[1:] for k in small["model.conv_layers"]]
    # gpu-small's path: FMA's layout, pretrained targets, int16 storage, fp16_fairseq
    cfg = C.load(REHEARSAL)
    assert (cfg.tokenizer.mode, cfg.data.sample_format, cfg.train.precision) == ("pretrained", "int16", "fp16_fairseq")
    assert C.load(GPU_SMALL).data.source == "fma_large"
    assert cfg.train.steps / cfg.train.total_updates == 100_000 / 400_000  # the same share of the schedule
    assert cfg.train.warmup_steps / cfg.train.total_updates == 32_000 / 400_000
    # the preset's URL is where its header's commands serve the file tests/fma_rehearsal.py writes
    assert urlsplit(cfg.data.url)[:3] == ("http", "127.0.0.1:8765", "/fma_rehearsal.zip")
    assert "fma_rehearsal.zip" in (ROOT / "tests" / "fma_rehearsal.py").read_text()


def _env() -> dict:
    env = tool_env(pythonpath=None)
    return env


def show(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


@pytest.mark.slow
@pytest.mark.e2e
def test_the_rehearsal_runs_from_fetch_to_figure_through_snakemake(server, tmp_path):
    from test_pretrained_int16 import official_format_checkpoint

    blob = archive()
    preset = C.read_yaml(REHEARSAL)
    # the generator writes the archive the preset names, byte for byte
    assert f"sha256:{hashlib.sha256(blob).hexdigest()}" == preset["data"]["known_hash"]
    url = server.serve("/fma_rehearsal.zip", blob)
    (tmp_path / "ckpt").mkdir()
    ckpt = official_format_checkpoint(tmp_path / "ckpt")
    repo = copy_repo(ROOT, tmp_path / "repo")

    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config/gpu-rehearsal.yaml"]
        + ["--config", f"data={{url: '{url}'}}", f"tokenizer={{checkpoint: '{ckpt}'}}"],
        cwd=repo,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, show(proc)

    # the run's configuration: the preset with where the archive and the checkpoint are, nothing else
    ran = flat(yaml.safe_load((repo / "results" / "config.yaml").read_text()))
    assert {k for k, v in flat(preset).items() if ran[k] != v} == {"data.url", "tokenizer.checkpoint"}

    # fetch: the archive downloaded once, its tracks extracted in FMA's layout and equal to its checksums file
    assert [p for p, _ in server.requests].count("/fma_rehearsal.zip") == 1
    raw = repo / "data" / "raw"
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        sums = zf.read(f"{ROOT_FOLDER}/checksums").decode().splitlines()
    assert len(sums) == len(TRACKS)
    for line in sums:
        digest, rel = line.split("  ")
        assert hashlib.sha1((raw / ROOT_FOLDER / rel).read_bytes()).hexdigest() == digest, rel
    assert sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*.mp3")) == sorted(member(t) for t in TRACKS)

    # prepare: int16 at 24 kHz, every track, three shards of at most four
    manifest = pd.read_csv(repo / "data" / "prepared" / "manifest.csv", dtype={"clip_id": str})
    assert sorted(manifest["path"]) == sorted(member(t) for t in TRACKS)
    for row in manifest.itertuples():
        assert (row.orig_sample_rate, row.orig_channels) == TRACKS[Path(row.path).stem], row
        assert abs(row.duration_s - SECONDS) < 0.1, row  # MP3's encoder delay and padding: a few ms
    assert sorted(manifest["shard"].unique()) == [0, 1, 2]
    for shard in sorted(manifest["shard"].unique()):
        audio = np.load(repo / "data" / "prepared" / f"shard-{shard:05d}" / "audio.npy", mmap_mode="r")
        assert audio.dtype == np.int16

    # tokenize: pretrained mode with the test-made checkpoint, on the CPU
    tok = json.loads((repo / "data" / "codes" / "tokenizer.json").read_text())
    assert tok["mode"] == "pretrained" and tok["checkpoint"]["sha256"].startswith(ckpt.stem.split("-")[1])
    assert tok["clips"] == len(TRACKS) and tok["distinct_codes"][0] >= 50

    # train: the four arms in fp16_fairseq on the CPU, every logged row finite, from near 10 bits down
    curves = pd.read_csv(repo / "results" / "loss_curves.csv")
    assert sorted(curves["run"].unique()) == sorted(RUN_NAMES)
    cb0 = curves[(curves["split"] == "train") & (curves["codebook"] == 0)]
    for run, g in cb0.groupby("run"):
        g = g.sort_values("step")
        assert g["step"].tolist() == [5, 10, 15, 20, 25], run
        first, last = g["loss_bits"].iloc[0], g["loss_bits"].iloc[-1]
        assert np.isfinite(g["loss_bits"]).all() and 9.0 < first < 10.6 and last < first - 0.5, (run, first, last)
    for run in RUN_NAMES:
        summary = json.loads((repo / "results" / "runs" / run / "summary.json").read_text())
        assert summary["status"] == "completed", (run, summary["status"])
        settings = summary["settings"]
        assert (settings["train.precision"], settings["train.device"]) == ("fp16_fairseq", "cpu"), run
        assert settings["data.sample_format"] == "int16", run
        metrics = pd.read_csv(repo / "results" / "runs" / run / "metrics.csv")
        # fairseq's loss scaler at its initial 2^7: no overflow in 25 updates (window 2^14 / 2 micro-batches)
        assert (metrics["loss_scale"] == 128.0).all() and (metrics["overflow_skips"] == 0).all(), run

    # figure and claims
    for ext in ("png", "pdf", "svg"):
        assert (repo / "results" / "figures" / f"acoustic_mlm_loss_codebook0.{ext}").stat().st_size > 1000
    assert json.loads((repo / "results" / "claims.json").read_text())
