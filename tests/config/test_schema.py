"""The JSON schema is generated from the dataclasses (config/schema.py): the shipped file equals the
generated one, every typed field is a key of it, the model's enums are in it, and Snakemake's fallback
validator (snakemake.utils.validate on the shipped file, workflow/rules/common.smk) refuses what the
package refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import pytest

from acoustic_mlm import config as C
from acoustic_mlm.config import schema
from acoustic_mlm.model import config as MC


def test_the_shipped_schema_is_the_generated_one(root):
    shipped = (root / "src/acoustic_mlm/config/config.schema.json").read_text()
    assert shipped == schema.text()
    assert json.loads(shipped) == schema.generate()
    out = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm.config", "--check"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no runpy warning either


def test_the_check_command_names_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "config.schema.json"
    stale.write_text(schema.text().replace('"minimum": 8000', '"minimum": 1'))
    monkeypatch.setattr(schema, "SCHEMA_PATH", stale)
    assert schema.main(["--check"]) == 1
    assert "stale; run python -m acoustic_mlm.config --write" in capsys.readouterr().err
    assert schema.main(["--write"]) == 0
    assert stale.read_text() == schema.text()
    assert schema.main(["--check"]) == 0


def test_every_section_field_is_a_schema_key_and_no_other():
    s = schema.generate()["properties"]
    sections = {
        "data": C.DataConfig,
        "tokenizer": C.TokenizerConfig,
        "model": C.ModelSection,
        "train": C.TrainSection,
        "figure": C.FigureConfig,
        "claims": C.ClaimThresholds,
    }
    for name, cls in sections.items():
        assert list(s[name]["properties"]) == [f.name for f in fields(cls)], name
        assert s[name]["additionalProperties"] is False
    arm = s["runs"]["additionalProperties"]
    assert list(arm["properties"]) == [f.name for f in fields(C.RunConfig) if f.name != "name"]
    assert arm["required"] == ["attention", "clip", "label", "norm", "seeds"]  # role is optional
    assert s["train"]["required"] == sorted(
        f.name
        for f in fields(C.TrainSection)
        if f.name not in ("nodes", "total_updates", "log_powers_of_two", "loggers", "wandb_project")
    )
    assert s["model"]["required"] == sorted(f.name for f in fields(C.ModelSection) if f.name != "cqt_impl")
    assert set(schema.generate()["required"]) == set(s) - {"sweep"}


def test_the_models_enums_and_bounds_come_from_its_declaration():
    s = schema.generate()["properties"]
    arm = s["runs"]["additionalProperties"]["properties"]
    assert arm["norm"] == {"enum": list(MC.NORMS), "description": arm["norm"]["description"]}
    assert arm["attention"]["enum"] == list(MC.ATTENTIONS)
    assert arm["role"]["enum"] == [*C.ROLES, None]
    assert s["model"]["properties"]["cqt_impl"]["enum"] == list(MC.CQT_IMPLS)
    assert s["train"]["properties"]["precision"]["enum"] == list(C.PRECISIONS)
    assert s["model"]["properties"]["conv_layers"] == {
        "type": "array",
        "minItems": 1,
        "items": {"type": "array", "minItems": 3, "maxItems": 3, "items": {"type": "integer", "minimum": 1}},
    }
    assert s["train"]["properties"]["betas"]["items"] == {"type": "number", "minimum": 0, "exclusiveMaximum": 1}
    assert s["train"]["properties"]["total_updates"]["type"] == ["integer", "null"]
    assert s["data"]["properties"]["sample_rate"] == {"const": 24000}


@pytest.mark.parametrize(
    "section, key, value",
    [("runs", "norm", "sandwich"), ("runs", "attention", "flash"), ("model", "cqt_impl", "fftw")],
)
def test_a_bad_enum_is_refused_by_the_package_and_by_snakemakes_fallback(root, section, key, value):
    """common.smk's fallback (Snakemake's environment without the package's dependencies) validates with
    snakemake.utils.validate against the shipped file: it refuses a bad norm as the package does."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    bad = C.read_yaml(root / "config" / "smoke.yaml")
    node = bad["runs"]["prenorm_clip1"] if section == "runs" else bad[section]
    node[key] = value
    where = f"runs.prenorm_clip1.{key}" if section == "runs" else f"{section}.{key}"
    with pytest.raises(C.ConfigError, match=f"'{where}': '{value}' is not one of"):
        C.validate(bad, "smoke.yaml")
    with pytest.raises(WorkflowError, match=f"'{value}' is not one of"):
        validate(bad, str(root / "src/acoustic_mlm/config/config.schema.json"), set_default=False)
    validate(C.read_yaml(root / "config" / "smoke.yaml"), str(root / "src/acoustic_mlm/config/config.schema.json"))


def test_snakemake_validates_against_the_shipped_schema(root):
    """Snakemake's validate reads the workflow's copy of the schema (workflow/schemas/, the catalog's place) on
    every parse; tests/pipeline/test_workflow.py holds that copy equal to the shipped JSON schema."""
    text = (root / "workflow/rules/common.smk").read_text()
    assert 'validate(_whole, str(ROOT / "workflow/schemas/config.schema.yaml"), set_default=False)' in text
