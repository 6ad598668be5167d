"""The readers of the files no artifact module owns (the aggregate stage's tables, the paper's
curves): a good file reads back typed; a missing or damaged one is one ReadError line naming the file,
what is wrong and the stage to rerun. The checked reading they build on and the artifacts' own readers
are tested in tests/artifacts/."""

from __future__ import annotations

import pandas as pd
import pytest

from acoustic_mlm import readers
from acoustic_mlm.artifacts.checked import ReadError
from acoustic_mlm.errors import UserError


def _refused(call, path, *needles):
    """`call()` raises one ReadError line (a UserError) naming `path` and each needle."""
    with pytest.raises(ReadError) as err:
        call()
    msg = str(err.value)
    assert isinstance(err.value, UserError) and "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


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
    _refused(
        lambda: readers.read_reference(tmp_path / "none.csv"),
        tmp_path / "none.csv",
        "the paper's digitised curves are not found",
    )
    one_role = pd.read_csv(shipped, keep_default_na=False)
    one_role[one_role["role"] != "deepnorm"].to_csv(bad, index=False)
    _refused(lambda: readers.read_reference(bad), bad, "role deepnorm has 0 point(s)")
