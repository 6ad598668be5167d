"""The prepared corpus as the later stages read it: the files the prepare stage writes and their
columns, reading them back checked (`read_plan`; `load_prepared` -> `Corpus`), and the check that
its train split can calibrate the tokenizer (`check_calibration_data`).

A prepared folder holds `shards.csv` (the plan), one `shard-<k>/` per shard (`audio.npy`,
`clips.csv`, `rejects.csv`, `shard.json`) and, written last, `manifest.csv`, `rejects.csv` and
`prepare.json` (acoustic_mlm.data.prepare says what each holds).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from acoustic_mlm import encodec, readers
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import recover_replaced

if TYPE_CHECKING:
    from acoustic_mlm.config import Config

MANIFEST_COLUMNS = ("clip_id", "path", "shard", "split", "offset", "num_samples", "num_frames",
                    "orig_sample_rate", "orig_channels", "duration_s")
REJECTS_COLUMNS = ("path", "reason")  # rejects.csv: audio-named files left out, and why
REQUIRED_COLUMNS = ("clip_id", "shard", "split", "offset", "num_samples", "num_frames")  # what readers need
SHARD_COLUMNS = tuple(c for c in MANIFEST_COLUMNS if c not in ("shard", "split"))  # shard-<k>/clips.csv
PLAN = "shards.csv"  # the plan: every audio-named path, its clip id, its shard, why it is skipped (if it is)
PLAN_COLUMNS = ("path", "clip_id", "shard", "skip")
MANIFEST_DTYPES = {"clip_id": str, "path": str, "shard": np.int64, "split": str, "offset": np.int64,
                   "num_samples": np.int64, "num_frames": np.int64, "orig_sample_rate": np.int64,
                   "orig_channels": np.int64, "duration_s": np.float64}


def shard_name(shard: int) -> str:
    """The folder of shard k: shard-00000, shard-00001, ..."""
    return f"shard-{int(shard):05d}"


def read_plan(out_dir: Path) -> pd.DataFrame:
    path = Path(out_dir) / PLAN
    if not path.is_file():
        raise UserError(f"{path}: not found (run `amlm prepare --plan` first)")
    frame = readers.read_csv_table(path, "the shard plan", "prepare --plan", PLAN_COLUMNS, ints=["shard"],
                                   empty_ok=True)
    if (frame["shard"] < 0).any():
        raise UserError(f"{path}: a negative shard; rerun the prepare --plan stage")
    return frame


def check_calibration_data(cfg: Config, manifest: pd.DataFrame, where: str = "prepare") -> None:
    """Refuse, before tokenize, a corpus whose train split cannot fit the calibrated tokenizer.

    k-means needs at least one frame per code (1024 per level); `tokenizer.calibration_frames`
    (a multiple of 1024) is what the fit uses when the train split has it, else all of it (the
    fit warns). Below the minimum: a UserError saying how many minutes of audio are needed.
    Prepare's merge calls it; so does the tokenizer's fit (`where`), for a corpus prepared while
    tokenizer.mode was pretrained (prepare does not rerun when only the mode changes).
    """
    if cfg.tokenizer.mode != "calibrated":
        return
    CODEBOOK_SIZE, FRAME_RATE = encodec.CODEBOOK_SIZE, encodec.FRAME_RATE  # noqa: N806
    have = int(manifest.loc[manifest["split"] == "train", "num_frames"].sum())
    if have < CODEBOOK_SIZE:
        share = 1 - float(cfg.data.valid_fraction)
        raise UserError(
            f"{where}: the train split holds {have} EnCodec frames ({have / FRAME_RATE / 60:.2f} min); the calibrated "
            f"tokenizer needs at least {CODEBOOK_SIZE} ({CODEBOOK_SIZE / FRAME_RATE / 60:.2f} min of train audio, "
            f"about {CODEBOOK_SIZE / FRAME_RATE / 60 / share:.2f} min in all with data.valid_fraction "
            f"{cfg.data.valid_fraction}): add at least {(CODEBOOK_SIZE - have) / FRAME_RATE / 60 / share:.2f} "
            "min of audio, or set tokenizer.mode: pretrained")


class Corpus:
    """The prepared corpus: the manifest (one row per clip) and each shard's audio, memory-mapped on demand.

    Clip i is `audio(shard_i)[offset_i : offset_i + num_samples_i]`. Pickles without its memory
    maps (data-loader workers reopen them).
    """

    def __init__(self, root: Path, manifest: pd.DataFrame):
        self.root, self.manifest = Path(root), manifest
        self._audio: dict[int, np.ndarray] = {}

    @property
    def shards(self) -> list[int]:
        return sorted(int(s) for s in self.manifest["shard"].unique())

    def audio_path(self, shard: int) -> Path:
        return self.root / shard_name(shard) / "audio.npy"

    def audio(self, shard: int) -> np.ndarray:
        if shard not in self._audio:
            self._audio[shard] = _open_audio(self.audio_path(shard))
        return self._audio[shard]

    def clip(self, i: int) -> np.ndarray:
        row = self.manifest.iloc[i]
        o = int(row["offset"])
        return self.audio(int(row["shard"]))[o : o + int(row["num_samples"])]

    def __getstate__(self):
        return {"root": self.root, "manifest": self.manifest, "_audio": {}}


def _open_audio(path: Path) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"{path}: not found (run the prepare stage first)")
    try:
        audio = np.load(path, mmap_mode="r")
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line error
        raise UserError(f"{path}: not a readable .npy array ({exc})") from None
    if audio.ndim != 1 or audio.dtype != np.float32:
        raise UserError(f"{path}: expected a 1-D float32 array, got {audio.dtype} {audio.shape}")
    return audio


def load_prepared(prepared_dir: Path) -> Corpus:
    """The prepared corpus (manifest with typed columns, shards' audio memory-mapped read-only),
    checked against each other; every problem is one line naming the file (and the clip).

    Tokenization and training both read the corpus through here.
    """
    prepared_dir = Path(prepared_dir)
    recover_replaced(prepared_dir)  # a prepare killed while it replaced the folder: the previous one back
    manifest_path = prepared_dir / "manifest.csv"
    if not manifest_path.is_file():
        raise UserError(f"{manifest_path}: not found (run the prepare stage first)")
    # every field of every row, whole numbers where they must be; a clip called "NA" stays a string
    ints = [c for c, kind in MANIFEST_DTYPES.items() if kind is np.int64]
    manifest = readers.read_csv_table(manifest_path, "the manifest", "prepare", REQUIRED_COLUMNS, ints=ints,
                                      numbers=["duration_s"], empty_ok=True)
    if manifest.empty:
        raise UserError(f"{manifest_path}: no clips")
    bad_split = sorted(set(manifest["split"].astype(str)) - {"train", "valid"})
    if bad_split:
        raise UserError(f"{manifest_path}: split must be train or valid, found {bad_split[0]!r}")
    corpus = Corpus(prepared_dir, manifest)
    sh, o, s, nf = (manifest[c].to_numpy(np.int64) for c in ("shard", "offset", "num_samples", "num_frames"))
    length = {k: len(corpus.audio(k)) for k in corpus.shards}  # also checks every shard's audio.npy
    checks = [
        ((s <= 0) | (s % encodec.HOP != 0), f"num_samples is not a positive multiple of {encodec.HOP}"),
        (nf != s // encodec.HOP, f"num_frames != num_samples // {encodec.HOP}"),
        ((o < 0) | (o % encodec.HOP != 0), f"offset is not a non-negative multiple of {encodec.HOP}"),
        (o + s > np.array([length[k] for k in sh]), "offset + num_samples exceeds its shard's audio.npy "
                                                    "(the manifest does not match the audio; rerun prepare)"),
    ]
    for bad, what in checks:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise UserError(f"{manifest_path}: clip {manifest['clip_id'].iloc[i]!r} (row {i + 2}): {what}")
    order = np.lexsort((o, sh))
    overlap = (sh[order][1:] == sh[order][:-1]) & (o[order][1:] < (o + s)[order][:-1])
    if overlap.any():
        i = int(order[1:][overlap][0])
        raise UserError(f"{manifest_path}: clip {manifest['clip_id'].iloc[i]!r} (row {i + 2}) overlaps another clip")
    return corpus
