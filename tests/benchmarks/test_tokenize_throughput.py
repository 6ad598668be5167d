"""benchmarks/tokenize_throughput.py: its CLI runs, compares the right codes, and reports sane numbers.

Nothing is timed here: the speeds it measures are only checked to be finite and positive.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import load_benchmark

from acoustic_mlm.tokenizer import calibration, codec

ROOT = Path(__file__).resolve().parents[2]


bench = load_benchmark("tokenize_throughput")


def test_clip_lengths_are_whole_frames_in_range():
    lengths = bench.clip_lengths(50, 2.0, 35.0, seed=3)
    assert (lengths % 320 == 0).all()
    assert lengths.min() >= 2.0 * 24000 - 320 and lengths.max() <= 35.0 * 24000
    assert lengths.std() > 0  # varied, not all alike
    np.testing.assert_array_equal(lengths, bench.clip_lengths(50, 2.0, 35.0, seed=3))


def test_padding_share_of_longest_first_batches():
    lengths = np.array([3, 10, 4, 9]) * 320
    assert bench.padding_share(lengths, 1) == 0.0
    # batches longest first: [10, 9], [4, 3] -> encoded 2 * 10 + 2 * 4 = 28 frames for 26
    assert bench.padding_share(lengths, 2) == pytest.approx(28 / 26 - 1)
    assert bench.padding_share(lengths, 4) == pytest.approx(40 / 26 - 1)


@pytest.mark.slow
def test_main_compares_batched_codes_with_the_plain_api(tmp_path, capsys, monkeypatch):
    # one calibration thread keeps the minimal calibration (1,024 frames) fast on a shared machine
    monkeypatch.setattr(calibration, "CALIBRATION_THREADS", 1)
    out = tmp_path / "bench.json"
    result = bench.main(
        ["--clips", "3", "--min-seconds", "1", "--max-seconds", "2", "--batch-sizes", "1,2", "--repeats", "1",
         "--threads", "1", "--calibration-frames", "1024", "--calibration-iters", "2", "--json", str(out)]
    )  # fmt: skip
    rows = {r["variant"]: r for r in result["rows"]}
    assert list(rows) == [bench.PLAIN, "encode_clips B=1", "encode_clips B=2"]
    assert result["tokenizer"] == "calibrated" and result["level0_codes_used"] > 10  # codes are not all zero
    assert len(result["clip_seconds"]) == 3 and all(1 - 1 / 75 <= s <= 2 for s in result["clip_seconds"])
    frames = sum(round(s * 75) for s in result["clip_seconds"])
    assert all(r["codes"] == 8 * frames for r in rows.values())  # every frame of every clip compared, 8 levels

    b1 = rows["encode_clips B=1"]
    assert result["batch1_identical"] is True and b1["codes_identical"] and b1["codes_differ"] == 0
    assert rows["encode_clips B=2"]["calls"] == 2 and rows[bench.PLAIN]["calls"] == 3 and b1["calls"] == 3
    assert 0 <= rows["encode_clips B=2"]["codes_differ_share"] < 0.01  # near-ties only
    assert b1["padding_share"] == 0 and rows["encode_clips B=2"]["padding_share"] > 0
    assert rows[bench.PLAIN]["ratio_to_plain"] == 1.0
    for r in rows.values():
        for key in ("x_real_time", "ratio_to_plain", "ratio_q25", "ratio_q75", "seconds_per_pass"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["variant"], key)
        assert r["passes_with_other_codes"] == 0

    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    printed = capsys.readouterr().out
    assert printed.count("| plain | 1 |") == 1
    assert printed.count("| encode_clips B=1 | 1 |") == 1 and printed.count("| encode_clips B=2 | 2 |") == 1
    assert "B=1 codes identical to the plain API's" in printed


def test_plain_path_is_encodecs_readme():
    """The reference path is model.encode per clip: codes equal a direct call on the clip."""
    import torch

    model = codec.build_encodec(6.0, 0)
    lengths = np.array([40, 25]) * 320
    audio, clips = bench.make_corpus("noise", lengths, seed=0)
    (first, second) = bench.encode_plain(model, audio, clips, torch.device("cpu"))
    with torch.no_grad():
        direct = model.encode(torch.from_numpy(audio[lengths[0] :])[None, None])[0][0][0].numpy()
    assert first.shape == (8, 40) and second.shape == (8, 25)
    np.testing.assert_array_equal(second, direct)


def test_bad_arguments_are_refused():
    for argv in (
        ["--batch-sizes", "0,4"],
        ["--batch-sizes", "4,4"],
        ["--min-seconds", "9", "--max-seconds", "3"],
        ["--calibration-frames", "100"],
        ["--repeats", "0"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)


def test_keep_freed_memory_takes_effect_exactly_on_glibc():
    import platform

    from acoustic_mlm.utils import keep_freed_memory

    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")


def test_allocator_comparison_strips_the_options_it_sets(monkeypatch):
    import subprocess

    seen = []

    def fake_run(cmd, check, stdout):
        seen.append(cmd)
        out = Path(cmd[cmd.index("--json") + 1])
        alloc = cmd[cmd.index("--allocator") + 1]
        x = 20.0 if alloc == "keep" else 10.0
        out.write_text(json.dumps({"rows": [{"variant": "plain", "x_real_time": x}], "machine": {"peak_rss_gb": 1.0}}))

    monkeypatch.setattr(subprocess, "run", fake_run)
    result = bench.compare_allocators(
        ["--clips", "2", "--allocator", "keep", "--json", "x.json", "--compare-allocators", "2"], 2
    )
    assert [c[c.index("--allocator") + 1] for c in seen] == ["default", "keep", "keep", "default"]
    assert all(
        c.count("--allocator") == 1
        and c.count("--json") == 1
        and "--compare-allocators" not in c
        and c[2:4] == ["--clips", "2"]
        for c in seen
    )
    assert result["rows"][0]["ratio_keep_to_default"] == 2.0


def test_long_clip_benchmark_encodes_and_reports():
    long_clip = load_benchmark("tokenize_long_clip")
    row = long_clip.one(seconds=2.0, segment_s=1.0, context_s=0.5, threads=1)
    assert row["segment_seconds"] == 1.0 and row["seconds"] > 0 and row["peak_rss_gb"] > 0
