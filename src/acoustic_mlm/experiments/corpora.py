"""A round's corpus: what its runs train on, made once under the round's work folder by the package's own
stages (`amlm fetch`, `amlm prepare`, `amlm tokenize`), each in a process of its own, and shared by the
rounds that name the same corpus side by side (a file lock; made once, then read).

    corpus: tones                the tone corpus of the small-scale rounds (experiments.tone_corpus; made by
                                 `stage_tones`: the stages on config/tones.yaml at the rounds' size), in <work>/data
    corpus: <preset>.yaml        the corpus a preset's data and tokenizer sections make, for example
                                 config/config.yaml (the default: synthetic music through the calibrated
                                 tokenizer) or a user's own data preset, in <work>/corpora/<stem>-<hash>,
                                 the hash of those sections (another corpus, another folder)

`stage` runs the three stages (`stage_tones` on the tone corpus's preset); `data_for` makes the round's corpus
unless it is there, and gives its prepared clips, its codes and its plateau (the codes' unigram entropy, the
bar `trained` is read against).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import filelock

from acoustic_mlm import config as C
from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import tone_corpus

TONES = "tones"
SECTIONS = ("cpu_kernels", "data", "tokenizer")  # what decides a preset's corpus (its model and training do not)
READY = "tokenizer.json"  # the tokenize stage's last file: a corpus folder holding it is complete


def check(round_path: Path, corpus: str) -> str:
    """A declaration's `corpus`: tones, or a preset that exists and is valid; one UserError line otherwise."""
    if corpus in ("", TONES):
        return corpus
    path = Path(corpus)
    if path.suffix not in (".yaml", ".yml"):
        raise UserError(f"{round_path}: 'corpus' is {corpus!r}, not 'tones' or a preset's .yaml file")
    try:
        C.load(path)
    except UserError as exc:
        raise UserError(f"{round_path}: 'corpus' names a preset that is not valid: {exc}") from None
    return corpus


def folder_of(work: Path, corpus: str) -> Path:
    """Where a corpus lives under the work folder: <work>/data for tones (as the published rounds ran),
    <work>/corpora/<preset stem>-<hash of its data, tokenizer and cpu_kernels sections> for a preset."""
    if corpus in ("", TONES):
        return Path(work) / "data"
    mapping = C.read_yaml(Path(corpus))
    key = json.dumps({k: mapping.get(k) for k in SECTIONS}, sort_keys=True, default=str)
    return Path(work) / "corpora" / f"{Path(corpus).stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def stage(root: Path, config: Path, cwd: Path | None = None) -> tuple[Path, Path]:
    """`amlm fetch`, `prepare` and `tokenize --config config` into root/raw, root/prepared and root/codes
    (downloads in root/downloads), each in a process of its own running this process's package (its threads
    and allocator stay as they were), in `cwd` (default: this process's folder, where the preset's own
    relative paths point). A stage that fails is one UserError line: its last line."""
    import acoustic_mlm

    root = Path(root).resolve()
    env = dict(os.environ, PYTHONPATH=str(Path(acoustic_mlm.__file__).parents[1]))
    raw, prepared, codes = root / "raw", root / "prepared", root / "codes"
    for step in (
        ["fetch", "--out", raw, "--downloads", root / "downloads"],
        ["prepare", "--raw", raw, "--out", prepared],
        ["tokenize", "--prepared", prepared, "--out", codes],
    ):
        cmd = [sys.executable, "-m", "acoustic_mlm", *map(str, step), "--config", str(config), "-q"]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise UserError(f"{config}: amlm {step[0]} failed: {last}")
    return prepared, codes


def stage_tones(root: Path, clips: int = 8, frames: int = 300, seed: int = 0) -> tuple[Path, Path]:
    """The tone corpus made by the package's own stages, as a user runs them: `amlm fetch`, `amlm prepare`,
    `amlm tokenize --config root/tones.yaml` (config/tones.yaml with tone_corpus.stage_config's sizes: the
    `tones` source into root/raw, prepare into root/prepared, the `pitch` tokenizer into root/codes), each in
    a process of its own (this process's threads and allocator stay as they were). `clips` clips of `frames`
    frames (at least one training crop each: prepare rejects shorter clips) under `seed`. Its audio.npy,
    codes.npy and manifest are tone_corpus.write_corpus's, byte for byte; its records (fit.json, encode.json,
    loudness.csv, files.csv, tokenizer.json) are the stages' own. A stage that fails is one UserError line:
    its last line."""
    import yaml

    from acoustic_mlm.utils import atomic_path

    root = Path(root).resolve()  # the stages run with root as their working folder: nothing written elsewhere
    root.mkdir(parents=True, exist_ok=True)
    config = root / "tones.yaml"
    mapping = tone_corpus.stage_config(clips, frames, seed)
    with atomic_path(config) as tmp:
        tmp.write_text(yaml.safe_dump(mapping, sort_keys=False, width=120))
    return stage(root, config, cwd=root)


def data_for(corpus: str, work: Path) -> tuple[Path, Path, float]:
    """The corpus under the work folder, made unless it is complete there: its prepared clips, its codes
    and its plateau (bits). One maker at a time (a lock on the work folder); a folder left incomplete by a
    killed maker is made again from nothing."""
    from acoustic_mlm.report import decisive

    data = folder_of(work, corpus)
    Path(work).mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(Path(work) / ".lock"):
        if not (data / "codes" / READY).exists():
            shutil.rmtree(data, ignore_errors=True)
            if corpus in ("", TONES):
                stage_tones(data, clips=tone_corpus.CLIPS, frames=tone_corpus.FRAMES, seed=0)
            else:
                data.mkdir(parents=True)
                stage(data, Path(corpus).resolve())
    return data / "prepared", data / "codes", decisive.plateau_bits(data / "codes")
