"""benchmarks/data_throughput.py on the CPU: MP3s of real music made here, decoded and encoded."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from helpers import real_audio_dir, real_audio_missing


@pytest.mark.skipif(real_audio_missing() is not None, reason=str(real_audio_missing()))
def test_data_throughput_measures_decode_and_encode_per_core(root):
    spec = importlib.util.spec_from_file_location("data_throughput", root / "benchmarks" / "data_throughput.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    r = module.main(["--audio", str(real_audio_dir()), "--clip-seconds", "1.5", "--repeats", "1"])
    assert r["files"] == 8 and r["audio_seconds"] == pytest.approx(12.0, abs=0.1)
    d, e = r["decode"], r["encode"]
    assert d["mp3_x_real_time"] > 1 and d["core_hours_per_audio_hour"] == pytest.approx(
        1 / 3600 / (d["mp3_x_real_time"] / 3600), rel=0.01
    )
    assert e["x_real_time"] > 0.1 and e["frames"] == sum(int(1.5 * 24000) // 320 for _ in range(8))
    assert e["core_hours_per_audio_hour"] == pytest.approx(1 / e["x_real_time"], rel=0.01)
