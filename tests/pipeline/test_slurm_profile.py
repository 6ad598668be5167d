"""Under the SLURM profile, a compute node may have no network: the pretrained EnCodec checkpoint is brought by
a local rule on the submit host, and fit_tokenizer (a cluster job) waits for its record."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _workflow(config: str, workdir: Path):
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings

    cwd = os.getcwd()
    try:
        with SnakemakeApi(OutputSettings()) as api:
            wf = api.workflow(
                resource_settings=ResourceSettings(),
                config_settings=ConfigSettings(configfiles=[ROOT / "config" / config]),
                storage_settings=StorageSettings(),
                snakefile=ROOT / "Snakefile",
                workdir=workdir,
            )
            w = wf._workflow  # the parsed rules: what the profile's executor would be given
            return set(w._localrules), {r.name: [str(f) for f in r.input] for r in w.rules}
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("config,pretrained", [("paper.yaml", True), ("gpu-small.yaml", True), ("smoke.yaml", False)])
def test_the_checkpoint_is_fetched_by_a_local_rule_before_fit_tokenizer(tmp_path, config, pretrained):
    local, inputs = _workflow(config, tmp_path)
    assert "encodec_checkpoint" in local and "fetch" in local
    assert "fit_tokenizer" not in local and "tokenize_shard" not in local  # cluster jobs
    assert ("data/codes/checkpoint.json" in inputs["fit_tokenizer"]) == pretrained


def test_the_profile_keeps_the_checkpoint_rule_off_the_cluster():
    text = (ROOT / "profiles" / "slurm" / "config.yaml").read_text()
    assert "encodec_checkpoint" in text and "localrules" in text
