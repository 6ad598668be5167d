import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from acoustic_mlm.artifacts.prepared import MANIFEST_COLUMNS

ROOT = Path(__file__).resolve().parents[1]

# Two tiers (docs/testing.md). `pytest` runs the default tier: the unit tests and one smoke pipeline,
# minutes on 2 cores. `pytest --runslow` runs the full suite, CI's: the default tier and every test marked
# `slow` (whole-pipeline engines, torch.compile, multi-process training, kill tests, real music, the
# paper-size model). A slow test is left out of the default tier by name, never skipped: the summary says
# how many and how to run them.
RUNSLOW = "--runslow"


def pytest_addoption(parser):
    parser.addoption(RUNSLOW, action="store_true", help="run the full suite: the slow tier too (CI runs it)")


def pytest_collection_modifyitems(config, items):
    if not config.getoption(RUNSLOW):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
            config._amlm_slow_left_out = len(slow)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (each collects the same list)
        _heavy_modules_first(items)


def _heavy_modules_first(items) -> None:
    """Under pytest-xdist, the modules that hold a whole pipeline (`e2e`) first, then those that hold a
    `slow` test, then the rest; collection order within each, a module's tests kept together (its
    module-scoped fixtures made once). `--dist loadgroup` hands out the work in this order (after the
    groups of several tests, largest first), so the tests of minutes start early and the last tests
    handed out are short ones: neither worker is left alone with a long one at the end."""

    def module(item) -> str:
        return item.nodeid.split("::")[0]

    rank: dict[str, int] = {}
    for item in items:
        weight = 0 if item.get_closest_marker("e2e") else 1 if item.get_closest_marker("slow") else 2
        rank[module(item)] = min(rank.get(module(item), 2), weight)
    items.sort(key=lambda item: rank[module(item)])  # stable


def pytest_terminal_summary(terminalreporter, config):
    left_out = getattr(config, "_amlm_slow_left_out", 0)
    if left_out:
        terminalreporter.write_line(f"{left_out} tests of the slow tier left out: `pytest {RUNSLOW}` runs them")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="module")
def server():
    """A LocalServer (tests/helpers.py) on 127.0.0.1 for the module's tests."""
    from helpers import LocalServer

    s = LocalServer()
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()
    s.thread.join(timeout=5)


@pytest.fixture()
def smoke_cfg() -> dict:
    """The smoke preset as a fresh, mutable dict."""
    return copy.deepcopy(yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text()))


@pytest.fixture(scope="session")
def smoke_config():
    """The smoke preset, loaded and validated (a typed Config)."""
    from acoustic_mlm import config as C

    return C.load(ROOT / "config" / "smoke.yaml")


@pytest.fixture(scope="session")
def data_dirs(tmp_path_factory):
    """A tiny prepared corpus (6 clips of 2 s in two shards) with skewed, learnable codes."""
    from acoustic_mlm import config as C
    from acoustic_mlm.artifacts.codes import MODEL_DIR
    from acoustic_mlm.artifacts.prepared import shard_name
    from acoustic_mlm.tokenizer.stage import merge

    root = tmp_path_factory.mktemp("data")
    prepared, codes_dir = root / "prepared", root / "codes"
    rng = np.random.default_rng(0)
    frames, per_shard = 150, 3
    clips = []
    for i in range(6):
        shard, j = divmod(i, per_shard)
        clips.append(
            {
                "clip_id": f"c{i}",
                "path": f"c{i}.flac",
                "shard": shard,
                "split": "valid" if i == 5 else "train",
                "offset": j * frames * 320,
                "num_samples": frames * 320,
                "num_frames": frames,
                "orig_sample_rate": 24000,
                "orig_channels": 1,
                "duration_s": frames * 320 / 24000,
                "gain": 1.0,
            }
        )
    for shard in range(2):
        (prepared / shard_name(shard)).mkdir(parents=True)
        (codes_dir / shard_name(shard)).mkdir(parents=True)
        audio = (0.1 * rng.standard_normal(per_shard * frames * 320)).astype(np.float32)
        np.save(prepared / shard_name(shard) / "audio.npy", audio)
        codes = rng.choice(16, size=(8, per_shard * frames), p=np.arange(16, 0, -1) / 136).astype(np.int16)
        np.save(codes_dir / shard_name(shard) / "codes.npy", codes)
        (codes_dir / shard_name(shard) / "encode.json").write_text(
            json.dumps({"clips": per_shard, "audio_seconds": per_shard * 2.0, "encode_seconds": 1.0})
        )
        pd.DataFrame(
            {
                "clip_id": [f"c{shard * per_shard + j}" for j in range(per_shard)],
                "rms_dbfs": -20.0,
                "lufs": -20.0,
                "gain_db": 0.0,
            }
        ).to_csv(codes_dir / shard_name(shard) / "loudness.csv", index=False)
    pd.DataFrame(clips)[list(MANIFEST_COLUMNS)].to_csv(prepared / "manifest.csv", index=False)
    (codes_dir / MODEL_DIR).mkdir()
    (codes_dir / MODEL_DIR / "fit.json").write_text(json.dumps({"mode": "calibrated"}))
    cfg = C.read_yaml(ROOT / "config" / "smoke.yaml")
    cfg["tokenizer"]["batch_size"] = 1
    merge(C.from_mapping(cfg), prepared, codes_dir)  # tokenizer.json, as the stage writes it
    return prepared, codes_dir
