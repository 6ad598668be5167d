"""The checked readers: a good file reads back typed; a missing or damaged one is one ReadError line
naming the file, what is wrong and the stage to rerun."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from acoustic_mlm import readers
from acoustic_mlm.errors import UserError


def _refused(call, path, *needles):
    """`call()` raises one ReadError line (a UserError) naming `path` and each needle."""
    with pytest.raises(readers.ReadError) as err:
        call()
    msg = str(err.value)
    assert isinstance(err.value, UserError) and "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


# ----------------------------------------------------------------------------- JSON


def test_read_json_reads_an_object_with_its_required_keys(tmp_path):
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"frames": 1024, "loss": 0.5, "ok": True, "name": "x"}))
    obj = readers.read_json(path, "the fit", "tokenize", {"frames": int, "loss": (int, float), "ok": bool})
    assert obj == {"frames": 1024, "loss": 0.5, "ok": True, "name": "x"}


@pytest.mark.parametrize("text, needles", [
    ('{"frames": 10', ("not valid JSON", "cut short or edited", "rerun the tokenize stage")),
    ("[1, 2]", ("a JSON list, not an object",)),
    ('{"loss": 1.0}', ("lacks 'frames'",)),
    ('{"frames": "10"}', ("'frames' is '10', not int",)),
    ('{"frames": true}', ("'frames' is true, not int",)),  # bool is never an int here
    ('{"frames": 1, "loss": NaN}', ("'loss' is nan",)),
])
def test_read_json_refuses_damage_in_one_line(tmp_path, text, needles):
    path = tmp_path / "fit.json"
    path.write_text(text)
    _refused(lambda: readers.read_json(path, "the fit", "tokenize", {"frames": int, "loss": float}), path, *needles)


def test_a_missing_file_names_the_stage_to_run_and_a_folder_is_not_a_file(tmp_path):
    _refused(lambda: readers.read_json(tmp_path / "fit.json", "the fit", "tokenize"), tmp_path / "fit.json",
             "the fit not found; run the tokenize stage first")
    (tmp_path / "dir.json").mkdir()
    _refused(lambda: readers.read_json(tmp_path / "dir.json", "", "tokenize"), tmp_path / "dir.json",
             "not a regular file; rerun the tokenize stage")


def test_tokenizer_and_seed_summaries(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"n_codebooks": 2, "max_code": [1023, -1], "codebook_size": 1024}))
    assert readers.read_tokenizer_summary(path)["max_code"] == [1023, -1]
    path.write_text(json.dumps({"n_codebooks": 2, "max_code": [1024, 3], "codebook_size": 1024}))
    _refused(lambda: readers.read_tokenizer_summary(path), path, "'max_code' holds 1024, outside 0-1023")
    path.write_text(json.dumps({"n_codebooks": 3, "max_code": [1, 2], "codebook_size": 1024}))
    _refused(lambda: readers.read_tokenizer_summary(path), path, "'n_codebooks' is 3 but 'max_code' lists 2")
    summary = tmp_path / "summary.json"
    good = {"status": "completed", "final_train_loss_cb0": 7.5, "final_valid_loss_cb0": 8, "nonfinite_steps": 0,
            "fingerprint": {}}
    summary.write_text(json.dumps(good))
    assert readers.read_seed_summary(summary) == good
    summary.write_text(json.dumps({**good, "nonfinite_steps": 0.5}))
    _refused(lambda: readers.read_seed_summary(summary), summary, "'nonfinite_steps' is 0.5, not int",
             "rerun the train stage")


# ----------------------------------------------------------------------------- codes


def test_read_codes_reads_codes_and_refuses_wrong_shapes_types_and_values(tmp_path):
    path = tmp_path / "codes.npy"
    codes = np.array([[0, 5, -1, 1023], [1, 2, -1, 0], [9, 9, 9, 9]], dtype=np.int16)
    np.save(path, codes)
    assert np.array_equal(readers.read_codes(path, 4, 2, 1024), codes)  # the rows beyond 2 are not checked
    assert readers.read_codes(path, 4, None, 1024).shape == (3, 4)
    _refused(lambda: readers.read_codes(path, 5, 2, 1024), path, "shape (3, 4), expected (2+, 5)")
    _refused(lambda: readers.read_codes(path, 4, 2, 512), path,
             "code 1023 at codebook 0, frame 3 lies outside the codebook (0-511); rerun the tokenize stage")
    np.save(path, codes.astype(np.float32))
    _refused(lambda: readers.read_codes(path, 4, 2, 1024), path, "float32 values; codes are whole numbers")
    path.write_bytes(b"\x93NUMPY garbage")
    _refused(lambda: readers.read_codes(path, 4, 2, 1024), path, "not a readable .npy array")


# ----------------------------------------------------------------------------- CSV


def _table(path):
    return readers.read_csv_table(path, "the table", "prepare", ["name", "n"], ints=["n"], numbers=["x"],
                                  finite=["y"], choices={"split": ("train", "valid")})


def test_read_csv_table_types_the_columns_it_is_told_and_keeps_text(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("name,n,x,y,split\nNA,3,,1.5,train\n007,4.0,nan,-2,valid\n")
    frame = _table(path)
    assert frame["name"].tolist() == ["NA", "007"]  # text stays text: no NaN, no leading zeros lost
    assert frame["n"].tolist() == [3, 4] and frame["n"].dtype == np.int64
    assert np.isnan(frame["x"]).all() and frame["y"].tolist() == [1.5, -2.0]


@pytest.mark.parametrize("text, needles", [
    ("", ("an empty file",)),
    ("name,n,x,y,split\na,1,2,3,train", ("cut short (its last row does not end with a line break)",)),
    ("name,n,x,y,split\na,1,2\n", ("row 2 has 3 fields, the header 5",)),
    ("name,x,y,split\na,2,3,train\n", ("missing column(s) n",)),
    ("name,n,x,y,split\n", ("no rows",)),
    ("name,n,x,y,split\na,one,2,3,train\n", ("column 'n', row 2: 'one' is not a number",)),
    ("name,n,x,y,split\na,1.5,2,3,train\n", ("column 'n', row 2: '1.5' is not a whole number",)),
    ("name,n,x,y,split\na,1,2,inf,train\n", ("column 'y', row 2 is inf; it must be a finite number",)),
    ("name,n,x,y,split\na,1,2,3,test\n", ("column 'split', row 2: 'test' is not one of train, valid",)),
])
def test_read_csv_table_refuses_damage_in_one_line(tmp_path, text, needles):
    path = tmp_path / "t.csv"
    path.write_text(text)
    _refused(lambda: _table(path), path, *needles, "rerun the prepare stage")


def test_read_csv_table_refuses_text_that_is_not_utf8(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"name,n\ncaf\xe9,1\n")
    _refused(lambda: readers.read_csv_table(path, "", "prepare", ["name"]), path, "not UTF-8 text")


def test_read_metrics_wants_increasing_steps_per_seed_and_the_figures_loss(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("seed,step,train_loss_cb0,grad_norm\n1,1,9.5,\n1,2,nan,0.5\n2,1,9.4,0.4\n")
    frame = readers.read_metrics(path)
    assert frame["step"].tolist() == [1, 2, 1] and np.isnan(frame["train_loss_cb0"].iloc[1])
    path.write_text("seed,step,train_loss_cb0\n1,2,9.5\n1,1,9.0\n")
    _refused(lambda: readers.read_metrics(path), path, "'step' must increase", "rerun the train stage")
    path.write_text("step,valid_loss_cb0\n1,9.5\n")
    _refused(lambda: readers.read_metrics(path), path, "missing column train_loss_cb0")


def test_read_curves_and_diagnostics(tmp_path):
    curves = tmp_path / "loss_curves.csv"
    row = "a,A,1,{step},train,0,9.5\n"
    curves.write_text(",".join(readers.CURVE_COLUMNS) + "\n" + row.format(step=10))
    assert readers.read_curves(curves)["loss_bits"].tolist() == [9.5]
    curves.write_text(",".join(readers.CURVE_COLUMNS) + "\n" + row.format(step=-1))
    _refused(lambda: readers.read_curves(curves), curves, "a negative step or codebook", "rerun the aggregate stage")
    diagnostics = tmp_path / "diagnostics.csv"
    diagnostics.write_text(",".join(readers.DIAGNOSTIC_COLUMNS) + "\n")
    assert readers.read_diagnostics(diagnostics).empty  # no diagnostics recorded is fine


def test_read_reference_reads_the_shipped_curves_and_refuses_a_step_of_zero(root, tmp_path):
    shipped = root / "data" / "reference" / "paper_curves.csv"
    frame = readers.read_reference(shipped)
    assert set(frame["role"]) == {"clip10", "clip1", "deepnorm", "attn_relax"} and (frame["step"] > 0).all()
    bad = tmp_path / "curves.csv"
    text = shipped.read_text().splitlines()
    first = text[1].split(",")
    first[3] = "0"
    bad.write_text("\n".join([text[0], ",".join(first), *text[2:]]) + "\n")
    _refused(lambda: readers.read_reference(bad), bad, "column 'step', row 2 is 0; steps are positive")
    _refused(lambda: readers.read_reference(tmp_path / "none.csv"), tmp_path / "none.csv",
             "the paper's digitised curves are not found")
    one_role = pd.read_csv(shipped, keep_default_na=False)
    one_role[one_role["role"] != "deepnorm"].to_csv(bad, index=False)
    _refused(lambda: readers.read_reference(bad), bad, "role deepnorm has 0 point(s)")


# ----------------------------------------------------------------------------- a seed's files for amlm status


def test_read_seed_status_refuses_a_cut_file_a_control_character_and_an_unknown_status(tmp_path):
    path = tmp_path / "summary.json"
    good = {"status": "completed", "steps": 100, "wall_time_s": 12.5, "label": "x"}
    path.write_text(json.dumps(good))
    assert readers.read_seed_status(path) == good
    text = json.dumps(good)
    for damaged, needles in [
        (text[:-7], ("not valid JSON", "cut short or edited", "rerun the train stage")),
        (text.replace('"x"', '"a\x07b"'), ("not valid JSON", "Invalid control character")),
        (text.replace("completed", "compl\\u0007eted"), ("'status' is 'compl\\x07eted', not one of completed",)),
        (json.dumps({**good, "steps": "100"}), ("'steps' is '100', not int",)),
        (json.dumps({**good, "steps": -1}), ("'steps' is -1, below 0",)),
        (json.dumps({**good, "wall_time_s": "1 s"}), ("'wall_time_s' is '1 s', not a finite number",)),
        (json.dumps({"status": "completed"}), ("lacks 'steps'",)),
    ]:
        path.write_text(damaged)
        _refused(lambda: readers.read_seed_status(path), path, *needles)
    path.write_text(json.dumps({**good, "status": "finished", "final_train_loss_cb0": 1, "final_valid_loss_cb0": 1,
                                "nonfinite_steps": 0, "fingerprint": {}}))
    _refused(lambda: readers.read_seed_summary(path), path, "'status' is 'finished', not one of completed")


def test_read_partial_metrics_wants_the_columns_status_reads(tmp_path):
    path = tmp_path / "metrics.partial.csv"
    path.write_text("step,train_loss_cb0,wall_time\n1,9.5,0.5\n2,nan,1.0\n")
    assert readers.read_partial_metrics(path)["wall_time"].tolist() == [0.5, 1.0]
    for text, needles in [
        ("step,train_loss_cb0\n1,9.5\n", ("missing column(s) wall_time", "rerun the train stage")),
        ("epoch,loss,time\n1,9.5,0.5\n", ("missing column(s) step",)),
        ("step,train_loss_cb0,wall_time,loss_scale\n1,9.5,0.5,128\n", ("missing column(s) overflow_skips",)),
        ("step,train_loss_cb0,wall_time\n1,9.5,0.5\n2,9.4,1.", ("cut short",)),
        ("step,train_loss_cb0,wall_time\n1,9.5,soon\n", ("column 'wall_time', row 2: 'soon' is not a number",)),
    ]:
        path.write_text(text)
        _refused(lambda: readers.read_partial_metrics(path), path, *needles)


# ----------------------------------------------------------------------------- a reference run


def _reference_copy(root, tmp_path, name="smoke_run"):
    import shutil

    folder = tmp_path / name
    shutil.copytree(root / "data" / "reference" / name, folder)
    return folder


def _reference_refused(call, path, *needles):
    with pytest.raises(readers.ReferenceDamaged) as err:
        call()
    msg = str(err.value)
    assert isinstance(err.value, readers.ReadError) and "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    for needle in (*needles, "the reference is damaged, not the run being checked", "amlm verify --record"):
        assert needle in msg, (needle, msg)
    return msg


def test_the_shipped_reference_runs_read_whole(root):
    for name in ("smoke_run", "default_run"):
        metrics, meta = readers.read_reference_run(root / "data" / "reference" / name)
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


@pytest.mark.parametrize("edit, needles", [
    (lambda t: t[: len(t) // 2], ("not valid JSON", "cut short or edited")),
    (lambda t: t.replace('"config": "config/smoke.yaml"', '"config": "config/sm\x01oke.yaml"'),
     ("not valid JSON", "Invalid control character")),
    (lambda t: "[" + t + "]", ("a JSON list, not an object",)),
    (lambda t: t.replace('"arms"', '"armz"'), ("lacks 'arms'",)),
    (lambda t: _json_edit(t, tolerance_bits=math.nan), ("'tolerance_bits' is NaN, not a finite number",)),
    (lambda t: _json_edit(t, tolerance_bits="tight"), ("'tolerance_bits' is 'tight'",)),
    (lambda t: _json_edit(t, tolerance_until_step=5, late_tolerance_bits=None),
     ("'late_tolerance_bits' is missing",)),
    (lambda t: _json_edit(t, tolerance_until_step=2.5), ("'tolerance_until_step' is 2.5, not a whole number",)),
    (lambda t: _json_edit(t, native_tolerance_bits=-1), ("'native_tolerance_bits' is -1",)),
    (lambda t: _json_edit(t, cpu_kernels="sse9"), ("'cpu_kernels' is 'sse9'",)),
    (lambda t: _json_edit(t, data_hashes={"tokenize": {"codes/shard-00000/codes.npy": "cut"}}),
     ("'data_hashes' must map each stage",)),
])
def test_a_damaged_reference_json_is_the_references_damage(root, tmp_path, edit, needles):
    folder = _reference_copy(root, tmp_path)
    path = folder / "reference.json"
    path.write_text(edit(path.read_text()))
    _reference_refused(lambda: readers.read_reference_json(path), path, *needles)
    _reference_refused(lambda: readers.read_reference_run(folder), path, *needles)


def _edit_rows(path, edit):
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(edit(lines)))


def _set_field(column, row, value):
    def edit(lines):
        header = lines[0].rstrip("\n").split(",")
        fields = lines[row].rstrip("\n").split(",")
        fields[header.index(column)] = value
        return [*lines[:row], ",".join(fields) + "\n", *lines[row + 1:]]
    return edit


@pytest.mark.parametrize("edit, needles", [
    (lambda lines: [*lines[:-1], lines[-1][: len(lines[-1]) // 2]], ("cut short (its last row does not end",)),
    (lambda lines: [*lines[:-1], lines[-1].rstrip("\n")], ("cut short",)),  # only the line break lost
    (lambda lines: ["a,b,c\n", "1,2,3\n"], ("missing column(s) run, seed, step, train_loss_cb0",)),
    (lambda lines: [lines[0].replace("train_loss_cb3,", "tr_loss_cb3,"), *lines[1:]],
     ("has train_loss_cb7 but no train_loss_cb3",)),
    (lambda lines: [lines[0].replace("valid_loss_cb7,", "valid_cb7,"), *lines[1:]],
     ("8 train_loss_cb<k> columns but 7 valid_loss_cb<k>",)),
    (_set_field("train_loss_cb0", 3, "nan"), ("column 'train_loss_cb0', row 4 is nan; it must be a finite number",)),
    (_set_field("valid_loss_cb5", 9, "inf"), ("column 'valid_loss_cb5', row 10 is inf",)),
    (_set_field("valid_loss_cb2", 4, ""), ("column 'valid_loss_cb2', row 5 is empty",)),
    (_set_field("grad_norm", 4, "big"), ("column 'grad_norm', row 5: 'big' is not a number",)),
    (_set_field("step", 4, "3.5"), ("column 'step', row 5: '3.5' is not a whole number",)),
    (lambda lines: [*lines[:3], lines[2], *lines[3:]], ("'step' must increase from row to row",)),
    (lambda lines: [*lines[:5], lines[5].rstrip("\n") + ",1\n", *lines[6:]],
     ("not a readable CSV", "Expected 48 fields in line 6, saw 49")),
])
def test_a_damaged_reference_metrics_csv_is_the_references_damage(root, tmp_path, edit, needles):
    folder = _reference_copy(root, tmp_path)
    path = folder / "metrics.csv"
    _edit_rows(path, edit)
    _reference_refused(lambda: readers.read_reference_metrics(path), path, *needles)
    _reference_refused(lambda: readers.read_reference_run(folder), path, *needles)


def test_a_reference_run_whose_two_files_disagree_or_lost_whole_rows(root, tmp_path):
    folder = _reference_copy(root, tmp_path)
    path = folder / "metrics.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # cut at a row boundary: the last arm ends early
    _reference_refused(lambda: readers.read_reference_run(folder), path,
                       "arm 'prenorm_attnrelax_clip1', seed 1 ends at step 128, not at its train.steps (150)")
    path.write_text("".join(line for line in lines if not line.startswith("prenorm_clip1,")))
    _reference_refused(lambda: readers.read_reference_run(folder), path, "no rows of arm 'prenorm_clip1'")
    path.write_text("".join([*lines, *(line.replace("prenorm_clip1,", "extra,", 1) for line in lines
                                        if line.startswith("prenorm_clip1,"))]))
    _reference_refused(lambda: readers.read_reference_run(folder), path, "rows of arm 'extra'")
    diverged = _set_field("diverged", len(lines) - 2, "1.0")(lines[:-1])  # stopped early, and says so: kept
    path.write_text("".join(diverged))
    assert readers.read_reference_run(folder)[0]["step"].iloc[-1] == 128
    # a path that names no reference is the user's slip, not damage: ReadError, not ReferenceDamaged
    _refused(lambda: readers.read_reference_run(tmp_path / "nothing"), tmp_path / "nothing", "not found",
             "a reference is a folder holding metrics.csv and reference.json")
    (folder / "reference.json").unlink()
    _refused(lambda: readers.read_reference_run(folder), folder / "reference.json", "not found")
