"""A reference run (amlm verify's known-good side): the shipped ones read whole, written back
byte for byte; a damaged reference.json or metrics.csv is one ReferenceDamaged line naming the file
and saying the reference, not the run being checked, is at fault."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import read_refused

from acoustic_mlm.artifacts.checked import ReadError
from acoustic_mlm.artifacts.reference_run import (
    META,
    METRICS,
    ReferenceDamaged,
    read_reference_json,
    read_reference_metrics,
    read_reference_run,
    write_reference_run,
)


def _reference_copy(root, tmp_path, name="smoke_run"):
    import shutil

    folder = tmp_path / name
    shutil.copytree(root / "data" / "reference" / name / "GenuineIntel", folder)
    return folder


def _reference_refused(call, path, *needles):
    with pytest.raises(ReferenceDamaged) as err:
        call()
    msg = str(err.value)
    assert isinstance(err.value, ReadError) and "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    for needle in (*needles, "the reference is damaged, not the run being checked", "amlm verify --record"):
        assert needle in msg, (needle, msg)
    return msg


def test_the_shipped_reference_runs_read_whole(root):
    for name in ("smoke_run/GenuineIntel", "smoke_run/AuthenticAMD", "default_run/GenuineIntel"):
        metrics, meta = read_reference_run(root / "data" / "reference" / name)
        assert set(metrics["run"]) == set(meta["arms"]) and metrics["step"].dtype == np.int64
        assert np.isfinite(metrics["train_loss_cb0"]).all() and meta["tolerance_bits"] > 0


def _json_edit(text: str, **changes) -> str:
    """reference.json with keys set (None: removed), written as json.dumps writes NaN."""
    meta = json.loads(text)
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    return json.dumps(meta)


@pytest.mark.parametrize(
    "edit, needles",
    [
        (lambda t: t[: len(t) // 2], ("not valid JSON", "cut short or edited")),
        (
            lambda t: t.replace('"config": "config/smoke.yaml"', '"config": "config/sm\x01oke.yaml"'),
            ("not valid JSON", "Invalid control character"),
        ),
        (lambda t: "[" + t + "]", ("a JSON list, not an object",)),
        (lambda t: t.replace('"arms"', '"armz"'), ("lacks 'arms'",)),
        (lambda t: _json_edit(t, tolerance_bits=math.nan), ("'tolerance_bits' is NaN, not a finite number",)),
        (lambda t: _json_edit(t, tolerance_bits="tight"), ("'tolerance_bits' is 'tight'",)),
        (
            lambda t: _json_edit(t, tolerance_until_step=5, late_tolerance_bits=None),
            ("'late_tolerance_bits' is missing",),
        ),
        (lambda t: _json_edit(t, tolerance_until_step=2.5), ("'tolerance_until_step' is 2.5, not a whole number",)),
        (lambda t: _json_edit(t, native_tolerance_bits=-1), ("'native_tolerance_bits' is -1",)),
        (lambda t: _json_edit(t, cpu_kernels="sse9"), ("'cpu_kernels' is 'sse9'",)),
        (
            lambda t: _json_edit(t, data_hashes={"tokenize": {"codes/shard-00000/codes.npy": "cut"}}),
            ("'data_hashes' must map each stage",),
        ),
    ],
)
def test_a_damaged_reference_json_is_the_references_damage(root, tmp_path, edit, needles):
    folder = _reference_copy(root, tmp_path)
    path = folder / "reference.json"
    path.write_text(edit(path.read_text()))
    _reference_refused(lambda: read_reference_json(path), path, *needles)
    _reference_refused(lambda: read_reference_run(folder), path, *needles)


def _edit_rows(path, edit):
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(edit(lines)))


def _set_field(column, row, value):
    def edit(lines):
        header = lines[0].rstrip("\n").split(",")
        fields = lines[row].rstrip("\n").split(",")
        fields[header.index(column)] = value
        return [*lines[:row], ",".join(fields) + "\n", *lines[row + 1 :]]

    return edit


@pytest.mark.parametrize(
    "edit, needles",
    [
        (lambda lines: [*lines[:-1], lines[-1][: len(lines[-1]) // 2]], ("cut short (its last row does not end",)),
        (lambda lines: [*lines[:-1], lines[-1].rstrip("\n")], ("cut short",)),  # only the line break lost
        (lambda lines: ["a,b,c\n", "1,2,3\n"], ("missing column(s) run, seed, step, train_loss_cb0",)),
        (
            lambda lines: [lines[0].replace("train_loss_cb3,", "tr_loss_cb3,"), *lines[1:]],
            ("has train_loss_cb7 but no train_loss_cb3",),
        ),
        (
            lambda lines: [lines[0].replace("valid_loss_cb7,", "valid_cb7,"), *lines[1:]],
            ("8 train_loss_cb<k> columns but 7 valid_loss_cb<k>",),
        ),
        (
            _set_field("train_loss_cb0", 3, "nan"),
            ("column 'train_loss_cb0', row 4 is nan; it must be a finite number",),
        ),
        (_set_field("valid_loss_cb5", 9, "inf"), ("column 'valid_loss_cb5', row 10 is inf",)),
        (_set_field("valid_loss_cb2", 4, ""), ("column 'valid_loss_cb2', row 5 is empty",)),
        (_set_field("grad_norm", 4, "big"), ("column 'grad_norm', row 5: 'big' is not a number",)),
        (_set_field("step", 4, "3.5"), ("column 'step', row 5: '3.5' is not a whole number",)),
        (lambda lines: [*lines[:3], lines[2], *lines[3:]], ("'step' must increase from row to row",)),
        (
            lambda lines: [*lines[:5], lines[5].rstrip("\n") + ",1\n", *lines[6:]],
            ("not a readable CSV", "Expected 48 fields in line 6, saw 49"),
        ),
    ],
)
def test_a_damaged_reference_metrics_csv_is_the_references_damage(root, tmp_path, edit, needles):
    folder = _reference_copy(root, tmp_path)
    path = folder / "metrics.csv"
    _edit_rows(path, edit)
    _reference_refused(lambda: read_reference_metrics(path), path, *needles)
    _reference_refused(lambda: read_reference_run(folder), path, *needles)


def test_a_reference_run_whose_two_files_disagree_or_lost_whole_rows(root, tmp_path):
    folder = _reference_copy(root, tmp_path)
    path = folder / "metrics.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # cut at a row boundary: the last arm ends early
    _reference_refused(
        lambda: read_reference_run(folder),
        path,
        "arm 'prenorm_attnrelax_clip1', seed 1 ends at step 128, not at its train.steps (150)",
    )
    path.write_text("".join(line for line in lines if not line.startswith("prenorm_clip1,")))
    _reference_refused(lambda: read_reference_run(folder), path, "no rows of arm 'prenorm_clip1'")
    path.write_text(
        "".join(
            [
                *lines,
                *(line.replace("prenorm_clip1,", "extra,", 1) for line in lines if line.startswith("prenorm_clip1,")),
            ]
        )
    )
    _reference_refused(lambda: read_reference_run(folder), path, "rows of arm 'extra'")
    diverged = _set_field("diverged", len(lines) - 2, "1.0")(lines[:-1])  # stopped early, and says so: kept
    path.write_text("".join(diverged))
    assert read_reference_run(folder)[0]["step"].iloc[-1] == 128
    # a path that names no reference is the user's slip, not damage: ReadError, not ReferenceDamaged
    read_refused(
        lambda: read_reference_run(tmp_path / "nothing"),
        tmp_path / "nothing",
        "not found",
        "a reference is a folder holding metrics.csv and reference.json",
    )
    (folder / "reference.json").unlink()
    read_refused(lambda: read_reference_run(folder), folder / "reference.json", "not found")


def test_a_reference_written_back_is_the_same_bytes(root, tmp_path):
    shipped = root / "data" / "reference" / "smoke_run" / "AuthenticAMD"
    metrics, meta = read_reference_run(shipped)
    arms = {run: rows.drop(columns=["run"]).reset_index(drop=True) for run, rows in metrics.groupby("run", sort=False)}
    out = write_reference_run(tmp_path / "again", arms, json.loads((shipped / META).read_text()))
    assert (out / METRICS).read_bytes() == (shipped / METRICS).read_bytes()
    assert json.loads((out / META).read_text()) == json.loads((shipped / META).read_text())
