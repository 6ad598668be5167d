"""How informative the calibrated tokenizer's codebook-0 targets are on real recordings, per loudness
normalisation and calibration size.

Prepares a folder of recordings once with a preset's data settings, then runs the whole tokenize
stage (fit, encode, merge) for each variant and prints, per variant, codebook 0 over the corpus:
the most frequent code's share of frames, the unigram entropy in bits, the codes used, and how
strongly a file's codebook-0 entropy follows its recorded level (Spearman rank correlation between
the files' RMS dBFS and their codebook-0 entropy: near +1 means quiet files get few codes).

    python benchmarks/tokenizer_loudness.py --folder ../shared/audio/librosa \
        --variants none:2048,none:16384,rms:16384,lufs:16384,kweighted:16384
    python benchmarks/tokenizer_loudness.py --folder ../shared/audio/librosa --variants rms:16384,kweighted:16384 \
        --window-frames 75 --silence-db -70

Each variant is `loudness:calibration_frames[:target]` (tokenizer.loudness, tokenizer.calibration_frames,
tokenizer.loudness_target; the target defaults to -23).
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import pandas as pd

from acoustic_mlm import config
from acoustic_mlm.artifacts.codes import FILES
from acoustic_mlm.data import prepare
from acoustic_mlm.tokenizer import loudness, stage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", required=True, help="a folder of recordings")
    ap.add_argument("--config", default="config/smoke.yaml", help="preset whose data and tokenizer settings are used")
    ap.add_argument("--variants", default="none:2048,none:16384,rms:16384,lufs:16384,kweighted:16384")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--window-frames",
        type=int,
        default=loudness.LOUDNESS_WINDOW_FRAMES,
        help="loudness kweighted and rms: frames per window (the package's value by default)",
    )
    ap.add_argument(
        "--silence-db",
        type=float,
        default=loudness.WINDOW_SILENCE_DB,
        help="loudness kweighted and rms: a window at or below this level is left as is (the package's "
        "value by default)",
    )
    args = ap.parse_args()
    loudness.LOUDNESS_WINDOW_FRAMES, loudness.WINDOW_SILENCE_DB = args.window_frames, args.silence_db
    base = config.read_yaml(args.config)  # the file's mapping: each variant edits it as a user edits the file
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared"
        prepare.run(config.from_mapping(base, args.config), Path(args.folder), prepared)
        for variant in args.variants.split(","):
            method, frames, *target = variant.split(":")
            settings = copy.deepcopy(base)
            settings["tokenizer"].update(
                loudness=method, calibration_frames=int(frames), loudness_target=float(target[0]) if target else -23.0
            )
            out = Path(tmp) / f"codes-{method}-{frames}"
            t0 = time.perf_counter()
            stage.run(
                config.from_mapping(settings, f"{args.config} with loudness {variant}"),
                prepared,
                out,
                threads=args.threads,
            )
            meta = json.loads((out / "tokenizer.json").read_text())
            files = pd.read_csv(out / FILES)
            rho = files["rms_dbfs"].corr(files["cb0_entropy_bits"], method="spearman")
            rows.append(
                {
                    "variant": variant,
                    "window_frames": args.window_frames,
                    "silence_db": args.silence_db,
                    "cb0_top_share": meta["top_code_share"][0],
                    "cb0_entropy_bits": meta["unigram_entropy_bits"][0],
                    "cb0_codes": meta["distinct_codes"][0],
                    "codes_per_level": meta["distinct_codes"],
                    "min_file_cb0_entropy": files["cb0_entropy_bits"].min(),
                    "rho_rms_entropy": round(float(rho), 3),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            print(
                files[
                    ["path", "rms_dbfs", "lufs", "gain_db", "cb0_codes_used", "cb0_entropy_bits", "cb0_top_code_share"]
                ].to_string(index=False),
                flush=True,
            )
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
