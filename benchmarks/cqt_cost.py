"""The CQT target two ways (model.cqt_impl): nnAudio's convolutions against the same kernels by FFT.

Agreement: crops of real recordings (a folder of audio files, e.g. ../shared/audio/librosa: read
in place, never copied), both paths in float32 against each other and against a float64 evaluation
of the same transform (the fft path's formula with every block kept, in complex128). Cost: both
paths on the same crops in one process, repetitions interleaved (nnaudio, fft, nnaudio, ...); the
ratio is the median of the per-repetition ratios nnaudio ms / fft ms, so a shared machine's drift
cancels. MERT's settings (336 bins from 32.7 Hz, 48 per octave, hop 320 at 24 kHz).

    python benchmarks/cqt_cost.py --folder ../shared/audio/librosa --frames 384 --batch 4 --threads 1
    python benchmarks/cqt_cost.py --folder ../shared/audio/librosa --device cuda --batch 16,7 --frames 375,384
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from acoustic_mlm import encodec
from acoustic_mlm.devices import pick_device
from acoustic_mlm.model.cqt import FFT_BLOCK_TOL, CQTTarget, _FFTPlan
from acoustic_mlm.utils import benchmark_header, machine_info, set_threads, write_result

AUDIO = (".ogg", ".flac", ".wav", ".mp3")


def crops(folder: Path, frames: int, per_file: int) -> torch.Tensor:
    """Up to `per_file` crops of `frames` code frames from each recording, mono, 24 kHz, float32."""
    import soundfile as sf
    import torchaudio

    n = frames * encodec.HOP
    out = []
    for path in sorted(p for p in folder.iterdir() if p.suffix.lower() in AUDIO):
        x, sr = sf.read(path, dtype="float32", always_2d=True)
        x = torchaudio.functional.resample(torch.from_numpy(x.mean(axis=1)), sr, encodec.SAMPLE_RATE)
        starts = np.linspace(0, max(len(x) - n, 0), per_file).astype(int) if len(x) >= n else [0]
        for s in starts:
            seg = x[s : s + n]
            out.append(torch.nn.functional.pad(seg, (0, n - len(seg))))
    if not out:
        raise SystemExit(f"cqt_cost: no audio files ({', '.join(AUDIO)}) in {folder}")
    return torch.stack(out)


def agreement(nnaudio: CQTTarget, fft: CQTTarget, wav: torch.Tensor, batch: int) -> dict:
    """max abs and relative errors of the fft path and of nnAudio's against a float64 evaluation."""
    s = nnaudio.spec
    kernels = torch.complex(s.cqt_kernels_real[:, 0].cpu().double(), -s.cqt_kernels_imag[:, 0].cpu().double())
    exact_plan = _FFTPlan(
        kernels,
        s.lenghts.cpu(),
        wav.shape[1] - encodec.HOP // 2,
        encodec.HOP,
        0.0,
        torch.device("cpu"),
        torch.complex128,
    )
    T = wav.shape[1] // encodec.HOP
    a, b, e = [], [], []
    for i in range(0, len(wav), batch):
        w = wav[i : i + batch]
        a.append(nnaudio(w).double().cpu())
        b.append(fft(w).double().cpu())
        e.append(exact_plan(w.double()[:, encodec.HOP // 2 :], T))
    ref, new, exact = torch.cat(a), torch.cat(b), torch.cat(e)
    large = ref > 1e-3 * ref.max()

    def errors(x, y):
        err = (x - y).abs()
        rel = err[large] / y[large]
        return {
            "max_abs": float(err.max()),
            "max_abs_over_max": float(err.max() / y.max()),
            "rel_p99_large": float(rel.quantile(0.99)),
            "rel_max_large": float(rel.max()),
            "mean_abs": float(err.mean()),
        }

    return {
        "crops": len(wav),
        "largest_magnitude": float(ref.max()),
        "large": "magnitudes above 1e-3 of the largest",
        "fft_vs_nnaudio": errors(new, ref),
        "fft_vs_float64": errors(new, exact),
        "nnaudio_vs_float64": errors(ref, exact),
    }


def timing(nnaudio: CQTTarget, fft: CQTTarget, wav: torch.Tensor, repeats: int, device: torch.device) -> dict:
    def once(f) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        f(wav)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return 1000 * (time.perf_counter() - t0)

    once(nnaudio), once(fft)  # first calls: kernels to the device, the fft plan
    ms = {"nnaudio": [], "fft": []}
    for r in range(repeats):
        ms["nnaudio"].append(once(nnaudio))
        ms["fft"].append(once(fft))
        print(
            f"  repeat {r + 1}/{repeats}: nnaudio {ms['nnaudio'][-1]:.1f} ms, fft {ms['fft'][-1]:.2f} ms",
            file=sys.stderr,
            flush=True,
        )
    ratios = [a / b for a, b in zip(ms["nnaudio"], ms["fft"])]
    return {
        "ms_nnaudio": statistics.median(ms["nnaudio"]),
        "ms_fft": statistics.median(ms["fft"]),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ms_all": ms,
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", type=Path, required=True, help="recordings to crop (read in place)")
    p.add_argument("--frames", default="384", help="code frames per crop, comma-separated (384: 5.12 s, paper)")
    p.add_argument("--batch", default="4", help="crops per call, comma-separated, paired with --frames")
    p.add_argument("--per-file", type=int, default=2, help="crops per recording for the agreement")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-agreement", action="store_true", help="time only")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    frames, batch = [int(x) for x in args.frames.split(",")], [int(x) for x in args.batch.split(",")]
    if len(batch) == 1:
        batch *= len(frames)
    if len(batch) != len(frames) or min(frames + batch) < 1 or args.repeats < 1:
        p.error("--frames and --batch: positive, as many of each (or one --batch)")
    args.frames, args.batch = frames, batch
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads is not None:
        set_threads(args.threads)
    device = pick_device(args.device)
    nnaudio, fft = CQTTarget(impl="nnaudio"), CQTTarget(impl="fft")
    print(f"# {machine_info(device)}; fft block tolerance {FFT_BLOCK_TOL:g}", file=sys.stderr, flush=True)
    result = {
        **benchmark_header(__file__, argv, device),
        "fft_block_tol": FFT_BLOCK_TOL,
        "cases": [],
    }
    for frames, batch in zip(args.frames, args.batch):
        wav = crops(args.folder, frames, args.per_file)
        case = {"frames": frames, "batch": batch}
        if not args.no_agreement:
            case["agreement"] = agreement(nnaudio, fft, wav.to(device), batch)
            plan = next(v for k, v in fft._plans.items() if k[1] == frames * encodec.HOP - encodec.HOP // 2)
            case["fft_blocks"] = int(len(plan.blocks))
            case["fft_plan_mb"] = plan.W.numel() * plan.W.element_size() / 1e6
        reps = (wav.repeat((batch + len(wav) - 1) // len(wav), 1)[:batch]).to(device)
        case["timing"] = timing(nnaudio, fft, reps, args.repeats, device)
        result["cases"].append(case)
        ag = case.get("agreement")
        line = (
            f"{frames} frames x {batch} crops: nnaudio {case['timing']['ms_nnaudio']:.1f} ms, fft "
            f"{case['timing']['ms_fft']:.2f} ms, ratio {case['timing']['ratio']:.0f}x"
        )
        if ag:
            f = ag["fft_vs_nnaudio"]
            line += (
                f"; fft vs nnaudio over {ag['crops']} crops: max abs {f['max_abs']:.3g} "
                f"({f['max_abs_over_max']:.3g} of the largest, {ag['largest_magnitude']:.3g}), "
                f"rel p99 {f['rel_p99_large']:.3g}, max {f['rel_max_large']:.3g} (large); fft vs float64 "
                f"{ag['fft_vs_float64']['max_abs']:.3g}, nnaudio vs float64 "
                f"{ag['nnaudio_vs_float64']['max_abs']:.3g}"
            )
        print(line, flush=True)
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
