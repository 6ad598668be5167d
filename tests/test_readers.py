"""The checked readers: a good file reads back typed; a missing or damaged one is one ReadError line
naming the file, what is wrong and the stage to rerun."""

from __future__ import annotations

import json

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
