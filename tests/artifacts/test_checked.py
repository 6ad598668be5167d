"""The checked reading every reader builds on: a good JSON object or CSV table reads back typed; a
missing or damaged one is one ReadError line naming the file, what is wrong and the stage to rerun
(or, for a file to restore, what to do)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import read_refused

from acoustic_mlm.artifacts import checked

# ----------------------------------------------------------------------------- JSON


def test_read_json_reads_an_object_with_its_required_keys(tmp_path):
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"frames": 1024, "loss": 0.5, "ok": True, "name": "x"}))
    obj = checked.read_json(path, "the fit", "tokenize", {"frames": int, "loss": (int, float), "ok": bool})
    assert obj == {"frames": 1024, "loss": 0.5, "ok": True, "name": "x"}


@pytest.mark.parametrize(
    "text, needles",
    [
        ('{"frames": 10', ("not valid JSON", "cut short or edited", "rerun the tokenize stage")),
        ("[1, 2]", ("a JSON list, not an object",)),
        ('{"loss": 1.0}', ("lacks 'frames'",)),
        ('{"frames": "10"}', ("'frames' is '10', not int",)),
        ('{"frames": true}', ("'frames' is true, not int",)),  # bool is never an int here
        ('{"frames": 1, "loss": NaN}', ("'loss' is nan",)),
    ],
)
def test_read_json_refuses_damage_in_one_line(tmp_path, text, needles):
    path = tmp_path / "fit.json"
    path.write_text(text)
    read_refused(lambda: checked.read_json(path, "the fit", "tokenize", {"frames": int, "loss": float}), path, *needles)


def test_a_missing_file_names_the_stage_to_run_and_a_folder_is_not_a_file(tmp_path):
    read_refused(
        lambda: checked.read_json(tmp_path / "fit.json", "the fit", "tokenize"),
        tmp_path / "fit.json",
        "the fit not found; run the tokenize stage first",
    )
    (tmp_path / "dir.json").mkdir()
    read_refused(
        lambda: checked.read_json(tmp_path / "dir.json", "", "tokenize"),
        tmp_path / "dir.json",
        "not a regular file; rerun the tokenize stage",
    )
    restore = checked.Advice("restore it from the archive")  # a file restored, not a stage rerun
    read_refused(
        lambda: checked.read_json(tmp_path / "gone.json", "the record", restore),
        tmp_path / "gone.json",
        "the record not found; restore it from the archive",
    )
    (tmp_path / "ref.json").write_text('{"a": 1')
    read_refused(
        lambda: checked.read_json(tmp_path / "ref.json", "", restore),
        tmp_path / "ref.json",
        "cut short or edited: restore it from the archive",
    )


# ----------------------------------------------------------------------------- CSV


def _table(path):
    return checked.read_csv_table(
        path,
        "the table",
        "prepare",
        ["name", "n"],
        ints=["n"],
        numbers=["x"],
        finite=["y"],
        choices={"split": ("train", "valid")},
    )


def test_read_csv_table_types_the_columns_it_is_told_and_keeps_text(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("name,n,x,y,split\nNA,3,,1.5,train\n007,4.0,nan,-2,valid\n")
    frame = _table(path)
    assert frame["name"].tolist() == ["NA", "007"]  # text stays text: no NaN, no leading zeros lost
    assert frame["n"].tolist() == [3, 4] and frame["n"].dtype == np.int64
    assert np.isnan(frame["x"]).all() and frame["y"].tolist() == [1.5, -2.0]


@pytest.mark.parametrize(
    "text, needles",
    [
        ("", ("an empty file",)),
        ("name,n,x,y,split\na,1,2,3,train", ("cut short (its last row does not end with a line break)",)),
        ("name,n,x,y,split\na,1,2\n", ("row 2 has 3 fields, the header 5",)),
        ("name,x,y,split\na,2,3,train\n", ("missing column(s) n",)),
        ("name,n,x,y,split\n", ("no rows",)),
        ("name,n,x,y,split\na,one,2,3,train\n", ("column 'n', row 2: 'one' is not a number",)),
        ("name,n,x,y,split\na,1.5,2,3,train\n", ("column 'n', row 2: '1.5' is not a whole number",)),
        ("name,n,x,y,split\na,1,2,inf,train\n", ("column 'y', row 2 is inf; it must be a finite number",)),
        ("name,n,x,y,split\na,1,2,3,test\n", ("column 'split', row 2: 'test' is not one of train, valid",)),
    ],
)
def test_read_csv_table_refuses_damage_in_one_line(tmp_path, text, needles):
    path = tmp_path / "t.csv"
    path.write_text(text)
    read_refused(lambda: _table(path), path, *needles, "rerun the prepare stage")


def test_read_csv_table_refuses_text_that_is_not_utf8(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"name,n\ncaf\xe9,1\n")
    read_refused(lambda: checked.read_csv_table(path, "", "prepare", ["name"]), path, "not UTF-8 text")


@pytest.mark.parametrize(
    "encoding, named",
    [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")],
)
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_utf16_or_utf32_table_is_named_by_its_encoding_not_as_cut_or_missing_columns(
    tmp_path, encoding, named, newline
):
    from acoustic_mlm.artifacts.metrics import read_metrics

    path = tmp_path / "metrics.csv"
    text = newline.join(["step,train_loss_cb0,valid_loss_cb0", "1,9.5,9.6", "2,9.4,9.5"]) + newline
    path.write_bytes(text.encode(encoding))
    with pytest.raises(checked.ReadError) as refused:
        read_metrics(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: {named} text, not UTF-8; save it as UTF-8") and "\n" not in message
    assert "cut short" not in message and "missing column" not in message
    path.write_text(text, encoding="utf-8")  # the same table as UTF-8 reads
    assert read_metrics(path)["step"].tolist() == [1, 2]
