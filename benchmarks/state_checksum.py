"""What the resumable state's checksum costs: sha256 of a saved state against torch.save itself.

Each training state (`train.state.save_state`) is hashed once after it is written and once more before
it is resumed from. This times, in one process and interleaved, `torch.save` of a state of
--megabytes of float32 tensors to a file (the baseline) and `utils.file_sha256` of that file, and
reports the median of the per-repetition ratios hash / save. The file is read back from the page
cache, as it is right after a save; a resume after a reboot reads it from disk.

    python benchmarks/state_checksum.py --megabytes 256 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from acoustic_mlm.utils import file_sha256, machine_info


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--megabytes", type=int, default=256, help="state size in MB of float32 tensors")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    n = args.megabytes * 2**20 // 4
    state = {"model": {f"w{k}": torch.randn(n // 8) for k in range(8)}}  # a few tensors, as a state dict
    saves, hashes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.pt"
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            torch.save(state, path)
            t1 = time.perf_counter()
            file_sha256(path)
            t2 = time.perf_counter()
            saves.append(t1 - t0)
            hashes.append(t2 - t1)
            path.unlink()
    result = {
        "megabytes": args.megabytes,
        "save_s_median": round(statistics.median(saves), 3),
        "sha256_s_median": round(statistics.median(hashes), 3),
        "ratio_sha256_over_save": round(statistics.median(h / s for h, s in zip(hashes, saves)), 3),
        "sha256_MB_per_s": round(args.megabytes / statistics.median(hashes), 1),
        "machine": machine_info(torch.device("cpu")),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
