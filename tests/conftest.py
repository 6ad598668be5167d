import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from acoustic_mlm.prepare import MANIFEST_COLUMNS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture()
def smoke_cfg() -> dict:
    """The smoke preset as a fresh, mutable dict."""
    return copy.deepcopy(yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text()))


@pytest.fixture(scope="session")
def data_dirs(tmp_path_factory):
    """A tiny prepared corpus (6 clips of 2 s) with skewed, learnable codes."""
    root = tmp_path_factory.mktemp("data")
    prepared, codes_dir = root / "prepared", root / "codes"
    prepared.mkdir()
    codes_dir.mkdir()
    rng = np.random.default_rng(0)
    frames = 150
    clips = []
    for i in range(6):
        clips.append({
            "clip_id": f"c{i}", "path": f"c{i}.flac", "split": "valid" if i == 5 else "train",
            "offset": i * frames * 320, "num_samples": frames * 320, "num_frames": frames,
            "orig_sample_rate": 24000, "orig_channels": 1, "duration_s": frames * 320 / 24000,
        })
    audio = (0.1 * rng.standard_normal(6 * frames * 320)).astype(np.float32)
    np.save(prepared / "audio.npy", audio)
    pd.DataFrame(clips)[list(MANIFEST_COLUMNS)].to_csv(prepared / "manifest.csv", index=False)
    codes = rng.choice(16, size=(8, 6 * frames), p=np.arange(16, 0, -1) / 136).astype(np.int16)
    np.save(codes_dir / "codes.npy", codes)
    return prepared, codes_dir
