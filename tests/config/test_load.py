"""config/load.py: every preset loads and is valid; a missing file is one line."""

import subprocess
import sys

import pytest
import yaml

from acoustic_mlm import config as C

PRESETS = ["config.yaml", "smoke.yaml", "paper.yaml", "paper-1node.yaml", "gpu-small.yaml"]


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_complete_and_valid(root, name):
    cfg = C.load(root / "config" / name)
    assert [r["role"] for r in cfg["runs"].values()] == list(C.ROLES)
    # a complete file: the same keys as the default, section by section
    default = yaml.safe_load((root / "config" / "config.yaml").read_text())
    assert set(cfg) >= set(default) - {"sweep"}
    for section, values in default.items():
        if section != "runs" and isinstance(values, dict):
            assert set(cfg[section]) == set(values), section
    assert cfg["cpu_kernels"] == ("native" if name.startswith(("paper", "gpu")) else "avx2")  # GPU presets: not pinned


def test_cli_missing_config_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", "validate", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2 and "nope.yaml: configuration file not found" in proc.stderr

