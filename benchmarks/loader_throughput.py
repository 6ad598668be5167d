"""How fast the training loader delivers a preset's micro-batches, against a GPU's projected step time.

`acoustic_mlm.train.crops.CropData` + `crops.batches` (memory-mapped audio and codes shards, a
fairseq span mask per crop, `train.workers` loader processes) are timed exactly as training
uses them, on a prepared corpus that this script writes into a temporary folder (noise audio
at 24 kHz in float32 and random int16 codes, in the stage's layout: manifest.csv,
shard-<k>/audio.npy, shard-<k>/codes.npy). The page cache is warm (the corpus was just
written); a corpus larger than memory reads from disk as well.

The GPU side is a projection, not a measurement: the preset's model FLOPs for one micro-batch
(`acoustic_mlm.preflight.flops.step_flops`) at `--utilisation` of `--peak-tflops` (default: an H200's
989 dense bf16/fp16 TFLOP/s at 30 %), the optimizer step left out (so the bar is stricter).
With train.workers 0 the loading adds to every step; with workers > 0 it overlaps the step,
and keeps up when the loader's ms per micro-batch stays below the GPU's.

    python benchmarks/loader_throughput.py --config config/paper.yaml --batch-sizes 7,32 --workers 0,2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.artifacts.prepared import load_prepared, shard_name, write_manifest
from acoustic_mlm.preflight.flops import step_flops
from acoustic_mlm.preflight.project import update_ms_at
from acoustic_mlm.train.crops import CropData, batches
from acoustic_mlm.utils import benchmark_header, machine_info, set_threads, write_result

H200_PEAK_TFLOPS = 989.0  # dense bf16 / fp16 (NVIDIA's H200 datasheet); preflight.project.PEAK_TFLOPS has the table
SAMPLE_RATE = encodec.SAMPLE_RATE


def write_corpus(
    root: Path, shards: int, clips_per_shard: int, clip_seconds: float, codebooks: int = 8, seed: int = 0
) -> tuple[Path, Path]:
    """A prepared corpus and its codes in the stages' layout; every clip in the train split."""
    prepared, codes_dir = root / "prepared", root / "codes"
    rng = np.random.default_rng(seed)
    frames = int(clip_seconds * SAMPLE_RATE) // encodec.HOP
    samples = frames * encodec.HOP
    rows = []
    for k in range(shards):
        (prepared / shard_name(k)).mkdir(parents=True)
        (codes_dir / shard_name(k)).mkdir(parents=True)
        audio = np.lib.format.open_memmap(
            prepared / shard_name(k) / "audio.npy", mode="w+", dtype=np.float32, shape=(clips_per_shard * samples,)
        )
        for j in range(clips_per_shard):
            audio[j * samples : (j + 1) * samples] = 0.1 * rng.standard_normal(samples, dtype=np.float32)
            rows.append(
                {
                    "clip_id": f"s{k}c{j}",
                    "path": f"s{k}c{j}.flac",
                    "shard": k,
                    "split": "train",
                    "offset": j * samples,
                    "num_samples": samples,
                    "num_frames": frames,
                    "orig_sample_rate": SAMPLE_RATE,
                    "orig_channels": 1,
                    "duration_s": samples / SAMPLE_RATE,
                }
            )
        audio.flush()
        del audio
        codes = rng.integers(0, 1024, size=(codebooks, clips_per_shard * frames), dtype=np.int16)
        np.save(codes_dir / shard_name(k) / "codes.npy", codes)
    write_manifest(prepared, pd.DataFrame(rows))  # the package's writer: every column, a gain of 1 each
    return prepared, codes_dir


class TimedCropData(CropData):
    """CropData whose items also carry the seconds their making took, wherever they were made."""

    def __getitem__(self, i: int):
        t0 = time.perf_counter()
        item = super().__getitem__(i)
        return (*item, torch.tensor(time.perf_counter() - t0))


def time_loader(data: CropData, workers: int, warmup: int, n: int, first: int) -> dict:
    """ms to the first micro-batch (worker start-up included), then the mean ms per micro-batch of
    the next n as the training loop receives them, and the median ms one took to make (in the
    process that made it: with workers, the rest is the hand-over to the training process)."""
    t0 = time.perf_counter()
    it = iter(batches(data, first, first + warmup + n, workers, pin=False))
    next(it)
    startup = time.perf_counter() - t0
    for _ in range(warmup - 1):
        next(it)
    t1 = time.perf_counter()
    made = []
    for _ in range(n):
        wav, codes, mask, seconds = next(it)
        made.append(float(seconds))
    steady = time.perf_counter() - t1
    assert wav.shape[0] == data.batch and codes.shape[-1] == data.crop_frames and mask.shape[0] == data.batch
    return {
        "startup_ms": 1000 * startup,
        "ms_per_micro_batch": 1000 * steady / n,
        "make_ms": 1000 * statistics.median(made),
    }


def parse_args(argv=None) -> argparse.Namespace:
    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x.strip()]

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="config/paper.yaml", help="preset: model, crop and masks (default: %(default)s)")
    p.add_argument("--batch-sizes", type=ints, default=[7, 32], help="crops per micro-batch (default: 7,32)")
    p.add_argument("--workers", type=ints, default=[0, 2], help="train.workers values (default: 0,2)")
    p.add_argument(
        "--micro-batches", type=int, default=40, help="timed micro-batches per variant (default: %(default)s)"
    )
    p.add_argument("--warmup", type=int, default=4, help="untimed micro-batches first (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (default: %(default)s)")
    p.add_argument("--shards", type=int, default=6, help="corpus shards (default: %(default)s)")
    p.add_argument("--clips-per-shard", type=int, default=25, help="30 s clips per shard (default: %(default)s)")
    p.add_argument("--clip-seconds", type=float, default=30.0, help="clip length (default: %(default)s)")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=H200_PEAK_TFLOPS,
        help="GPU peak for the projection (default: %(default)s, H200 dense bf16/fp16)",
    )
    p.add_argument("--utilisation", type=float, default=0.3, help="assumed share of the peak (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the main process (default: %(default)s)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the results here")
    args = p.parse_args(argv)
    if min(args.batch_sizes, default=0) < 1 or min(args.workers, default=-1) < 0:
        p.error("--batch-sizes must be positive and --workers non-negative")
    if args.micro_batches < 1 or args.warmup < 1 or args.repeats < 1:
        p.error("--micro-batches, --warmup and --repeats must be at least 1")
    if not 0 < args.utilisation <= 1:
        p.error("--utilisation must be in (0, 1]")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg = C.load(args.config)
    set_threads(args.threads)
    m, frames = cfg.model.with_arm("pre", "softmax"), cfg.crop_frames  # masks and FLOPs: no arm's norm matters
    variants = [(b, w) for b in args.batch_sizes for w in args.workers]
    times: dict[tuple, list[dict]] = {v: [] for v in variants}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="amlm-loader-") as tmp:
        prepared, codes_dir = write_corpus(Path(tmp), args.shards, args.clips_per_shard, args.clip_seconds)
        corpus = load_prepared(prepared)
        print(
            f"# corpus: {args.shards} shards x {args.clips_per_shard} clips of {args.clip_seconds:g} s "
            f"({sum(corpus.audio(k).nbytes for k in corpus.shards) / 1e9:.2f} GB of audio) in {tmp}",
            file=sys.stderr,
            flush=True,
        )
        first = 0
        for r in range(args.repeats):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for b, w in order:
                data = TimedCropData(corpus, codes_dir, "train", frames, b, m, seed=1)
                times[(b, w)].append(time_loader(data, w, args.warmup, args.micro_batches, first))
                first += args.warmup + args.micro_batches  # new crops every time: no reuse of the same batches
            print(
                f"  repeat {r + 1}/{args.repeats}: "
                + " ".join(f"b{b}w{w}={times[(b, w)][-1]['ms_per_micro_batch']:.1f}ms" for b, w in variants),
                file=sys.stderr,
                flush=True,
            )
    rows = []
    for b, w in variants:
        ms = statistics.median(t["ms_per_micro_batch"] for t in times[(b, w)])
        gpu_ms = update_ms_at(step_flops(m, b, frames), args.peak_tflops, args.utilisation)
        rows.append(
            {
                "batch": b,
                "workers": w,
                "ms_per_micro_batch": ms,
                "ms_per_micro_batch_all": [t["ms_per_micro_batch"] for t in times[(b, w)]],
                "startup_ms": statistics.median(t["startup_ms"] for t in times[(b, w)]),
                "make_ms": statistics.median(t["make_ms"] for t in times[(b, w)]),
                "crops_per_s": b / (ms / 1000),
                "audio_seconds_per_s": b * frames * encodec.HOP / SAMPLE_RATE / (ms / 1000),
                "gpu_ms_per_micro_batch_projected": gpu_ms,
                "loader_over_gpu": ms / gpu_ms,
            }
        )
    print(
        f"| micro-batch | workers | loader ms / micro-batch | ms to make one | crops/s | start-up ms | projected GPU "
        f"ms ({args.utilisation:.0%} of {args.peak_tflops:g} TFLOP/s) | loader / GPU |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['workers']} | {r['ms_per_micro_batch']:.1f} | {r['make_ms']:.1f} | "
            f"{r['crops_per_s']:.0f} | "
            f"{r['startup_ms']:.0f} | {r['gpu_ms_per_micro_batch_projected']:.1f} | {r['loader_over_gpu']:.3f} |"
        )
    info = machine_info(torch.device("cpu"))
    info["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    result = {
        **benchmark_header(__file__, argv),
        "config": str(args.config),
        "machine": info,
        "crop_frames": frames,
        "corpus": {"shards": args.shards, "clips_per_shard": args.clips_per_shard, "clip_seconds": args.clip_seconds},
        "micro_batches": args.micro_batches,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "gpu_projection": {
            "peak_tflops": args.peak_tflops,
            "utilisation": args.utilisation,
            "note": "projection from the model FLOP count, not a measurement",
        },
        "rows": rows,
    }
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
