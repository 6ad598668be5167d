"""Real recordings through the whole smoke pipeline: librosa's 14 example recordings (music, speech,
field sounds; ../shared/audio/librosa from the repository root, or $AMLM_REAL_AUDIO).

- a `folder` source holding them beside files that are not taken (licence .txt files, an .m4a, a
  .jpg, a broken link): every file is in the manifest or in rejects.csv, and the figure is drawn;
- a `url` source: a tar.gz of them built here, served on 127.0.0.1 with its sha256;
- in both, codebook 0 of the calibrated tokenizer carries information rather than the recordings'
  levels: its most frequent code holds at most 5% of the frames, its unigram entropy is at least
  8 bits, and every recording uses at least 30 codes (docs/tokenizer.md has the measured values).

Skipped, with the reason, where the recordings are absent. Nothing is copied into the repository.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import copy_repo, real_audio_dir, real_audio_missing, sha256
from test_sources_e2e import FIGURE, read_csv, run, show, write_config

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(real_audio_missing() is not None, reason=str(real_audio_missing())),
]

# Codebook 0 over the 14 recordings (docs/tokenizer.md, benchmarks/tokenizer_loudness.py): with loudness
# kweighted 2.5% of the frames on the most frequent code and 9.02 bits; 9.3% and 8.54 bits with loudness
# rms (glacier-bay-humpback: 96% of its frames on one code); 36.8% and 6.14 bits without normalisation.
PIPELINE_TIMEOUT_S = 2400  # 11 min of audio through every stage: about 5 min on 2 idle cores, far more on busy ones
MAX_TOP_CODE_SHARE = 0.05  # codebook 0: no code on more than 5% of the frames
MIN_ENTROPY_BITS = 8.0  # codebook 0's unigram entropy over the corpus (10 bits: all 1024 codes alike)
MIN_CODES_PER_FILE = 30  # codebook-0 codes each recording uses (measured: 42 for the shortest, a 2.8 s bird call)


def snakemake(repo: Path, *targets: str) -> subprocess.CompletedProcess:
    return run(
        [sys.executable, "-m", "snakemake", *targets, "--cores", "2", "--configfile", "config/test.yaml"],
        repo,
        timeout=PIPELINE_TIMEOUT_S,
    )


def recordings() -> list[Path]:
    return sorted(real_audio_dir().glob("*.ogg"))


def assert_informative_codebook0(repo: Path) -> dict:
    tok = json.loads((repo / "data" / "codes" / "tokenizer.json").read_text())
    assert tok["loudness"]["method"] == "kweighted", tok["loudness"]
    assert tok["top_code_share"][0] <= MAX_TOP_CODE_SHARE, tok["top_code_share"]
    assert tok["unigram_entropy_bits"][0] >= MIN_ENTROPY_BITS, tok["unigram_entropy_bits"]
    files = read_csv(repo / "data" / "codes" / "files.csv")
    assert len(files) == len(recordings()) and np.isfinite(files["lufs"]).all()
    assert (files["cb0_codes_used"] >= MIN_CODES_PER_FILE).all(), files
    return tok


def test_folder_of_real_recordings_runs_the_whole_pipeline(root, tmp_path):
    folder = tmp_path / "music"
    (folder / "album").mkdir(parents=True)
    for p in sorted(real_audio_dir().iterdir()):  # the recordings and their licence .txt files
        (folder / ("album" if p.suffix == ".ogg" and "Kevin" in p.name else "") / p.name).symlink_to(p)
    (folder / "track.m4a").write_bytes(b"\x00\x00\x00\x20ftypM4A " + bytes(64))
    (folder / "cover.jpg").write_bytes(b"\xff\xd8\xff\xe0 not audio")
    (folder / "gone.flac").symlink_to(folder / "nowhere.flac")
    repo = copy_repo(root, tmp_path / "repo")
    write_config(repo / "config" / "test.yaml", root, source="folder", folder=str(folder))

    proc = snakemake(repo)
    assert proc.returncode == 0, show(proc)
    assert (repo / FIGURE).stat().st_size > 1000

    # Every file under the folder: in the manifest or in the rejects, with its reason.
    manifest = read_csv(repo / "data" / "prepared" / "manifest.csv")
    rejects = read_csv(repo / "data" / "prepared" / "rejects.csv")
    every = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir() or p.is_symlink())
    assert sorted(manifest["path"].tolist() + rejects["path"].tolist()) == every
    assert len(manifest) == len(recordings())
    reasons = dict(zip(rejects["path"], rejects["reason"]))
    assert reasons["track.m4a"].startswith("unsupported audio format (.m4a)")
    assert reasons["gone.flac"] == "broken symbolic link"
    assert reasons["cover.jpg"] == reasons["pibble.txt"] == "not audio (libsndfile does not recognise its content)"
    tok = assert_informative_codebook0(repo)
    assert tok["clips"] == len(recordings())


def test_url_source_of_real_recordings(server, root, tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for p in recordings():
            tf.add(p, arcname=f"librosa/{p.name}")
        tf.add(real_audio_dir() / "pibble.txt", arcname="librosa/pibble.txt")
    blob = buf.getvalue()
    url = server.serve("/real/librosa.tar.gz", blob)
    repo = copy_repo(root, tmp_path / "repo")
    write_config(repo / "config" / "test.yaml", root, source="url", url=url, known_hash=sha256(blob), shard_files=5)

    proc = snakemake(repo, "data/codes/tokenizer.json", "results/runs/prenorm_clip1/metrics.csv")
    assert proc.returncode == 0, show(proc)
    manifest = read_csv(repo / "data" / "prepared" / "manifest.csv")
    assert sorted(manifest["path"]) == sorted(f"librosa/{p.name}" for p in recordings())
    rejects = read_csv(repo / "data" / "prepared" / "rejects.csv")
    assert dict(zip(rejects["path"], rejects["reason"])) == {
        "librosa/pibble.txt": "not an audio file name (not extracted)"
    }
    assert sorted(manifest["shard"].unique()) == [0, 1, 2]  # 15 members in shards of 5
    assert_informative_codebook0(repo)
    metrics = pd.read_csv(repo / "results" / "runs" / "prenorm_clip1" / "metrics.csv")
    assert np.isfinite(metrics["train_loss_cb0"]).all() and metrics["step"].max() > 0
