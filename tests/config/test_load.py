"""config/load.py: every preset loads and is valid; a missing file is one line."""

import subprocess
import sys

import pytest

from acoustic_mlm import config as C

PRESETS = ["config.yaml", "smoke.yaml", "paper.yaml", "paper-1node.yaml", "gpu-small.yaml", "gpu-rehearsal.yaml"]


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_complete_and_valid(root, name):
    cfg = C.load(root / "config" / name)
    assert isinstance(cfg, C.Config) and cfg.source == str(root / "config" / name)
    assert [r.role for r in cfg.runs.values()] == list(C.ROLES)
    # a complete file: the same keys as the default, section by section
    default = C.read_yaml(root / "config" / "config.yaml")
    mapping = C.read_yaml(root / "config" / name)
    assert set(mapping) >= set(default) - {"sweep"}
    for section, values in default.items():
        if section != "runs" and isinstance(values, dict):
            assert set(mapping[section]) == set(values), section
    assert cfg.cpu_kernels == ("native" if name.startswith(("paper", "gpu")) else "avx2")  # GPU presets: not pinned


def test_cli_missing_config_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", "validate", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "nope.yaml: configuration file not found" in proc.stderr


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {lr: 1}\ntrain:\n  <<: *b\n",  # the usual form: an anchor merged in (the alias is refused second)
        "train:\n  <<: {lr: 1}\n",  # an inline mapping
        "train:\n  <<: 5\n",  # a scalar (PyYAML's own error would blame the parser)
        "train:\n  <<: [{lr: 1}, {steps: 2}]\n",
    ],
)
def test_a_yaml_merge_key_is_named_not_called_invalid_yaml(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(C.ConfigError) as refused:
        C.load(path)
    message = str(refused.value)
    assert "not valid YAML" not in message and "\n" not in message
    assert message.startswith(f"{path}: line ") and (
        "YAML merge key '<<' is not supported" in message or "YAML alias '*b' is not supported" in message
    )


@pytest.mark.parametrize(
    "error", [PermissionError(13, "Permission denied"), OSError(5, "Input/output error"), IsADirectoryError(21, "x")]
)
def test_an_unreadable_configuration_file_is_one_line(root, tmp_path, monkeypatch, error):
    """Root reads any file, so the refusal of the read is simulated here; `amlm` prints it in one line."""
    from pathlib import Path

    from acoustic_mlm import cli

    path = tmp_path / "c.yaml"
    path.write_text((root / "config" / "smoke.yaml").read_text())
    real = Path.read_bytes

    def read_bytes(self):
        if self == path:
            raise error
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    assert cli.main(["validate", "--config", str(path)]) == 2
    with pytest.raises(C.ConfigError, match=rf"^{path}: cannot be read \({error.strerror}\); check its permissions$"):
        C.load(path)
