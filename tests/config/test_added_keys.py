"""Settings recorded before a key existed (a shipped reference's `arms`) read as today's: renamed keys
under their new names, added keys with the value that does what the older version did."""

from __future__ import annotations

import json
from pathlib import Path

from acoustic_mlm import config as C
from acoustic_mlm.report.verify import fingerprints

ROOT = Path(__file__).resolve().parents[2]


def test_an_older_record_gets_each_added_key_with_its_old_behaviour():
    old = {"tokenizer.level": "kweighted", "data.sample_rate": 24000}
    new = C.renamed_settings(old)
    assert new == {"tokenizer.loudness": "kweighted", "data.sample_rate": 24000, "data.sample_format": "float32"}
    # a record that holds the key keeps its own value
    assert C.renamed_settings({"data.sample_format": "int16"}) == {"data.sample_format": "int16"}
    assert C.ADDED_KEYS == {"data.sample_format": "float32"}


def test_the_cpu_presets_settings_equal_their_references_read_through_it():
    """The shipped references were recorded before data.sample_format: read through renamed_settings,
    each arm's settings equal today's CPU preset's (which keeps float32), key for key."""
    for preset, ref in (("config.yaml", "default_run"), ("smoke.yaml", "smoke_run")):
        for vendor in ("GenuineIntel", "AuthenticAMD"):
            cfg = C.load(ROOT / "config" / preset)
            arms = json.loads((ROOT / "data" / "reference" / ref / vendor / "reference.json").read_text())["arms"]
            assert all("data.sample_format" not in s for s in arms.values())  # recorded before the key
            mine = fingerprints(cfg)
            for run, recorded in arms.items():
                assert mine[run]["data.sample_format"] == "float32"
                assert C.renamed_settings(recorded) == mine[run], (preset, run)


def test_every_preset_names_the_key_and_the_gpu_presets_store_int16():
    for path in sorted((ROOT / "config").glob("*.yaml")):
        fmt = C.load(path).data.sample_format
        gpu = path.stem in ("gpu-small", "gpu-rehearsal", "paper", "paper-1node", "proxy-gpu")
        assert fmt == ("int16" if gpu else "float32"), path.name
