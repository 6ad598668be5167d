"""The codes' files: codes.npy created, opened and read checked (every value once), tokenizer.json's
codebooks, the fit and a shard's encoding record written and read back; damage is one ReadError line
naming the file and the stage to rerun; loudness.csv and files.csv written with their declared columns
and read back checked."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import read_refused

from acoustic_mlm.artifacts.codes import (
    ENCODE_RECORD,
    FILE_STATS_COLUMNS,
    FILES,
    FILES_COLUMNS,
    FIT,
    LOUDNESS_COLUMNS,
    LOUDNESS_TABLE,
    SUMMARY,
    codes_path,
    create_codes,
    open_codes,
    read_codes,
    read_encode_record,
    read_files,
    read_fit,
    read_loudness,
    read_tokenizer_summary,
    write_encode_record,
    write_files,
    write_fit,
    write_loudness,
    write_tokenizer_summary,
)
from acoustic_mlm.errors import UserError


def test_the_tokenizer_summary(tmp_path):
    path = tmp_path / SUMMARY
    write_tokenizer_summary(tmp_path, {"n_codebooks": 2, "max_code": [1023, -1], "codebook_size": 1024})
    assert read_tokenizer_summary(path)["max_code"] == [1023, -1]
    path.write_text(json.dumps({"n_codebooks": 2, "max_code": [1024, 3], "codebook_size": 1024}))
    read_refused(lambda: read_tokenizer_summary(path), path, "'max_code' holds 1024, outside 0-1023")
    path.write_text(json.dumps({"n_codebooks": 3, "max_code": [1, 2], "codebook_size": 1024}))
    read_refused(lambda: read_tokenizer_summary(path), path, "'n_codebooks' is 3 but 'max_code' lists 2")
    path.write_text(json.dumps({"n_codebooks": 2, "max_code": [1, True], "codebook_size": 1024}))
    read_refused(lambda: read_tokenizer_summary(path), path, "'max_code' must list whole numbers")


def test_the_fit_and_a_shards_encoding_record(tmp_path):
    write_fit(tmp_path, {"mode": "calibrated", "seed": 0})
    assert read_fit(tmp_path / FIT) == {"mode": "calibrated", "seed": 0}
    read_refused(
        lambda: read_fit(tmp_path / "none.json"),
        tmp_path / "none.json",
        "the tokenizer's fit not found; run the tokenize stage first",
    )
    record = {"clips": 3, "audio_seconds": 6.0, "encode_seconds": 1}
    write_encode_record(tmp_path, record)
    assert read_encode_record(tmp_path / ENCODE_RECORD) == record
    (tmp_path / ENCODE_RECORD).write_text(json.dumps({**record, "clips": 2.5}))
    read_refused(
        lambda: read_encode_record(tmp_path / ENCODE_RECORD), tmp_path / ENCODE_RECORD, "'clips' is 2.5, not int"
    )


def test_codes_created_are_read_back_and_opened_by_shard(tmp_path):
    path = codes_path(tmp_path, 2)
    assert path == tmp_path / "shard-00002" / "codes.npy"
    path.parent.mkdir()
    codes = create_codes(path, 3, 5)
    codes[:] = np.arange(15).reshape(3, 5)
    codes.flush()
    del codes
    assert read_codes(path, 5, None, 1024).dtype == np.int16
    assert np.array_equal(open_codes(tmp_path, 2), np.arange(15).reshape(3, 5))
    with pytest.raises(UserError, match=r"shard-00001/codes\.npy: codes not found; run the tokenize stage first"):
        open_codes(tmp_path, 1)
    path.write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(UserError, match=r"codes\.npy: not a readable \.npy array"):
        open_codes(tmp_path, 2)


def test_read_codes_reads_codes_and_refuses_wrong_shapes_types_and_values(tmp_path):
    path = tmp_path / "codes.npy"
    codes = np.array([[0, 5, -1, 1023], [1, 2, -1, 0], [9, 9, 9, 9]], dtype=np.int16)
    np.save(path, codes)
    assert np.array_equal(read_codes(path, 4, 2, 1024), codes)  # the rows beyond 2 are not checked
    assert read_codes(path, 4, None, 1024).shape == (3, 4)
    read_refused(lambda: read_codes(path, 5, 2, 1024), path, "shape (3, 4), expected (2+, 5)")
    read_refused(
        lambda: read_codes(path, 4, 2, 512),
        path,
        "code 1023 at codebook 0, frame 3 lies outside the codebook (0-511); rerun the tokenize stage",
    )
    np.save(path, codes.astype(np.float32))
    read_refused(lambda: read_codes(path, 4, 2, 1024), path, "float32 values; codes are whole numbers")
    path.write_bytes(b"\x93NUMPY garbage")
    read_refused(lambda: read_codes(path, 4, 2, 1024), path, "not a readable .npy array")


def _loudness():
    return pd.DataFrame(
        {"clip_id": ["a", "b"], "rms_dbfs": [-20.5, -np.inf], "lufs": [-23.25, -70.0], "gain_db": [1.5, 0.0]}
    )


def test_loudness_written_reads_back_and_damage_is_one_line(tmp_path):
    write_loudness(tmp_path, _loudness())
    path = tmp_path / LOUDNESS_TABLE
    assert path.read_text().splitlines() == ["clip_id,rms_dbfs,lufs,gain_db", "a,-20.5,-23.25,1.5", "b,-inf,-70.0,0.0"]
    back = read_loudness(path)
    assert back["gain_db"].tolist() == [1.5, 0.0] and back["rms_dbfs"].iloc[1] == -np.inf
    with pytest.raises(ValueError, match="clip_id, rms_dbfs, lufs, gain_db"):
        write_loudness(tmp_path, _loudness()[["clip_id", "gain_db"]])
    path.write_text("clip_id,rms_dbfs,gain_db\na,-20.5,1.5\n")
    read_refused(lambda: read_loudness(path), path, "missing column(s) lufs", "tokenize")
    path.write_text("clip_id,rms_dbfs,lufs,gain_db\na,-20.5,-23.25,nan\n")
    read_refused(lambda: read_loudness(path), path, "column 'gain_db', row 2", "finite")
    path.write_text("clip_id,rms_dbfs,lufs,gain_db\na,-20.5,-23.25,1.")
    read_refused(lambda: read_loudness(path), path, "cut short")


def test_files_table_written_reads_back_and_damage_is_one_line(tmp_path):
    files = pd.DataFrame(
        {"clip_id": ["a"], "path": ["a.flac"], "split": ["train"], "seconds": [6.0]}
        | {c: [v] for c, v in zip(LOUDNESS_COLUMNS[1:], (-24.56, -26.31, 3.53))}
        | {c: [v] for c, v in zip(FILE_STATS_COLUMNS, (175, 7.0258, 0.03111))}
    )
    path = write_files(tmp_path, files)
    assert path == tmp_path / FILES and list(files.columns) == list(FILES_COLUMNS)
    assert path.read_text().splitlines()[1] == "a,a.flac,train,6.0,-24.56,-26.31,3.53,175,7.0258,0.03111"
    back = read_files(path)
    assert back["cb0_codes_used"].tolist() == [175] and back["cb0_top_code_share"].tolist() == [0.03111]
    with pytest.raises(ValueError):
        write_files(tmp_path, files[list(reversed(FILES_COLUMNS))])
    path.write_text(path.read_text().replace(",175,", ",17.5,"))
    read_refused(lambda: read_files(path), path, "column 'cb0_codes_used', row 2", "not a whole")
    path.write_text(",".join(FILES_COLUMNS[:-1]) + "\n")
    read_refused(lambda: read_files(path), path, "missing column(s) cb0_top_code_share")


def test_a_finished_shards_codes_are_checked_against_their_record_before_a_resume_takes_them(tmp_path):
    """codes.npy cut short, changed, or recorded without its sha256: the shard is redone, never taken on trust."""
    from acoustic_mlm.artifacts.codes import CODES, ENCODE_RECORD, shard_codes_problem, write_encode_record
    from acoustic_mlm.utils import file_sha256

    folder = tmp_path / "shard-00000"
    folder.mkdir()
    codes = np.arange(8 * 30, dtype=np.int16).reshape(8, 30) % 1024
    np.save(folder / CODES, codes)
    record = {"clips": 1, "audio_seconds": 0.4, "encode_seconds": 0.1, "codes_sha256": file_sha256(folder / CODES)}
    write_encode_record(folder, record)
    assert shard_codes_problem(folder) is None
    other = codes.copy()
    other[0, 0] += 1
    np.save(folder / CODES, other)
    assert shard_codes_problem(folder) == f"its {CODES} is not the codes {ENCODE_RECORD} records (sha256 differs)"
    data = (folder / CODES).read_bytes()
    (folder / CODES).write_bytes(data[: len(data) // 3])
    assert shard_codes_problem(folder).startswith(f"its {CODES} is not a readable .npy array")
    np.save(folder / CODES, codes)
    write_encode_record(folder, {k: v for k, v in record.items() if k != "codes_sha256"})
    assert shard_codes_problem(folder) == f"its {ENCODE_RECORD} records no sha256 of {CODES}"
