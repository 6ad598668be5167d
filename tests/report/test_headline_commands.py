"""report/headline_commands.py: `amlm metrics`, its options and its entry."""

import json
from pathlib import Path

from helpers import run_command

from acoustic_mlm.report import headline_commands as H


def test_metrics_defaults_are_the_pipeline_files():
    import argparse

    args = H.metrics_command.add_parser(argparse.ArgumentParser().add_subparsers()).parse_args([])
    assert (args.finals, args.claims, args.out) == (
        Path("results/final_losses.json"),
        Path("results/claims.json"),
        Path("results/metrics.json"),
    )


def test_metrics_command_writes_the_flat_file(tmp_path, smoke_config):
    (tmp_path / "f.json").write_text(json.dumps({"clip1": 8.0}))
    (tmp_path / "c.json").write_text(json.dumps({"verdicts": {"a": "inconclusive"}}))
    out = tmp_path / "m.json"
    argv = ["--finals", str(tmp_path / "f.json"), "--claims", str(tmp_path / "c.json"), "--out", str(out)]
    run_command(H.metrics_command, smoke_config, *argv)
    assert json.loads(out.read_text()) == {"clip1": 8.0, "claim_a": "inconclusive"}
