"""EnCodec tokenization speed: one clip per `model.encode` call against the package's padded batches.

Two ways to turn the same clips into EnCodec 24 kHz codes (6 kbps: 8 codebooks at 75 Hz), timed
in the same process:

- **plain**: one file at a time through EnCodec's plain API, as EnCodec's README does it:
  `EncodecModel.encodec_model_24khz()`, `set_target_bandwidth(6.0)`, then per clip
  `model.encode(wav[None, None])` under `torch.no_grad()` and
  `torch.cat([f[0] for f in frames], dim=-1)`; one call per clip.
- **batched**: `acoustic_mlm.tokenizer.encode.encode_clips(model, audio, clips, EncodeSettings(batch_size=B))`, what the
  tokenize stage runs: zero-padded batches of up to B clips, longest first, each clip's codes
  trimmed to its own frames, written into one aligned (K, frames) array; for each B of
  `--batch-sizes`.

Both read the same clips from one concatenated 24 kHz array (as a prepared shard's audio.npy).
The clips have varied lengths (uniform in `--min-seconds` ... `--max-seconds`, whole 320-sample
frames), since the padding a batch wastes depends on the spread of lengths; the table's
"padding" column is the share of extra samples the padded batches encode.

Speed is in multiples of real time: seconds of audio encoded per wall-clock second, over one
pass through every clip. The variants are interleaved (one pass of each, then again, in an order
rotated by one each repetition) and each ratio is the median of the per-repetition ratios
variant / plain, so drifts in a shared machine's load hit all variants alike; "ratio IQR" is the
25th-75th percentile of those paired ratios (read it as the noise). On CUDA the device is
synchronized before each pass's clock starts and after it stops.

The tokenizer is the stage's calibrated one by default (`build_encodec(6.0, seed)`, then
`calibrate` on separate synthetic clips), so that its codes are spread over the codebooks and the
code comparison means something; `--tokenizer untrained` skips calibration (same encoder cost,
but every code is 0, so the comparison is vacuous). The codes of each variant are compared with
the plain API's: batch size 1 must be identical; larger batches may flip rare near-tie frames
(float summation order differs), reported as the share of codes that differ.

    python benchmarks/tokenize_throughput.py --clips 24 --min-seconds 5 --max-seconds 30 --batch-sizes 1,4,16
    python benchmarks/tokenize_throughput.py --device cuda --clips 96 --batch-sizes 1,8,32,64
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from acoustic_mlm import encodec
from acoustic_mlm.data import synth
from acoustic_mlm.devices import pick_device
from acoustic_mlm.encodec import SAMPLE_RATE
from acoustic_mlm.tokenizer.calibration import calibrate
from acoustic_mlm.tokenizer.codec import build_encodec, n_codebooks
from acoustic_mlm.tokenizer.encode import EncodeSettings, encode_clips, padded_batches
from acoustic_mlm.utils import benchmark_header, keep_freed_memory, machine_info, set_threads, write_result

PLAIN = "plain"
BANDWIDTH = 6.0  # kbps: 8 codebooks, as the stage and MERT use
CALIBRATION_CLIP_SECONDS = 10.0
CALIBRATION_INDEX = 1_000_000  # synthetic calibration clips are drawn from clip indices from here on


# ----------------------------------------------------------------------------- clips


def clip_lengths(n: int, min_seconds: float, max_seconds: float, seed: int) -> np.ndarray:
    """Lengths in samples, uniform in [min, max] seconds, rounded down to whole 320-sample frames."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    seconds = rng.uniform(min_seconds, max_seconds, size=n)
    return np.maximum(1, (seconds * SAMPLE_RATE).astype(np.int64) // encodec.HOP) * encodec.HOP


def make_clip(kind: str, seed: int, index: int, samples: int) -> np.ndarray:
    """One mono float32 clip of `samples` samples at 24 kHz: procedural music or white noise."""
    if kind == "synth":
        x = synth.generate_clip(synth.clip_rng(seed, index), samples / SAMPLE_RATE, SAMPLE_RATE)
        x = x.mean(axis=1)[:samples]  # mono mix, as prepare does
    else:
        x = 0.1 * np.random.default_rng(np.random.SeedSequence([seed, index])).standard_normal(samples)
    if len(x) < samples:
        x = np.pad(x, (0, samples - len(x)))
    return np.ascontiguousarray(x, dtype=np.float32)


def make_corpus(kind: str, lengths: np.ndarray, seed: int) -> tuple[np.ndarray, pd.DataFrame]:
    """(audio, clips): the clips concatenated into one array, as a prepared shard's audio.npy, and
    their rows (offset, num_samples) as in the shard's manifest."""
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    audio = np.concatenate([make_clip(kind, seed, i, int(n)) for i, n in enumerate(lengths)])
    return audio, pd.DataFrame({"offset": offsets, "num_samples": np.asarray(lengths, dtype=np.int64)})


def tokenizer_model(mode: str, seed: int, audio_kind: str, frames: int, iters: int) -> tuple:
    """(model, info): the untrained EnCodec of the stage, calibrated on separate synthetic clips
    (never the timed ones) unless mode is 'untrained'."""
    model = build_encodec(BANDWIDTH, seed)
    info: dict = {"tokenizer": mode, "bandwidth": BANDWIDTH, "seed": seed}
    if mode == "calibrated":
        n = math.ceil(frames / (CALIBRATION_CLIP_SECONDS * SAMPLE_RATE / encodec.HOP))
        samples = int(CALIBRATION_CLIP_SECONDS * SAMPLE_RATE)
        chunks = [make_clip(audio_kind, seed, CALIBRATION_INDEX + i, samples) for i in range(n)]
        stats = calibrate(model, chunks, frames, iters, seed)
        info.update(calibration_clips=n, calibration_iters=iters, **stats)
    return model.eval(), info


# ----------------------------------------------------------------------------- the two paths


@torch.no_grad()
def encode_plain(model, audio: np.ndarray, clips: pd.DataFrame, device: torch.device) -> list[np.ndarray]:
    """EnCodec's README, once per clip: codes (K, T) of each clip, in the clips' order."""
    out = []
    for offset, n in zip(clips["offset"].to_numpy(), clips["num_samples"].to_numpy()):
        wav = torch.from_numpy(audio[offset : offset + n]).to(device)
        encoded_frames = model.encode(wav[None, None])
        codes = torch.cat([encoded[0] for encoded in encoded_frames], dim=-1)  # (1, K, T)
        out.append(codes[0].cpu().numpy())
    return out


def aligned(per_clip: list[np.ndarray], clips: pd.DataFrame, total_samples: int) -> np.ndarray:
    """Per-clip codes in encode_clips' layout: (K, total_samples // 320) int16, -1 where no clip is."""
    K = per_clip[0].shape[0]
    codes = np.full((K, total_samples // encodec.HOP), -1, dtype=np.int16)
    for c, offset, n in zip(per_clip, clips["offset"].to_numpy(), clips["num_samples"].to_numpy()):
        frames, first = int(n) // encodec.HOP, int(offset) // encodec.HOP
        if c.shape[1] < frames:
            raise RuntimeError(f"EnCodec gave {c.shape} codes for {n} samples")
        codes[:, first : first + frames] = c[:, :frames]
    return codes


def padding_share(lengths: np.ndarray, batch_size: int) -> float:
    """Extra samples that `encode_clips`' padded batches encode, as a share of the real ones."""
    lengths = np.asarray(lengths, dtype=np.int64)
    padded = sum(int(lengths[b].max()) * len(b) for b in padded_batches(lengths, batch_size))
    return padded / int(lengths.sum()) - 1.0


# ----------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def variants(batch_sizes: list[int]) -> list[tuple[str, int]]:
    """(name, batch size): the plain API first, then encode_clips per batch size."""
    return [(PLAIN, 1)] + [(f"encode_clips B={b}", b) for b in batch_sizes]


def time_variant(name, batch_size, model, audio, clips, device) -> tuple[float, np.ndarray]:
    """(wall seconds, codes) of one pass. The plain path's codes are aligned after the clock stops."""
    _sync(device)
    t0 = time.perf_counter()
    if name == PLAIN:
        out = encode_plain(model, audio, clips, device)
    else:
        out = encode_clips(
            model, audio, clips, EncodeSettings(batch_size=batch_size, device=device), label=f"tokenize B={batch_size}"
        )
    _sync(device)
    seconds = time.perf_counter() - t0
    return seconds, (aligned(out, clips, len(audio)) if name == PLAIN else out)


def benchmark(model, audio, clips, device, batch_sizes: list[int], repeats: int, warmup_clips: int) -> tuple:
    """({name: [seconds per pass]}, {name: codes of the first pass}, {name: passes whose codes
    differ from that variant's first pass}); passes interleaved, order rotated each repetition."""
    vs = variants(batch_sizes)
    if warmup_clips > 0:  # lazy initialisation (oneDNN primitives, CUDA context, cuDNN), untimed
        short = clips.sort_values("num_samples").iloc[:warmup_clips]
        for name, b in vs:
            time_variant(name, b, model, audio, short, device)
    times = {name: [] for name, _ in vs}
    codes: dict[str, np.ndarray] = {}
    unstable = {name: 0 for name, _ in vs}
    for r in range(repeats):
        for name, b in vs[r % len(vs) :] + vs[: r % len(vs)]:
            seconds, c = time_variant(name, b, model, audio, clips, device)
            times[name].append(seconds)
            if name not in codes:
                codes[name] = c
            elif not np.array_equal(c, codes[name]):
                unstable[name] += 1
        audio_s = float(clips["num_samples"].sum()) / SAMPLE_RATE
        print(
            f"  repeat {r + 1}/{repeats}: " + " ".join(f"{name}={audio_s / s[-1]:.1f}x" for name, s in times.items()),
            file=sys.stderr,
            flush=True,
        )
    return times, codes, unstable


def _quantile(xs: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs), q))


def summarize(batch_sizes, times, codes, unstable, lengths) -> list[dict]:
    audio_s = float(np.sum(lengths)) / SAMPLE_RATE
    ref = codes[PLAIN]
    used = ref >= 0
    rows = []
    for name, b in variants(batch_sizes):
        s = times[name]
        ratios = [p / v for v, p in zip(s, times[PLAIN])]  # variant x-real-time / plain's, per repetition
        med = statistics.median(s)
        differ = int(((codes[name] != ref) & used).sum())
        differ_0 = int(((codes[name][0] != ref[0]) & used[0]).sum())
        rows.append(
            {
                "variant": name,
                "batch_size": b,
                "calls": len(lengths) if name == PLAIN else len(padded_batches(lengths, b)),
                "seconds_per_pass": med,
                "x_real_time": audio_s / med,
                "ratio_to_plain": statistics.median(ratios),
                "ratio_q25": _quantile(ratios, 0.25),
                "ratio_q75": _quantile(ratios, 0.75),
                "padding_share": 0.0 if name == PLAIN else padding_share(lengths, b),
                "codes": int(used.sum()),
                "codes_differ": differ,
                "codes_differ_share": differ / max(int(used.sum()), 1),
                "codes_differ_level0": differ_0,
                "codes_identical": differ == 0,
                "passes_with_other_codes": unstable[name],
                "seconds_per_pass_all": s,
            }
        )
    return rows


def _differ_cell(r: dict) -> str:
    if r["variant"] == PLAIN:
        return "reference"
    if r["codes_differ"] == 0:
        return "0 (identical)"
    return f"{100 * r['codes_differ_share']:.3f}% ({r['codes_differ']} of {r['codes']})"


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| variant | batch | calls | s/pass | x real time | ratio to plain | ratio IQR | padding | codes differing "
        "from plain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['batch_size']} | {r['calls']} | {r['seconds_per_pass']:.2f} | "
            f"{r['x_real_time']:.1f} | {r['ratio_to_plain']:.3f} | {r['ratio_q25']:.3f}-{r['ratio_q75']:.3f} | "
            f"{100 * r['padding_share']:.1f}% | {_differ_cell(r)} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def _int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not out or min(out) < 1 or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"want distinct positive integers, got {text!r}")
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clips", type=int, default=24, help="clips to encode per pass (default: %(default)s)")
    p.add_argument("--min-seconds", type=float, default=5.0, help="shortest clip (default: %(default)s)")
    p.add_argument("--max-seconds", type=float, default=30.0, help="longest clip (default: %(default)s)")
    p.add_argument(
        "--batch-sizes",
        type=_int_list,
        default=[1, 4, 16],
        help="comma-separated encode_clips batch sizes (default: 1,4,16)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved passes per variant (default: %(default)s)")
    p.add_argument(
        "--warmup-clips",
        type=int,
        default=2,
        help="untimed: each variant first encodes this many of the shortest clips (default: %(default)s)",
    )
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where EnCodec encodes (default: %(default)s)"
    )
    p.add_argument(
        "--audio",
        choices=("synth", "noise"),
        default="synth",
        help="synth: the package's procedural music (mono mix); noise: white noise (default: %(default)s)",
    )
    p.add_argument(
        "--tokenizer",
        choices=("calibrated", "untrained"),
        default="calibrated",
        help="calibrated: codebooks fitted as the stage fits them; untrained: all-zero codes, "
        "same encoder cost (default: %(default)s)",
    )
    p.add_argument(
        "--calibration-frames",
        type=int,
        default=20000,
        help="frames to calibrate on, from separate clips (default: %(default)s, as config.yaml)",
    )
    p.add_argument(
        "--calibration-iters", type=int, default=20, help="k-means iterations per level (default: %(default)s)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seeds the clips, their lengths and the tokenizer (default: %(default)s)"
    )
    p.add_argument(
        "--allocator",
        choices=("default", "keep"),
        default="default",
        help="default: glibc as it comes; keep: utils.keep_freed_memory(), as the tokenize stage runs "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--compare-allocators",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead: run this benchmark ROUNDS times per allocator, alternating, each in a fresh "
        "process, and report keep / default per variant (median of the per-round ratios)",
    )
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the results here")
    args = p.parse_args(argv)
    for name in ("clips", "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.warmup_clips < 0:
        p.error("--warmup-clips must be at least 0")
    if args.tokenizer == "calibrated" and args.calibration_frames < 1024:
        p.error("--calibration-frames must be at least 1024 (the codebook size)")
    if not 0 < args.min_seconds <= args.max_seconds:
        p.error("want 0 < --min-seconds <= --max-seconds")
    return args


def compare_allocators(argv: list[str], rounds: int) -> dict:
    """The allocator cannot be switched back within a process (mallopt fixes glibc's adaptive
    threshold), so each run is its own process: default, keep, keep, default, ... (order
    alternating each round), and each ratio pairs the two runs of one round."""
    import subprocess
    import tempfile

    base, skip = [], False
    for a in argv:  # this invocation's options minus the ones the driver sets
        if skip:
            skip = False
        elif a in ("--compare-allocators", "--allocator", "--json"):
            skip = True
        elif not a.startswith(("--compare-allocators=", "--allocator=", "--json=")):
            base.append(a)
    runs: dict[str, list[dict]] = {"default": [], "keep": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for alloc in ("default", "keep") if r % 2 == 0 else ("keep", "default"):
                out = Path(tmp) / f"{alloc}{r}.json"
                subprocess.run(
                    [sys.executable, __file__, *base, "--allocator", alloc, "--json", str(out)],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                runs[alloc].append(json.loads(out.read_text()))
    rows = []
    for i, row in enumerate(runs["default"][0]["rows"]):
        d = [run["rows"][i]["x_real_time"] for run in runs["default"]]
        k = [run["rows"][i]["x_real_time"] for run in runs["keep"]]
        rows.append(
            {
                "variant": row["variant"],
                "default_x_real_time": statistics.median(d),
                "keep_x_real_time": statistics.median(k),
                "ratio_keep_to_default": statistics.median(b / a for a, b in zip(d, k)),
                "ratio_min": min(b / a for a, b in zip(d, k)),
                "ratio_max": max(b / a for a, b in zip(d, k)),
                "peak_rss_gb": [
                    runs["default"][0]["machine"]["peak_rss_gb"],
                    runs["keep"][0]["machine"]["peak_rss_gb"],
                ],
            }
        )
    print("| variant | x real time, default glibc | x real time, keep_freed_memory | ratio keep / default (min-max) |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['default_x_real_time']:.1f} | {r['keep_x_real_time']:.1f} | "
            f"{r['ratio_keep_to_default']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) |"
        )
    return {"rounds": rounds, "rows": rows, "runs": runs}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.compare_allocators:
        result = compare_allocators(sys.argv[1:] if argv is None else list(argv), args.compare_allocators)
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        return result
    if args.allocator == "keep" and not keep_freed_memory():
        raise SystemExit("--allocator keep: no glibc mallopt here")
    set_threads(args.threads)
    device = pick_device(args.device)
    t_start = time.perf_counter()
    info = machine_info(device)

    lengths = clip_lengths(args.clips, args.min_seconds, args.max_seconds, args.seed)
    audio, clips = make_corpus(args.audio, lengths, args.seed)
    model, tok = tokenizer_model(args.tokenizer, args.seed, args.audio, args.calibration_frames, args.calibration_iters)
    model = model.to(device)
    audio_s = float(lengths.sum()) / SAMPLE_RATE
    print(
        f"# {args.clips} {args.audio} clips of {lengths.min() / SAMPLE_RATE:.1f}-{lengths.max() / SAMPLE_RATE:.1f} s "
        f"({audio_s:.1f} s of audio); EnCodec 24 kHz at {BANDWIDTH:g} kbps, {n_codebooks(model)} codebooks, "
        f"{args.tokenizer} tokenizer"
        + (
            f" ({tok['calibration_frames']} frames, {args.calibration_iters} iters, {tok['calibration_seconds']:.0f} s)"
            if args.tokenizer == "calibrated"
            else " (every code is 0: the code comparison is vacuous)"
        ),
        file=sys.stderr,
    )
    print(f"# {info}", file=sys.stderr, flush=True)

    times, codes, unstable = benchmark(model, audio, clips, device, args.batch_sizes, args.repeats, args.warmup_clips)
    rows = summarize(args.batch_sizes, times, codes, unstable, lengths)
    print(markdown_table(rows))
    b1 = next((r for r in rows if r["variant"] != PLAIN and r["batch_size"] == 1), None)
    level0 = codes[PLAIN][0][codes[PLAIN][0] >= 0]
    notes = [
        f"tokenizer: {args.tokenizer}; level-0 codes used by the plain pass: {len(np.unique(level0))} of 1024",
    ]
    if b1 is not None:
        notes.append(
            "encode_clips B=1 codes "
            + ("identical to" if b1["codes_identical"] else "DIFFER from")
            + " the plain API's"
            + ("" if b1["codes_identical"] else f" ({b1['codes_differ']} codes)")
        )
    shaky = [r["variant"] for r in rows if r["passes_with_other_codes"]]
    if shaky:
        notes.append(f"codes changed between repetitions in: {', '.join(shaky)}")
    print("\n" + "\n".join(notes))
    if b1 is not None and not b1["codes_identical"]:
        print("warning: encode_clips B=1 does not reproduce model.encode per clip", file=sys.stderr)

    if hasattr(os, "getloadavg"):
        info["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    info["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # Linux: KiB
    if device.type == "cuda":
        info["peak_cuda_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    info["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    result = {
        **benchmark_header(__file__, argv),
        "machine": info,
        **tok,
        "audio": args.audio,
        "clips": args.clips,
        "clip_seconds": [round(int(n) / SAMPLE_RATE, 4) for n in lengths],
        "audio_seconds": audio_s,
        "batch_sizes": args.batch_sizes,
        "repeats": args.repeats,
        "warmup_clips": args.warmup_clips,
        "allocator": args.allocator,
        "level0_codes_used": int(len(np.unique(level0))),
        "batch1_identical": None if b1 is None else b1["codes_identical"],
        "rows": rows,
    }
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
