"""The prepared corpus (data/prepared/), the prepare stage's output: its files, their columns, their
writers and their checked readers. Tokenization and training read the corpus through `load_prepared`
(-> `Corpus`); the prepare stage (acoustic_mlm.data.prepare) writes it through the writers here.

    shards.csv           the plan: every path under the raw folder, its clip id, its shard, why it is
                         skipped (if it is): PLAN_COLUMNS (write_plan, read_plan)
    shard-<k>/           one folder per shard (shard_name):
      audio.npy          ONE 1-D array, the shard's clips concatenated (AudioWriter, written clip by
                         clip; read_audio: memory-mapped read-only), of data.sample_format: float32, or
                         int16 PCM (2 bytes per sample) whose value x stands for x / 32768 / gain
                         (as_float, then the clip's gain: 1 unless the clip peaks above full scale)
      clips.csv          the manifest's columns but shard and split: SHARD_COLUMNS
      rejects.csv        path, reason: REJECTS_COLUMNS (write_shard_tables, read_shard_tables)
      shard.json         counts and the audio's sha256: SHARD_RECORD_KEYS (write_shard_record,
                         read_shard_record; shard_problem checks a shard against it)
    manifest.csv         written last, it marks the corpus complete (write_manifest, load_prepared): one
                         row per clip, MANIFEST_COLUMNS: clip_id, path (relative to the raw folder), shard,
                         split (train | valid), offset (first sample in its shard's audio.npy), num_samples
                         (a multiple of 320), num_frames (num_samples // 320, EnCodec frames),
                         orig_sample_rate, orig_channels, duration_s, gain (what the clip was multiplied
                         by to be stored in int16 without clipping: 1.0 for float32 and for every clip
                         within full scale; `Corpus.clip` and the readers divide by it)
    rejects.csv          path, reason for every file that is not in the manifest (write_rejects)
    prepare.json         clips and seconds per split, sample rate, shards, kept and rejected counts:
                         RECORD_KEYS (write_record, read_record)

Clip i is `audio(shard_i)[offset_i : offset_i + num_samples_i]`, as stored; `as_float` scales any slice of
it to float32 in [-1, 1) (a float32 corpus's slice unchanged).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import encodec
from acoustic_mlm.artifacts.checked import ReadError, read_csv_table, read_json, rerun_advice
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import (
    OutOfSpaceError,
    atomic_path,
    file_sha256,
    is_out_of_space,
    recover_replaced,
    write_json,
)

MANIFEST = "manifest.csv"  # written last: it marks the corpus complete
MANIFEST_COLUMNS = (
    "clip_id",
    "path",
    "shard",
    "split",
    "offset",
    "num_samples",
    "num_frames",
    "orig_sample_rate",
    "orig_channels",
    "duration_s",
    "gain",
)
REJECTS = "rejects.csv"  # the corpus's and each shard's: audio-named files left out, and why
REJECTS_COLUMNS = ("path", "reason")
REQUIRED_COLUMNS = ("clip_id", "shard", "split", "offset", "num_samples", "num_frames")  # what readers need
CLIPS = "clips.csv"  # shard-<k>/clips.csv: the shard's rows of the manifest
SHARD_COLUMNS = tuple(c for c in MANIFEST_COLUMNS if c not in ("shard", "split"))
AUDIO = "audio.npy"  # shard-<k>/audio.npy
SHARD_RECORD = "shard.json"  # shard-<k>/shard.json: the shard's counts
RECORD = "prepare.json"  # the corpus's counts
NUMBER = (int, float)
# shard.json's keys and their types (written sorted by key, as every JSON record)
SHARD_RECORD_KEYS = {"audio_sha256": str, "files": int, "kept": int, "rejected": int, "samples": int, "shard": int}
# prepare.json's keys and their types; clips and seconds: {"train": ..., "valid": ...}
RECORD_KEYS = {
    "clips": dict,
    "hop": int,
    "kept": int,
    "min_seconds": NUMBER,
    "rejected": int,
    "rejected_by_reason": dict,
    "sample_rate": int,
    "seconds": dict,
    "shard_files": int,
    "shards": int,
    "split_seed": int,
    "total_samples": int,
    "valid_fraction": NUMBER,
}
SPLITS = ("train", "valid")
PLAN = "shards.csv"  # the plan: every audio-named path, its clip id, its shard, why it is skipped (if it is)
PLAN_COLUMNS = ("path", "clip_id", "shard", "skip")
MANIFEST_DTYPES = {
    "clip_id": str,
    "path": str,
    "shard": np.int64,
    "split": str,
    "offset": np.int64,
    "num_samples": np.int64,
    "num_frames": np.int64,
    "orig_sample_rate": np.int64,
    "orig_channels": np.int64,
    "duration_s": np.float64,
    "gain": np.float64,
}


def shard_name(shard: int) -> str:
    """The folder of shard k: shard-00000, shard-00001, ... (the codes' shard folders have the same names)."""
    return f"shard-{int(shard):05d}"


# ----------------------------------------------------------------------------- the plan


def write_plan(out_dir: Path, frame: pd.DataFrame) -> None:
    """out_dir/shards.csv, atomically: the plan's rows in PLAN_COLUMNS."""
    with atomic_path(Path(out_dir) / PLAN) as tmp:
        frame[list(PLAN_COLUMNS)].to_csv(tmp, index=False)


def read_plan(out_dir: Path) -> pd.DataFrame:
    path = Path(out_dir) / PLAN
    if not path.is_file():
        raise UserError(f"{path}: not found (run `amlm prepare --plan` first)")
    frame = read_csv_table(path, "the shard plan", "prepare --plan", PLAN_COLUMNS, ints=["shard"], empty_ok=True)
    if (frame["shard"] < 0).any():
        raise UserError(f"{path}: a negative shard; rerun the prepare --plan stage")
    return frame


# ----------------------------------------------------------------------------- a shard


SAMPLE_FORMATS = {"float32": "<f4", "int16": "<i2"}  # data.sample_format -> the audio.npy's dtype
INT16_SCALE = 32768.0  # int16 PCM: the stored x stands for x / 32768 (as WAV and FLAC readers scale it)


def storage_gain(x: np.ndarray, sample_format: str) -> float:
    """What a clip is multiplied by before it is stored, so that no sample is clipped: 1.0 for float32
    and for an int16 clip whose every sample rounds inside [-32768, 32767]; for a clip that peaks above
    full scale (common after MP3 decoding and resampling), the largest float32 gain that brings its peak
    to 32767/32768. The clip is then stored in 65,536 steps of its own peak: the error after dividing by
    the gain is at most half a step of the clip's range, peak / 65534 (docs/recipe.md, "Prepared audio as int16")."""
    if sample_format == "float32" or not len(x):
        return 1.0
    x = np.asarray(x, dtype=np.float64)
    hi, lo = float(x.max()), float(x.min())
    if np.rint(hi * INT16_SCALE) <= 32767 and np.rint(lo * INT16_SCALE) >= -32768:
        return 1.0  # within int16's range as it is (-1.0 is -32768): stored unchanged
    peak = max(abs(hi), abs(lo))
    if not np.isfinite(peak):
        raise ValueError("a clip holds a non-finite sample")  # decode refuses these first
    gain = np.float32(32767.0 / INT16_SCALE / peak)
    while np.rint(peak * float(gain) * INT16_SCALE) > 32767:  # float32 rounding up: one step down
        gain = np.nextafter(gain, np.float32(0))
    return float(gain)


def to_stored(x: np.ndarray, sample_format: str, gain: float = 1.0) -> np.ndarray:
    """float32 samples as data.sample_format stores them: float32 as they are; int16 times `gain`
    (storage_gain: 1 unless the clip peaks above full scale) rounded to the nearest step of 1/32768.
    A sample that still falls outside [-32768, 32767] is refused, never clipped."""
    if sample_format == "float32":
        return np.ascontiguousarray(x, dtype="<f4")
    q = np.rint(np.asarray(x, dtype=np.float64) * (float(gain) * INT16_SCALE))
    if len(q) and (q.max() > 32767 or q.min() < -32768):
        raise ValueError(f"a sample of {q.max() if q.max() > 32767 else q.min():.0f} steps does not fit int16")
    return q.astype("<i2")


def as_float(x: np.ndarray) -> np.ndarray:
    """Stored samples (a slice of an audio.npy, or a stack of slices) as float32: int16 / 32768; float32
    as it is (no copy where none is needed: a float32 corpus's arithmetic is unchanged)."""
    x = np.asarray(x)
    if x.dtype == np.int16:
        return x.astype(np.float32) / np.float32(INT16_SCALE)
    return x.astype(np.float32, copy=False)


def unstored(x: np.ndarray, gain) -> np.ndarray:
    """Samples read back (as_float) divided by the storage gain of their clip (one number, or one per
    row of a stack): the decoded samples; a gain of 1 returns `x` itself."""
    gain = np.asarray(gain, dtype=np.float64)
    if np.all(gain == 1.0):
        return x
    g = gain.reshape(-1, *([1] * (x.ndim - 1))) if gain.ndim else gain
    return (x / g).astype(np.float32)


class AudioWriter:
    """A shard's audio.npy (a 1-D .npy file of float32 or int16 samples, `sample_format`) written clip
    by clip, so the corpus never sits in memory.

    numpy pads a 1-D header with room for any length (GROWTH_AXIS_MAX_DIGITS), so the header is
    written for length 0 first and rewritten in place with the final length: the file is then
    byte for byte what np.save would write.
    """

    def __init__(self, path: Path, sample_format: str = "float32"):
        if sample_format not in SAMPLE_FORMATS:
            raise UserError(f"data.sample_format: {sample_format!r} is not one of {', '.join(SAMPLE_FORMATS)}")
        self.path, self.n, self.format = Path(path), 0, sample_format
        self.descr, self.itemsize = SAMPLE_FORMATS[sample_format], np.dtype(SAMPLE_FORMATS[sample_format]).itemsize
        self.f = open(self.path, "wb")
        self.header_bytes = self._header()
        self.last_gain = 1.0  # the gain the last clip appended was stored with (storage_gain)

    def _header(self) -> int:
        self.f.seek(0)
        np.lib.format.write_array_header_1_0(self.f, {"descr": self.descr, "fortran_order": False, "shape": (self.n,)})
        return self.f.tell()

    def append(self, x: np.ndarray) -> int:
        """Write x (float32 samples, stored as `sample_format`, times its storage_gain, kept in
        `last_gain` for the clip's row); return its offset (in samples)."""
        offset = self.n
        self.last_gain = storage_gain(x, self.format)
        try:
            to_stored(x, self.format, self.last_gain).tofile(self.f)
        except OSError as exc:  # a full disk or the file-size limit: one line with the bytes it needs
            if not is_out_of_space(exc):
                raise
            raise OutOfSpaceError(
                self.path, os.fstat(self.f.fileno()).st_size, self.header_bytes + self.itemsize * (self.n + len(x))
            ) from None
        self.n += len(x)
        return offset

    def close(self) -> None:
        """Write the final length into the header."""
        with self.f:
            if self._header() != self.header_bytes:  # cannot happen with numpy's padded headers
                raise RuntimeError(f"{self.path}: the .npy header changed length")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            self.f.close()


def read_audio(path: Path) -> np.ndarray:
    """A shard's audio.npy, memory-mapped read-only: a 1-D float32 or int16 array (`as_float` scales it)."""
    if not path.is_file():
        raise UserError(f"{path}: not found (run the prepare stage first)")
    try:
        audio = np.load(path, mmap_mode="r")
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line error
        raise UserError(f"{path}: not a readable .npy array ({exc})") from None
    if audio.ndim != 1 or audio.dtype not in (np.float32, np.int16) or not audio.dtype.isnative:
        raise UserError(f"{path}: expected a 1-D float32 or int16 array, got {audio.dtype} {audio.shape}")
    return audio


def write_shard_tables(folder: Path, rows: list[dict], rejects: list[tuple[str, str]]) -> None:
    """A shard's clips.csv (SHARD_COLUMNS) and rejects.csv (REJECTS_COLUMNS), into its (temporary) folder."""
    pd.DataFrame(rows, columns=list(SHARD_COLUMNS)).to_csv(Path(folder) / CLIPS, index=False)
    pd.DataFrame(rejects, columns=list(REJECTS_COLUMNS)).to_csv(Path(folder) / REJECTS, index=False)


def read_shard_tables(folder: Path, shard: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A shard's clips.csv and rejects.csv, checked (its audio.npy must be there too)."""
    folder = Path(folder)
    for name in (CLIPS, REJECTS, AUDIO):
        if not (folder / name).is_file():
            raise UserError(f"{folder / name}: not found (run `amlm prepare --shard {shard}` first)")
    rerun = f"prepare --shard {shard}"
    clips = read_csv_table(
        folder / CLIPS,
        "a shard's clips",
        rerun,
        SHARD_COLUMNS,
        empty_ok=True,
        ints=[c for c in SHARD_COLUMNS if MANIFEST_DTYPES[c] is np.int64],
        numbers=["duration_s"],
    )
    rejects = read_csv_table(folder / REJECTS, "a shard's rejects", rerun, REJECTS_COLUMNS, empty_ok=True)
    return clips, rejects


def _write_record(path: Path, record: dict, keys: dict) -> None:
    if set(record) != set(keys):
        raise ValueError(f"{path.name}'s keys are {', '.join(keys)}, not {', '.join(sorted(record))}")
    write_json(path, record)


def write_shard_record(folder: Path, record: dict) -> None:
    """A shard's shard.json (SHARD_RECORD_KEYS), into its (temporary) folder, after its audio.npy: the
    counts given and the audio's sha256, read from the file written (what a resumed run checks)."""
    record = {**record, "audio_sha256": file_sha256(Path(folder) / AUDIO)}
    _write_record(Path(folder) / SHARD_RECORD, record, SHARD_RECORD_KEYS)


def shard_problem(folder: Path) -> str | None:
    """Why a finished shard's folder does not hold what its shard.json records (an audio.npy cut
    short, another length, other content), or None: what a resumed prepare checks before taking it."""
    folder = Path(folder)
    record = read_shard_record(folder / SHARD_RECORD)
    path = folder / AUDIO
    try:
        n = len(np.load(path, mmap_mode="r"))
    except Exception as exc:  # noqa: BLE001 - a cut or unreadable .npy is one answer: redo the shard
        return f"its {AUDIO} is not a readable .npy array ({type(exc).__name__})"
    if n != record["samples"]:
        return f"its {AUDIO} holds {n} samples where {SHARD_RECORD} records {record['samples']}"
    if file_sha256(path) != record["audio_sha256"]:
        return f"its {AUDIO} is not the audio {SHARD_RECORD} records (sha256 differs)"
    return None


def read_shard_record(path: str | Path) -> dict:
    """A shard's shard.json: its counts, whole numbers (SHARD_RECORD_KEYS); one line naming the file otherwise."""
    return read_json(path, "a shard's record", "prepare", SHARD_RECORD_KEYS)


# ----------------------------------------------------------------------------- the corpus


def write_record(out_dir: Path, record: dict) -> None:
    """out_dir/prepare.json (RECORD_KEYS), atomically."""
    _write_record(Path(out_dir) / RECORD, record, RECORD_KEYS)


def read_record(path: str | Path) -> dict:
    """The corpus's prepare.json: RECORD_KEYS of their types, clips and seconds per split (train,
    valid); one line naming the file otherwise."""
    path = Path(path)
    record = read_json(path, "the corpus's record", "prepare", RECORD_KEYS)
    for key, kinds in (("clips", int), ("seconds", NUMBER)):
        per_split = record[key]
        if sorted(per_split) != sorted(SPLITS) or not all(
            isinstance(v, kinds) and not isinstance(v, bool) for v in per_split.values()
        ):
            raise ReadError(f"{path}: '{key}' must hold a number per split (train, valid); {rerun_advice('prepare')}")
    return record


def write_rejects(out_dir: Path, rejects: pd.DataFrame) -> None:
    """out_dir/rejects.csv, atomically: every file of the plan that is not in the manifest, and why."""
    with atomic_path(Path(out_dir) / REJECTS) as tmp:
        rejects.to_csv(tmp, index=False)


def write_manifest(out_dir: Path, manifest: pd.DataFrame) -> None:
    """out_dir/manifest.csv, atomically (MANIFEST_COLUMNS; rows without a gain were stored without
    one: 1.0); written last: it marks the corpus complete."""
    if "gain" not in manifest:
        manifest = manifest.assign(gain=1.0)
    with atomic_path(Path(out_dir) / MANIFEST) as tmp:
        manifest[list(MANIFEST_COLUMNS)].to_csv(tmp, index=False)


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
        return self.root / shard_name(shard) / AUDIO

    def audio(self, shard: int) -> np.ndarray:
        if shard not in self._audio:
            self._audio[shard] = read_audio(self.audio_path(shard))
        return self._audio[shard]

    def clip(self, i: int) -> np.ndarray:
        """Clip i as float32 samples (scaled from int16 where the corpus stores int16, and divided by
        its storage gain: the samples prepare decoded, none clipped)."""
        row = self.manifest.iloc[i]
        o = int(row["offset"])
        return unstored(as_float(self.audio(int(row["shard"]))[o : o + int(row["num_samples"])]), row["gain"])

    @property
    def gains(self) -> np.ndarray:
        """Each clip's storage gain (float64, in manifest order)."""
        return self.manifest["gain"].to_numpy(np.float64)

    def __getstate__(self):
        return {"root": self.root, "manifest": self.manifest, "_audio": {}}


def load_prepared(prepared_dir: Path, sample_format: str | None = None) -> Corpus:
    """The prepared corpus (manifest with typed columns, shards' audio memory-mapped read-only),
    checked against each other; every problem is one line naming the file (and the clip).
    `sample_format` (data.sample_format): every shard's audio must be stored so, else the corpus was
    prepared under another configuration and is refused (it would be recorded as what it is not).

    Tokenization and training both read the corpus through here.
    """
    prepared_dir = Path(prepared_dir)
    recover_replaced(prepared_dir)  # a prepare killed while it replaced the folder: the previous one back
    manifest_path = prepared_dir / MANIFEST
    if not manifest_path.is_file():
        raise UserError(f"{manifest_path}: not found (run the prepare stage first)")
    # every field of every row, whole numbers where they must be; a clip called "NA" stays a string
    ints = [c for c, kind in MANIFEST_DTYPES.items() if kind is np.int64]
    manifest = read_csv_table(
        manifest_path,
        "the manifest",
        "prepare",
        REQUIRED_COLUMNS,
        ints=ints,
        numbers=["duration_s", "gain"],
        empty_ok=True,
    )
    if manifest.empty:
        raise UserError(f"{manifest_path}: no clips")
    if "gain" not in manifest:  # a corpus prepared before clips were stored with a gain: none had one
        manifest["gain"] = 1.0
    gain = manifest["gain"].to_numpy(np.float64)
    bad_gain = ~((gain > 0) & (gain <= 1))
    if bad_gain.any():
        i = int(np.flatnonzero(bad_gain)[0])
        raise UserError(
            f"{manifest_path}: clip {manifest['clip_id'].iloc[i]!r} (row {i + 2}): gain {gain[i]} is not in (0, 1] "
            "(the storage gain only ever lowers a clip); rerun the prepare stage"
        )
    bad_split = sorted(set(manifest["split"].astype(str)) - {"train", "valid"})
    if bad_split:
        raise UserError(f"{manifest_path}: split must be train or valid, found {bad_split[0]!r}")
    corpus = Corpus(prepared_dir, manifest)
    sh, o, s, nf = (manifest[c].to_numpy(np.int64) for c in ("shard", "offset", "num_samples", "num_frames"))
    length = {k: len(corpus.audio(k)) for k in corpus.shards}  # also checks every shard's audio.npy
    if sample_format is not None:
        for k in corpus.shards:
            if corpus.audio(k).dtype != np.dtype(SAMPLE_FORMATS[sample_format]):
                raise UserError(
                    f"{corpus.audio_path(k)}: {corpus.audio(k).dtype} samples, but the configuration says "
                    f"data.sample_format: {sample_format}; the corpus was prepared under another configuration: "
                    "rerun the prepare stage with this one"
                )
    checks = [
        ((s <= 0) | (s % encodec.HOP != 0), f"num_samples is not a positive multiple of {encodec.HOP}"),
        (nf != s // encodec.HOP, f"num_frames != num_samples // {encodec.HOP}"),
        ((o < 0) | (o % encodec.HOP != 0), f"offset is not a non-negative multiple of {encodec.HOP}"),
        (
            o + s > np.array([length[k] for k in sh]),
            "offset + num_samples exceeds its shard's audio.npy (the manifest does not match the audio; rerun prepare)",
        ),
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
