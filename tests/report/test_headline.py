"""report/headline.py: results/metrics.json, the flat file of each arm's final loss and each claim's verdict."""

import json

import pytest

from acoustic_mlm.artifacts.checked import ReadError
from acoustic_mlm.report import headline


def _write(tmp_path, finals, verdicts):
    f, c = tmp_path / "final_losses.json", tmp_path / "claims.json"
    f.write_text(json.dumps(finals))
    c.write_text(json.dumps({"verdicts": verdicts, "claims": []}))
    return f, c


def test_the_file_is_flat_the_arms_by_role_then_the_claims(tmp_path):
    finals = {"clip10": 7.93, "clip1": 8.05, "deepnorm": 7.06, "attn_relax": None}
    f, c = _write(tmp_path, finals, {"a": "reproduced", "b": "not reproduced"})
    out = headline.run(f, c, tmp_path / "metrics.json")
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written == out == {**finals, "claim_a": "reproduced", "claim_b": "not reproduced"}
    assert all(not isinstance(v, (dict, list)) for v in written.values())  # flat: one column each in dvc exp show


@pytest.mark.parametrize(
    "finals, verdicts, needle",
    [
        ({"clip10": "7.9"}, {"a": "reproduced"}, "'clip10' is '7.9', not a loss in bits; rerun the aggregate stage"),
        ({"clip10": True}, {"a": "reproduced"}, "'clip10' is True, not a loss in bits"),
        ({"clip10": 7.9}, {"a": 1}, "verdict 'a' is 1, not a verdict; rerun the claims stage"),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_naming_the_file_and_the_stage(tmp_path, finals, verdicts, needle):
    f, c = _write(tmp_path, finals, verdicts)
    with pytest.raises(ReadError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        headline.run(f, c, tmp_path / "metrics.json")
    assert not (tmp_path / "metrics.json").exists()


def test_a_missing_or_cut_input_is_refused_and_nothing_is_written(tmp_path):
    f, c = _write(tmp_path, {"clip10": 7.9}, {"a": "reproduced"})
    f.write_text('{"clip10": 7.')
    with pytest.raises(ReadError, match="final_losses.json"):
        headline.run(f, c, tmp_path / "metrics.json")
    c.unlink()
    f.write_text('{"clip10": 7.9}')
    with pytest.raises(ReadError, match="claims.json"):
        headline.run(f, c, tmp_path / "metrics.json")
    assert not (tmp_path / "metrics.json").exists()
