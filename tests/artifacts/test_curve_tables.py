"""artifacts/curve_tables.py: the aggregate stage's loss_curves.csv and diagnostics.csv read back typed;
a damaged one is one ReadError line naming the file, what is wrong and the stage to rerun."""

from __future__ import annotations

import pandas as pd
from helpers import read_refused

from acoustic_mlm.artifacts import curve_tables


def test_read_curves_and_diagnostics(tmp_path):
    curves = tmp_path / "loss_curves.csv"
    row = "a,A,1,{step},train,0,9.5\n"
    curves.write_text(",".join(curve_tables.COLUMNS) + "\n" + row.format(step=10))
    assert curve_tables.read_curves(curves)["loss_bits"].tolist() == [9.5]
    curves.write_text(",".join(curve_tables.COLUMNS) + "\n" + row.format(step=-1))
    read_refused(
        lambda: curve_tables.read_curves(curves), curves, "a negative step or codebook", "rerun the aggregate stage"
    )
    diagnostics = tmp_path / "diagnostics.csv"
    diagnostics.write_text(",".join(curve_tables.DIAGNOSTIC_COLUMNS) + "\n")
    assert curve_tables.read_diagnostics(diagnostics).empty  # no diagnostics recorded is fine


def test_the_written_tables_read_back(tmp_path):
    frame = pd.DataFrame([["a", "A", 1, 10, "train", 0, 9.5, 0]], columns=curve_tables.COLUMNS + ["nonfinite"])
    curve_tables.write_table(frame, tmp_path / curve_tables.LOSS_CURVES)
    back = curve_tables.read_curves(tmp_path / curve_tables.LOSS_CURVES)
    assert back.to_dict("records") == frame.to_dict("records")
    assert not list(tmp_path.glob(".*"))  # no temporary file left beside it
