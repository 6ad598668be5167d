"""config/load.py: every preset loads and is valid; a missing file is one line."""

import subprocess
import sys

import pytest

from acoustic_mlm import config as C

PRESETS = ["config.yaml", "smoke.yaml", "paper.yaml", "paper-1node.yaml", "gpu-small.yaml"]


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
