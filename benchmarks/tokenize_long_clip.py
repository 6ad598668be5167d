"""Memory and time of tokenizing one long clip: whole, or in segments with left context.

A folder source may hold whole songs or hour-long recordings. EnCodec's encoder keeps large
activations for the whole input (its first conv alone: 32 channels at 24 kHz, about 3 MB per
second of audio), so `encode_clips` cuts clips longer than `tokenizer.segment_seconds` into
segments, each with `tokenizer.context_seconds` of left context whose codes are dropped. Each
setting runs in its own process (peak RSS is per process), alternating, `--repeats` times:

    python benchmarks/tokenize_long_clip.py --seconds 300 --segments 0,60 --context 2

The clip is white noise through the untrained encoder: the encoder's cost does not depend on the
codebooks or the signal. Whether segments change the codes is tested in tests/tokenizer/test_stage.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(seconds: float, segment_s: float, context_s: float, threads: int) -> dict:
    """Encode one clip in this process; its wall time and this process's peak RSS."""
    import numpy as np
    import pandas as pd

    from acoustic_mlm import config as C
    from acoustic_mlm import encodec
    from acoustic_mlm.tokenizer.codec import build_encodec
    from acoustic_mlm.tokenizer.encode import EncodeSettings, encode_clips
    from acoustic_mlm.utils import set_threads

    set_threads(threads)
    model = build_encodec(6.0, 0)
    n = int(seconds * encodec.SAMPLE_RATE) // encodec.HOP * encodec.HOP
    audio = (0.1 * np.random.default_rng(0).standard_normal(n)).astype(np.float32)
    clips = pd.DataFrame({"offset": [0], "num_samples": [n]})
    t0 = time.perf_counter()
    # the `tokenizer:` section with these settings, read as the tokenize stage reads it
    tc = dataclasses.replace(
        C.load(ROOT / "config" / "smoke.yaml").tokenizer,
        batch_size=1,
        segment_seconds=segment_s,
        context_seconds=context_s,
    )
    encode_clips(model, audio, clips, EncodeSettings.from_config(tc, "cpu"))
    return {
        "segment_seconds": segment_s,
        "seconds": time.perf_counter() - t0,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=300.0, help="clip length (default: %(default)s)")
    p.add_argument(
        "--segments", default="0,60", help="segment lengths in seconds, 0 = whole clip (default: %(default)s)"
    )
    p.add_argument(
        "--context", type=float, default=2.0, help="left context per segment, seconds (default: %(default)s)"
    )
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=2, help="processes per setting (default: %(default)s)")
    p.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(one(args.seconds, args.child, args.context, args.threads)))
        return []
    segments = [float(x) for x in args.segments.split(",")]
    runs: dict[float, list[dict]] = {s: [] for s in segments}
    for r in range(args.repeats):
        for s in segments if r % 2 == 0 else segments[::-1]:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--seconds",
                    str(args.seconds),
                    "--context",
                    str(args.context),
                    "--threads",
                    str(args.threads),
                    "--child",
                    str(s),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs[s].append(json.loads(out.strip().splitlines()[-1]))
    base = statistics.median(x["seconds"] for x in runs[segments[0]])
    rows = []
    print(f"| segments | wall s (median of {args.repeats}) | speed vs {segments[0]:g} | peak RSS GB |")
    print("|---|---:|---:|---:|")
    for s in segments:
        sec = statistics.median(x["seconds"] for x in runs[s])
        rss = max(x["peak_rss_gb"] for x in runs[s])
        rows.append({"segment_seconds": s, "seconds": sec, "speed_ratio": base / sec, "peak_rss_gb": rss})
        label = "whole clip" if s == 0 else f"{s:g} s + {args.context:g} s context"
        print(f"| {label} | {sec:.1f} | {base / sec:.2f} | {rss:.2f} |")
    return rows


if __name__ == "__main__":
    main()
