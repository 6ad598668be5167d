"""A round's table is read for its meaning (issue: bad input on run tables): every fault below, made in a
copy of the confirmatory round's published runs.csv, is refused in one line naming the file, before any
verdict is written; a lost run is "not finished" only when the judge is asked for a partial round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acoustic_mlm.cli import main
from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import judge as J

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "data" / "reference" / "confirm_round" / "runs.csv"


def _round(tmp_path: Path, edit) -> Path:
    """confirm_round's declaration over a copy of its runs.csv, edited by `edit(lines) -> lines`."""
    tables = tmp_path / "tables"
    tables.mkdir()
    lines = PUBLISHED.read_text().splitlines(keepends=True)
    (tables / "runs.csv").write_text("".join(edit(lines)))
    text = (ROOT / "config" / "experiments" / "confirm_round.yaml").read_text()
    decl = tmp_path / "confirm_round.yaml"
    decl.write_text(text.replace("tables: data/reference/confirm_round", f"tables: {tables}"))
    for other in ("pb_relax_confirm", "pb_relax_confirm_pilot"):  # the family's other round, as published
        (tmp_path / f"{other}.yaml").write_text((ROOT / "config" / "experiments" / f"{other}.yaml").read_text())
    return decl


def _field(line: str, column: str, value: str) -> str:
    header = PUBLISHED.read_text().splitlines()[0].split(",")
    cells = line.rstrip("\n").split(",")
    cells[header.index(column)] = value
    return ",".join(cells) + "\n"


def _row_of(lines, arm, seed, lr="0.05"):
    return next(i for i, x in enumerate(lines) if f",{arm},{lr},{seed}," in x)


FAULTS = {
    "every row twice": (lambda ls: ls + ls[1:], "repeats round 3 S1 prenorm_clip1 lr 0.05 seed 101"),
    "one row twice": (lambda ls: ls + [ls[5]], "repeats round 3"),
    "a seed outside the plan": (
        lambda ls: ls[:1] + [ls[1].replace(",101,", ",199,", 1)] + ls[2:],
        "(S1 prenorm_clip1 lr 0.05 seed 199) is not in the round's plan",
    ),
    "a lost seed": (
        lambda ls: ls[:1] + ls[2:],
        "1 planned run(s) missing, the first S1 prenorm_clip1 lr 0.05 seed 101",
    ),
    "a lost and a doubled seed": (lambda ls: ls[:1] + ls[2:] + [ls[2]], "repeats round 3"),
    "a fractional count": (
        lambda ls: ls[:1] + [_field(ls[1], "nonfinite_steps", "0.5")] + ls[2:],
        "not a whole number",
    ),
    "an infinite count": (lambda ls: ls[:1] + [_field(ls[1], "spikes", "inf")] + ls[2:], "column 'spikes', row 2"),
    "an empty count": (lambda ls: ls[:1] + [_field(ls[1], "late_spikes", "")] + ls[2:], "column 'late_spikes', row 2"),
    "a NaN plateau": (lambda ls: ls[:1] + [_field(ls[1], "plateau", "nan")] + ls[2:], "column 'plateau', row 2"),
    "an infinite wall time": (lambda ls: ls[:1] + [_field(ls[1], "wall_time_s", "inf")] + ls[2:], "'wall_time_s'"),
    "a status outside the package's words": (
        lambda ls: ls[:1] + [_field(ls[1], "status", "finished")] + ls[2:],
        "'finished' is not one of completed",
    ),
    "a norm outside the package's words": (
        lambda ls: ls[:1] + [_field(ls[1], "norm", "fp64")] + ls[2:],
        "'fp64' is not one of pre",
    ),
    "a flag that is not True or False": (
        lambda ls: ls[:1] + [_field(ls[1], "trained", "yes")] + ls[2:],
        "column 'trained', row 2",
    ),
    "a trained flag its losses contradict": (
        lambda ls: ls[:1] + [_field(ls[1], "trained", "True")] + ls[2:],
        "'trained' is True but its losses",
    ),
    "a table cut inside its last row": (lambda ls: ls[:-1] + [ls[-1][: len(ls[-1]) // 2]], "cut short"),
    "a table cut after a field": (lambda ls: ls[:-1] + [ls[-1][: ls[-1].index(",") + 1] + "\n"], "fields"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_damaged_or_unplanned_table_is_refused_in_one_line(fault, tmp_path):
    edit, words = FAULTS[fault]
    decl = _round(tmp_path, edit)
    with pytest.raises(UserError) as err:
        J.judge(decl, tmp_path / "out")
    message = str(err.value)
    assert words in message and "\n" not in message and str(tmp_path / "tables" / "runs.csv") in message
    assert not (tmp_path / "out" / "verdicts.json").exists()


def test_the_command_line_exits_2_with_the_line(tmp_path, capsys):
    decl = _round(tmp_path, lambda ls: ls + ls[1:])
    assert main(["experiment", "judge", str(decl), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "repeats round 3" in err


def test_a_partial_round_judges_the_finished_parts_and_leaves_the_rest_not_finished(tmp_path):
    def drop_p2(lines):
        i = _row_of(lines, "prenorm_clip10", 105)
        return lines[:i] + lines[i + 1 :]

    decl = _round(tmp_path, drop_p2)
    result = J.judge(decl, tmp_path / "out", partial=True)["verdict"]
    by = {v["id"]: v for v in result["verdicts"]}
    assert by["P2"]["verdict"] == "not finished" and by["P2"]["n_b"] == 11
    assert by["P1"]["verdict"] == by["P3"]["verdict"] == "supported"
    fam = json.loads((tmp_path / "out" / "family_confirmatory.json").read_text())
    assert fam["finished"] is False and not any("p_holm" in m for m in fam["members"])
