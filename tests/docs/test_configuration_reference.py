"""docs/configuration.md is generated from the schema and the typed configuration
(docs/make_configuration.py): it holds an entry for every key, and it is the file the generator writes."""

import importlib.util
import json
import re
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def gen(root):
    spec = importlib.util.spec_from_file_location("make_configuration", root / "docs" / "make_configuration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_is_current_and_complete(root, gen):
    text = (root / "docs" / "configuration.md").read_text()
    assert gen.missing(text) == []
    assert text == gen.render(), "docs/configuration.md is stale: run python docs/make_configuration.py"
    proc = subprocess.run([sys.executable, "docs/make_configuration.py", "--check"], cwd=root, capture_output=True)
    assert proc.returncode == 0, proc.stderr


def test_every_schema_key_and_typed_field_has_a_row(root, gen):
    text = (root / "docs" / "configuration.md").read_text()
    rows = re.findall(r"^\| `([^`]+)`(?: \(optional\))? \| (.*) \|$", text, re.M)
    keys = [k for k, _ in rows]
    schema = json.loads((root / "src" / "acoustic_mlm" / "config" / "config.schema.json").read_text())
    assert len(keys) == len(set(keys)) == len(gen.schema_keys(schema)) > 100
    for key in ("cpu_kernels", "train.lr", "data.synthetic.n_clips", "runs.<NAME>.clip", "sweep[].arms"):
        assert key in keys
    assert "train.threads" in gen.typed_fields() and "runs.<NAME>.name" not in gen.typed_fields()
    lr = dict(rows)["train.lr"].split(" | ")
    assert lr[:3] == ["number, > 0", "`float`", "`0.002`"] and lr[-1] == "`train`"
    assert dict(rows)["train.threads"].endswith("none: where or how fast, not what")


def test_a_key_without_its_entry_fails_the_check(root, gen, monkeypatch, tmp_path):
    text = (root / "docs" / "configuration.md").read_text()
    without = "\n".join(line for line in text.splitlines() if not line.startswith("| `train.warmup_steps` |"))
    assert gen.missing(without) == ["train.warmup_steps"]
    # a key added to the schema and not yet documented: the generator's own check names it
    schema = gen.load_schema()
    schema["properties"]["train"]["properties"]["new_key"] = {"type": "integer"}
    monkeypatch.setattr(gen, "load_schema", lambda: schema)
    assert gen.missing(text) == ["train.new_key"]
    out = tmp_path / "configuration.md"
    out.write_text(text)
    monkeypatch.setattr(gen, "OUT", out)
    monkeypatch.setattr(gen, "ROOT", root)
    assert gen.main(["--check"]) == 1
