"""`amlm preflight`: its options become `Options`; --threads falls back to train.threads."""

import argparse
from pathlib import Path

import pytest
from helpers import run_command

from acoustic_mlm.preflight import run
from acoustic_mlm.preflight.preflight_commands import preflight_command


@pytest.fixture()
def measured(monkeypatch):
    """The stage's arguments, in place of measuring."""
    calls = []
    monkeypatch.setattr(run, "run", lambda *a: calls.append(a))
    return calls


def test_the_options_left_out_keep_the_presets_values(smoke_config, measured):
    run_command(preflight_command, smoke_config, "--config", "config/smoke.yaml")
    ((c, config, out, options),) = measured
    assert (c, config, out) == (smoke_config, "config/smoke.yaml", Path("results"))
    assert options == run.Options(threads=smoke_config.train.threads)


def test_each_option_given_reaches_its_field(smoke_config, measured):
    argv = ["--out", "o", "--threads", "2", "--micro-batch", "3", "--precision", "bf16", "--no-full-update"]
    argv += ["--every-model", "--utilisation", "0.5", "--nodes", "2", "--gpus-per-node", "4", "--corpus-hours", "1.5"]
    run_command(preflight_command, smoke_config, *argv)
    ((_, _, out, options),) = measured
    assert out == Path("o")
    assert options == run.Options(
        threads=2,
        micro_batch=3,
        precision="bf16",
        full_update=False,
        every_model=True,
        utilisation=0.5,
        nodes=2,
        gpus_per_node=4,
        corpus_hours=1.5,
    )


def test_every_option_is_a_field_of_options():
    fields = {f for f in run.Options.__dataclass_fields__}
    parser = preflight_command.add_parser(argparse.ArgumentParser().add_subparsers())
    dests = {a.dest for a in parser._actions} - {"help", "config", "verbose", "quiet", "out"}  # every command's
    assert dests <= fields, dests - fields
