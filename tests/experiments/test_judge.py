"""Every published round re-judged from its published tables by `amlm experiment judge` gives its
published verdict files: byte for byte where the round's rules are unchanged, and where the published
verdict carried an "excluded effect" (confirm_round's P2 and A/A pair), the same JSON with that reading
replaced by the difference of shares and its 95 % Newcombe interval (verdicts_restated.json beside it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acoustic_mlm.experiments import judge as J

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "data" / "reference"
DECL = ROOT / "config" / "experiments"


def _judge(name: str, tmp_path: Path) -> Path:
    out = tmp_path / name
    J.judge(DECL / f"{name}.yaml", out)
    return out


@pytest.mark.parametrize(
    "name, produced, published",
    [
        ("pb_relax_training", "verdict.json", "pb_relax_training/verdict.json"),
        ("pb_relax_confirm", "verdict.json", "pb_relax_confirm/verdict.json"),
        ("pb_relax_confirm", "family_confirmatory.json", "pb_relax_confirm/family_confirmatory.json"),
        ("pb_relax_confirm_pilot", "pilot.json", "pb_relax_confirm/pilot/pilot.json"),
        ("pb_relax_range", "verdict.json", "pb_relax_range/verdict.json"),
        ("proxy_sizing", "verdict_S1_r2.json", "proxy_sizing/verdict_S1_r2.json"),
        ("proxy_sizing_r1", "verdict_S1.json", "proxy_sizing/verdict_S1.json"),
        ("confirm_round", "sensitivity.csv", "confirm_round/sensitivity.csv"),
        ("confirm_round", "verdicts.json", "confirm_round/verdicts_restated.json"),
        ("confirm_round", "family_confirmatory.json", "confirm_round/family_confirmatory.json"),
    ],
)
def test_a_published_round_rejudges_byte_for_byte(name, produced, published, tmp_path):
    out = _judge(name, tmp_path)
    assert (out / produced).read_bytes() == (REF / published).read_bytes()


def test_the_decisive_round_rejudges_to_decides_four_files(tmp_path):
    out = _judge("decisive", tmp_path)
    for f in ("decisive.json", "decisive.md", "cells.csv", "runs.csv"):
        assert (out / f).read_bytes() == (REF / "decisive" / f).read_bytes(), f


def test_confirm_round_differs_from_its_published_verdicts_only_by_the_interval(tmp_path):
    new = json.loads((_judge("confirm_round", tmp_path) / "verdicts.json").read_text())
    old = json.loads((REF / "confirm_round" / "verdicts.json").read_text())
    dropped, added = {"excluded_effect", "reading"}, {"difference", "interval_95"}
    for a, b in zip(new["verdicts"] + [new["aa"]], old["verdicts"] + [old["aa"]]):
        assert {k: v for k, v in a.items() if k not in added | {"rejects_identical_arms"}} == {
            k: v for k, v in b.items() if k not in dropped
        }
        assert ("excluded_effect" in b) == ("interval_95" in a) == (a["verdict"] == "undecided")
    p2 = new["verdicts"][1]
    assert (p2["trained_a"], p2["trained_b"], p2["difference"], p2["interval_95"]) == (11, 6, 0.4167, [0.0509, 0.6722])
    # the A/A pair at 19 of 20 trained cannot fail: its test rejects identical arms with chance < 0.01 %
    assert new["aa"]["rejects_identical_arms"] == pytest.approx(3.8159e-05, rel=1e-3)
    assert new["aa"]["difference"] == 0.1 and new["aa"]["interval_95"][0] < 0 < new["aa"]["interval_95"][1]


def test_the_confirmatory_family_under_holm_keeps_p1_and_p3_and_drops_round_5(tmp_path):
    fam = json.loads((_judge("confirm_round", tmp_path) / "family_confirmatory.json").read_text())
    by = {m["member"]: m for m in fam["members"]}
    assert fam["alpha"] == 0.025 and fam["control"] == "holm" and fam["finished"]
    assert [m for m in by if by[m]["kept"]] == ["confirm_round/P1", "confirm_round/P3"]
    r5 = by["pb_relax_confirm/R5"]
    assert r5["p"] == pytest.approx(1 / 70) and r5["p_holm"] == pytest.approx(2 / 70)  # 0.0286 > 0.025
    assert by["confirm_round/P3"]["p_holm"] == pytest.approx(4 * by["confirm_round/P3"]["p"])
    assert by["confirm_round/P2"]["p_holm"] == by["confirm_round/P2"]["p"]  # the largest: step-down keeps it


def test_status_reports_a_declaration_committed_after_its_runs_and_one_not_committed(tmp_path):
    published = J.git_status(DECL / "confirm_round.yaml")
    assert published["first_runs_committed"] is not None
    if published["committed"] is not None:  # a checkout with history: declared after the round's runs
        assert published["committed"] > published["first_runs_committed"]
        assert published["pre_registered"] is False and published["reading"] == "committed after its first runs"
    fresh = tmp_path / "confirm_round.yaml"
    fresh.write_text((DECL / "confirm_round.yaml").read_text())
    state = J.git_status(fresh)
    assert state["committed"] is None and state["pre_registered"] is False
    assert state["reading"].startswith("not committed")


ROUNDS_FROM_6 = ["dose_response", "qk_norm_factorial", "aa_control", "aa_margin", "p3_controls", "synth_sizing"]
ROUNDS_FROM_6 += ["synth_dose", "synth_dose_low"]


@pytest.mark.parametrize("name", ROUNDS_FROM_6)
def test_the_rounds_from_6_on_rejudge_byte_for_byte_as_far_as_they_have_run(name, tmp_path):
    """Rounds 6-13 are published as they run: their verdict files are what judge --partial writes from the
    tables committed beside them (every file judge writes, byte for byte)."""
    published = ROOT / "data" / "reference" / name
    if not (published / "runs.csv").exists():
        pytest.fail(f"{published}: no runs.csv; a declared round publishes its tables as it runs")
    written = J.judge(DECL / f"{name}.yaml", tmp_path, partial=True)["written"]
    assert written
    for path in map(Path, written):
        assert path.read_bytes() == (published / path.name).read_bytes(), path.name
