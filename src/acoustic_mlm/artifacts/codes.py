"""The codes (data/codes/), the tokenize stage's output: its files, their writers and their checked
readers. The tokenize stage (acoustic_mlm.tokenizer.stage) writes them; training reads the codes and
tokenizer.json through here, and no other module of the tokenizer.

    model/fit.json       the fit: mode, bandwidth, seed, loudness normalisation, calibration statistics
                         or the pretrained checkpoint's sha256 (write_fit, read_fit); in calibrated mode
                         model/tokenizer.pt beside it (the calibrated model's state_dict)
    shard-<k>/           one folder per shard of the prepared corpus, named alike (prepared.shard_name):
      codes.npy          int16, shape (K, len(audio.npy) // 320) for the shard's audio.npy: column t holds
                         the codes of samples [320 t, 320 (t + 1)), so clip i's codes are columns
                         offset_i // 320 ... + num_frames_i; columns of no clip hold -1 (create_codes,
                         open_codes, read_codes)
      encode.json        clips, seconds, speed (write_encode_record, read_encode_record)
      loudness.csv       each clip's RMS dBFS, LUFS and the mean gain applied (LOUDNESS_COLUMNS;
                         write_loudness, read_loudness)
    files.csv            one row per clip: loudness, codebook-0 codes used, entropy, most frequent code's
                         share (FILES_COLUMNS; write_files, read_files)
    tokenizer.json       written last, it marks the codes complete: the fit, the codebooks (`n_codebooks`,
                         `codebook_size`, the largest code per codebook `max_code`), codes used and unigram
                         entropy per level, encode time and speed (write_tokenizer_summary,
                         read_tokenizer_summary)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts.checked import ReadError, check_file, read_csv_table, read_json
from acoustic_mlm.artifacts.prepared import shard_name
from acoustic_mlm.errors import UserError, one_line
from acoustic_mlm.utils import atomic_path, file_sha256, write_json

MODEL_DIR = "model"  # data/codes/model/: fit.json (+ tokenizer.pt in calibrated mode)
FIT = "fit.json"
CODES = "codes.npy"
ENCODE_RECORD = "encode.json"
LOUDNESS_TABLE = "loudness.csv"  # shard-<k>/loudness.csv: each clip's measured loudness and the gain applied to it
FILES = "files.csv"  # data/codes/files.csv: one row per clip, its loudness and its codebook-0 statistics
SUMMARY = "tokenizer.json"  # written last: it marks the codes complete
CODES_DTYPE = np.int16
ENCODE_KEYS = {"clips": int, "audio_seconds": (int, float), "encode_seconds": (int, float)}  # what merge reads
SUMMARY_KEYS = {"n_codebooks": int, "max_code": list, "codebook_size": int}  # what training checks
# loudness.csv: the clip, its RMS level (dBFS) and BS.1770 loudness (LUFS), the mean gain applied (dB)
LOUDNESS_COLUMNS = ("clip_id", "rms_dbfs", "lufs", "gain_db")
FILE_STATS_COLUMNS = ("cb0_codes_used", "cb0_entropy_bits", "cb0_top_code_share")  # a clip's codebook-0 codes
# files.csv: the clip (its manifest row's id, path, split and length), its loudness, its codebook-0 codes
FILES_COLUMNS = ("clip_id", "path", "split", "seconds", *LOUDNESS_COLUMNS[1:], *FILE_STATS_COLUMNS)
SCAN_BLOCK = 1 << 22  # codes checked 4 M values at a time (8 MB of int16): memory stays flat


def codes_path(codes_dir: Path, shard: int) -> Path:
    """A shard's codes.npy under the codes' folder."""
    return Path(codes_dir) / shard_name(shard) / CODES


# ----------------------------------------------------------------------------- the records


def write_fit(model_dir: Path, info: dict) -> None:
    """model/fit.json (into the model folder, or its temporary name)."""
    write_json(Path(model_dir) / FIT, info)


def read_fit(path: str | Path) -> dict:
    """model/fit.json: the tokenizer's fit."""
    return read_json(path, "the tokenizer's fit", "tokenize")


def write_encode_record(shard_dir: Path, info: dict) -> None:
    """shard-<k>/encode.json (into the shard's folder, or its temporary name)."""
    write_json(Path(shard_dir) / ENCODE_RECORD, info)


def read_encode_record(path: str | Path) -> dict:
    """shard-<k>/encode.json: the shard's clips, seconds of audio and of encoding (ENCODE_KEYS)."""
    return read_json(path, "a shard's encoding record", "tokenize", ENCODE_KEYS)


def shard_codes_problem(folder: Path) -> str | None:
    """Why a finished shard's folder does not hold the codes its encode.json records (a codes.npy cut short,
    unreadable or changed since), or None: what a resumed tokenize checks before taking the shard."""
    folder = Path(folder)
    record = read_encode_record(folder / ENCODE_RECORD)
    path = folder / CODES
    try:
        np.load(path, mmap_mode="r")
    except Exception as exc:  # noqa: BLE001 - a cut or unreadable .npy is one answer: redo the shard
        return f"its {CODES} is not a readable .npy array ({type(exc).__name__})"
    if "codes_sha256" not in record:
        return f"its {ENCODE_RECORD} records no sha256 of {CODES}"
    if file_sha256(path) != record["codes_sha256"]:
        return f"its {CODES} is not the codes {ENCODE_RECORD} records (sha256 differs)"
    return None


def write_tokenizer_summary(codes_dir: Path, meta: dict) -> None:
    """tokenizer.json, atomically; written last: it marks the codes complete."""
    write_json(Path(codes_dir) / SUMMARY, meta)


def read_tokenizer_summary(path: str | Path) -> dict:
    """data/codes/tokenizer.json: the codes' summary (written last by tokenize: it marks them complete)."""
    path = Path(path)
    meta = read_json(path, "", "tokenize", SUMMARY_KEYS)
    n, top = meta["n_codebooks"], meta["max_code"]
    if n < 1 or len(top) != n:
        raise ReadError(
            f"{path}: 'n_codebooks' is {n} but 'max_code' lists {len(top)} codebooks; rerun the tokenize stage"
        )
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in top):
        raise ReadError(f"{path}: 'max_code' must list whole numbers, one per codebook; rerun the tokenize stage")
    bad = [c for c in top if not -1 <= c < meta["codebook_size"]]
    if bad:
        raise ReadError(
            f"{path}: 'max_code' holds {bad[0]}, outside 0-{meta['codebook_size'] - 1}; rerun the tokenize stage"
        )
    return meta


# ----------------------------------------------------------------------------- the tables


def _check_columns(table: pd.DataFrame, columns: tuple[str, ...], name: str) -> None:
    if tuple(table.columns) != columns:
        raise ValueError(f"{name}'s columns are {', '.join(columns)}, not {', '.join(map(str, table.columns))}")


def write_loudness(shard_dir: Path, measured: pd.DataFrame) -> None:
    """shard-<k>/loudness.csv (into the shard's folder, or its temporary name): LOUDNESS_COLUMNS."""
    _check_columns(measured, LOUDNESS_COLUMNS, LOUDNESS_TABLE)
    measured.to_csv(Path(shard_dir) / LOUDNESS_TABLE, index=False)


def read_loudness(path: str | Path) -> pd.DataFrame:
    """A shard's loudness.csv: every LOUDNESS_COLUMNS column, the levels numbers (-inf for
    silence), the gain a finite number; one line naming the file otherwise."""
    return read_csv_table(
        path,
        "a shard's loudness",
        "tokenize",
        LOUDNESS_COLUMNS,
        numbers=["rms_dbfs", "lufs"],
        finite=["gain_db"],
    )


def write_files(codes_dir: Path, files: pd.DataFrame) -> Path:
    """data/codes/files.csv, atomically: FILES_COLUMNS, one row per clip."""
    _check_columns(files, FILES_COLUMNS, FILES)
    path = Path(codes_dir) / FILES
    with atomic_path(path) as tmp:
        files.to_csv(tmp, index=False)
    return path


def read_files(path: str | Path) -> pd.DataFrame:
    """data/codes/files.csv: every FILES_COLUMNS column, lengths, counts and shares numbers;
    one line naming the file otherwise."""
    return read_csv_table(
        path,
        "the codes' per-file table",
        "tokenize",
        FILES_COLUMNS,
        ints=["cb0_codes_used"],
        numbers=["rms_dbfs", "lufs"],
        finite=["seconds", "gain_db", "cb0_entropy_bits", "cb0_top_code_share"],
    )


# ----------------------------------------------------------------------------- codes.npy


def create_codes(path: Path, codebooks: int, frames: int) -> np.ndarray:
    """A shard's codes.npy, created as a writable memory map of (codebooks, frames) int16 codes."""
    return np.lib.format.open_memmap(path, mode="w+", dtype=CODES_DTYPE, shape=(codebooks, frames))


def open_codes(codes_dir: Path, shard: int) -> np.ndarray:
    """A shard's codes.npy, memory-mapped read-only, unchecked (read_codes has checked it once:
    training's check_codes before the data loaders open it)."""
    path = codes_path(codes_dir, shard)
    if not path.is_file():
        raise UserError(f"{path}: codes not found; run the tokenize stage first")
    try:
        return np.load(path, mmap_mode="r")
    except Exception as exc:  # noqa: BLE001
        raise UserError(f"{path}: not a readable .npy array ({exc})") from None


def read_codes(
    path: str | Path, frames: int, codebooks: int | None, codebook_size: int, what: str = "codes"
) -> np.ndarray:
    """A shard's codes.npy, memory-mapped read-only: an integer array of at least `codebooks` rows
    (None: all it has) and `frames` columns whose every value of those rows lies in
    [0, codebook_size), or is -1 (a frame outside every clip). Every value is checked once (one
    pass over the file, in blocks)."""
    path = Path(path)
    check_file(path, what, "tokenize")
    try:
        codes = np.load(path, mmap_mode="r")
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line error
        raise ReadError(f"{path}: not a readable .npy array ({one_line(exc)}); rerun the tokenize stage") from None
    if codes.dtype.kind not in "iu":
        raise ReadError(f"{path}: {codes.dtype} values; codes are whole numbers; rerun the tokenize stage")
    if codes.ndim == 2 and codebooks is None:
        codebooks = codes.shape[0]
    if codes.ndim != 2 or codes.shape[0] < codebooks or codes.shape[1] != frames:
        raise ReadError(
            f"{path}: shape {codes.shape}, expected ({codebooks}+, {frames}) for its shard's audio; "
            "rerun the tokenize stage"
        )
    step = max(1, SCAN_BLOCK // max(codebooks, 1))
    for start in range(0, frames, step):
        block = np.asarray(codes[:codebooks, start : start + step])
        low, high = int(block.min()), int(block.max())
        if low < -1 or high >= codebook_size:
            row, col = np.argwhere((block < -1) | (block >= codebook_size))[0]
            raise ReadError(
                f"{path}: code {int(block[row, col])} at codebook {row}, frame {start + col} lies outside "
                f"the codebook (0-{codebook_size - 1}); rerun the tokenize stage"
            )
    return codes
