"""The report stage's commands: each reaches its function with its options; status's and verify's
own checks refuse bad values before any work."""

from pathlib import Path

import pytest
from helpers import run_command

from acoustic_mlm.errors import UserError
from acoustic_mlm.report import (
    aggregate,
    claims,
    decisive,
    figure,
    stability,
    stability_map,
    stability_map_figure,
    status,
    verify,
)
from acoustic_mlm.report import report_commands as R


def _record(monkeypatch, module, name, result=None):
    calls = []
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append((a, k)) or result)
    return calls


P = Path
CASES = [
    (
        R.aggregate_command,
        [],
        aggregate,
        "run",
        (P("results/runs"), P("results/loss_curves.csv")),
        {"finals_path": None},
    ),
    (
        R.aggregate_command,
        ["--finals", "f.json"],
        aggregate,
        "run",
        (P("results/runs"), P("results/loss_curves.csv")),
        {"finals_path": P("f.json")},
    ),
    (
        R.figure_command,
        ["--reference", "r.csv"],
        figure,
        "run",
        (P("results/loss_curves.csv"), P("results/figures")),
        {"reference_path": P("r.csv")},
    ),
    (
        R.stability_command,
        [],
        stability,
        "run",
        (P("results/loss_curves.csv"), P("results/diagnostics.csv"), P("results/figures")),
        {},
    ),
    (
        R.claims_command,
        ["--out-md", "c.md"],
        claims,
        "run",
        (P("results/loss_curves.csv"), P("results/claims.json"), P("c.md")),
        {"reference_path": None, "diagnostics_path": P("results/diagnostics.csv")},
    ),
    (
        R.compare_command,
        [],
        figure,
        "compare",
        (P("results/loss_curves.csv"), P("results/figures/paper_vs_reproduction.png")),
        {"reference_path": None},
    ),
    (R.map_command, [], stability_map, "run_table", (P("results/runs"), P("results/stability_map.csv")), {}),
    (
        R.map_figure_command,
        [],
        stability_map_figure,
        "run_figure",
        (P("results/stability_map.csv"), P("results/figures")),
        {},
    ),
    (
        R.map_claims_command,
        [],
        stability_map,
        "run_claims",
        (P("results/stability_map.csv"), P("results/map_claims.json"), P("results/map_claims.md")),
        {},
    ),
    (R.status_command, ["--stale-after", "2"], status, "run", (P("results/runs"),), {"stale_after": 120.0}),
]


@pytest.mark.parametrize("command, argv, module, name, args, kwargs", CASES, ids=[c[0].name for c in CASES])
def test_each_command_calls_its_function_with_its_options(
    monkeypatch, smoke_config, command, argv, module, name, args, kwargs
):
    calls = _record(monkeypatch, module, name)
    assert run_command(command, smoke_config, *argv) is None
    assert calls == [((smoke_config, *args), kwargs)]


def test_decide_reads_no_configuration(monkeypatch, smoke_config):
    calls = _record(monkeypatch, decisive, "run")
    run_command(R.decide_command, smoke_config, "--runs-table", "t.csv", "--numerics", "n.csv")
    assert calls == [((P("results/runs"), P("data/codes"), P("results/decisive"), P("n.csv"), P("t.csv")), {})]


@pytest.mark.parametrize("minutes", ["0", "-1", "nan"])
def test_status_refuses_a_stale_time_that_is_not_positive(monkeypatch, smoke_config, minutes):
    calls = _record(monkeypatch, status, "run")
    with pytest.raises(UserError, match="--stale-after must be a positive number of minutes"):
        run_command(R.status_command, smoke_config, "--stale-after", minutes)
    assert calls == []


def test_verify_compares_with_the_presets_reference_and_returns_its_status(monkeypatch, smoke_config):
    calls = _record(monkeypatch, verify, "run", result=1)
    monkeypatch.setattr(verify, "default_reference", lambda config: P("ref") / P(config).name)
    assert run_command(R.verify_command, smoke_config, "--config", "config/smoke.yaml", "--tolerance", "0.5") == 1
    args = (
        smoke_config,
        P("results/runs"),
        P("ref/smoke.yaml"),
        P("results/figures/reference_check.png"),
        0.5,
        P("data"),
    )
    assert calls == [(args, {})]


def test_verify_records_with_the_command_that_made_the_run(monkeypatch, smoke_config):
    calls = _record(monkeypatch, verify, "record")
    assert (
        run_command(
            R.verify_command,
            smoke_config,
            "--config",
            "c.yaml",
            "--runs-dir",
            "r",
            "--record",
            "out",
            "--until-step",
            "9",
        )
        == 0
    )
    ((args, kwargs),) = calls
    assert args == (
        smoke_config,
        P("c.yaml"),
        P("r"),
        P("out"),
        "snakemake --cores all --configfile c.yaml, then amlm verify --config c.yaml --runs-dir r --record out",
    )
    assert kwargs == {
        "until_step": 9,
        "late_tolerance_bits": None,
        "native_tolerance_bits": None,
        "data_dir": P("data"),
    }
    calls.clear()
    run_command(R.verify_command, smoke_config, "--record", "out", "--tolerance", "0.25")
    assert calls[0][1]["tolerance_bits"] == 0.25


def test_verify_refuses_a_negative_tolerance(monkeypatch, smoke_config):
    calls = _record(monkeypatch, verify, "run")
    with pytest.raises(UserError, match="--tolerance must be a number of bits >= 0, not -1.0"):
        run_command(R.verify_command, smoke_config, "--tolerance", "-1")
    assert calls == []


def test_the_output_paths_checked_before_any_work():
    assert {
        c.name: (c.folders, c.files)
        for c in (R.aggregate_command, R.figure_command, R.claims_command, R.decide_command, R.map_command)
    } == {
        "aggregate": ((), ("out",)),
        "figure": (("out",), ()),
        "claims": ((), ("out_json", "out_md")),
        "decide": (("out",), ()),
        "map": ((), ()),
    }
