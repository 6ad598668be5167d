"""The data stages' throughput per CPU core on real music: MP3 decode + resample (prepare), and the
EnCodec 24 kHz encoder at the pretrained model's architecture (tokenize in pretrained mode).

The recordings: the music excerpts of librosa's example data (../shared/audio/librosa, or
$AMLM_REAL_AUDIO; never copied into the repository), each cut to `--clip-seconds` (FMA's clips are 30 s),
written here as 44.1 kHz stereo MP3 (what FMA serves) into a temporary folder.

- **decode**: `acoustic_mlm.data.decode.decode` of each MP3, as the prepare stage runs it: decode, mix to
  mono, resample to 24 kHz, trim to whole EnCodec frames. Baseline in the same run: the same audio as
  16-bit WAV through the same function (the ratio is what MP3 decoding costs on top of reading and
  resampling).
- **encode**: `acoustic_mlm.tokenizer.encode.encode_clips` over the decoded clips with the pretrained
  mode's settings (no loudness normalisation; the GPU presets' 60 s segments with 2 s of context; batch
  size 1, the CPU's fastest), on EnCodec 24 kHz with random weights: the released checkpoint's
  architecture, so the same cost (the weights cannot be downloaded here).

One torch thread and one process: the numbers are per core. Speed is audio seconds per wall second
(x real time); "core-hours per audio hour" is its inverse in hours, what `amlm preflight` multiplies the
corpus by. Each is the median over `--repeats` passes.

    python benchmarks/data_throughput.py --json results/data_throughput.json
    python benchmarks/data_throughput.py --device cuda --encode-batch 16   # the encoder on a GPU (by hand)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import soundfile as sf
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from acoustic_mlm import encodec  # noqa: E402
from acoustic_mlm.data.decode import decode  # noqa: E402
from acoustic_mlm.tokenizer.encode import EncodeSettings, encode_clips  # noqa: E402
from acoustic_mlm.utils import write_result  # noqa: E402

MUSIC = ("waltz", "ragtime", "Hungarian", "Karissa", "Tchaikovsky", "Vibe_Ace", "Drum-bass", "trumpet")


def recordings(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.glob("*.ogg") if any(m in p.name for m in MUSIC))
    if not files:
        raise SystemExit(f"no music recordings under {folder} (set AMLM_REAL_AUDIO)")
    return files


def make_files(sources: list[Path], out: Path, clip_seconds: float) -> list[tuple[Path, Path, float]]:
    """Each recording's first clip_seconds as a 44.1 kHz stereo MP3 and the same as 16-bit WAV."""
    import torchaudio.functional as AF

    made = []
    for src in sources:
        x, sr = sf.read(src, dtype="float32", always_2d=True)
        x = x[: int(clip_seconds * sr)]
        y = AF.resample(torch.from_numpy(x.T.copy()), sr, 44100).numpy().T
        y = np.repeat(y, 2, axis=1) if y.shape[1] == 1 else y[:, :2]
        y = 0.9 * y / max(1e-9, float(np.abs(y).max()))
        mp3, wav = out / f"{src.stem}.mp3", out / f"{src.stem}.wav"
        sf.write(mp3, y, 44100, format="MP3")
        sf.write(wav, y, 44100, subtype="PCM_16")
        made.append((mp3, wav, len(y) / 44100))
    return made


def time_decode(paths: list[Path], repeats: int) -> list[float]:
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for p in paths:
            decode(p, encodec.SAMPLE_RATE, encodec.HOP)
        walls.append(time.perf_counter() - t0)
    return walls


def pretrained_architecture():
    """EnCodec 24 kHz at 6 kbps, the released checkpoint's architecture, random weights and codebooks."""
    from encodec import EncodecModel

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = EncodecModel.encodec_model_24khz(pretrained=False)
    with torch.no_grad():
        for layer in model.quantizer.vq.layers:
            layer._codebook.embed.normal_()
            layer._codebook.inited.fill_(1.0)
    model.set_target_bandwidth(6.0)
    return model.eval()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_audio = Path(os.environ.get("AMLM_REAL_AUDIO", ROOT.parent / "shared/audio/librosa"))
    ap.add_argument("--audio", type=Path, default=default_audio, help="folder of the recordings")
    ap.add_argument("--clip-seconds", type=float, default=30.0, help="each recording cut to this (FMA: 30 s)")
    ap.add_argument("--repeats", type=int, default=3, help="decode passes (the median is reported)")
    ap.add_argument("--encode-repeats", type=int, default=1, help="encode passes")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where EnCodec encodes")
    ap.add_argument("--encode-batch", type=int, default=1, help="clips per padded EnCodec batch")
    ap.add_argument("--skip-decode", action="store_true", help="the encoder only (a GPU run)")
    ap.add_argument("--json", type=Path, help="write the result here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    result = {"torch": torch.__version__, "threads": 1, "device": args.device, "clip_seconds": args.clip_seconds}
    with tempfile.TemporaryDirectory() as tmp:
        made = make_files(recordings(args.audio), Path(tmp), args.clip_seconds)
        audio_s = sum(s for _, _, s in made)
        result["files"], result["audio_seconds"] = len(made), round(audio_s, 2)
        if not args.skip_decode:
            mp3 = statistics.median(time_decode([m for m, _, _ in made], args.repeats))
            wav = statistics.median(time_decode([w for _, w, _ in made], args.repeats))
            result["decode"] = {
                "mp3_x_real_time": round(audio_s / mp3, 1),
                "wav_x_real_time": round(audio_s / wav, 1),
                "mp3_over_wav_time": round(mp3 / wav, 2),
                "core_hours_per_audio_hour": round(mp3 / audio_s, 5),
            }
        clips = [decode(m, encodec.SAMPLE_RATE, encodec.HOP)[0] for m, _, _ in made]
    lengths = [len(c) for c in clips]
    audio = np.concatenate(clips)
    table = pd.DataFrame({"offset": np.concatenate([[0], np.cumsum(lengths)[:-1]]), "num_samples": lengths})
    model = pretrained_architecture().to(args.device)
    settings = EncodeSettings(
        batch_size=args.encode_batch, segment_frames=60 * 75, context_frames=2 * 75, device=args.device
    )
    walls = []
    for _ in range(args.encode_repeats):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        codes = encode_clips(model, audio, table, settings)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    enc = statistics.median(walls)
    enc_audio_s = len(audio) / encodec.SAMPLE_RATE
    result["encode"] = {
        "x_real_time": round(enc_audio_s / enc, 2),
        "core_hours_per_audio_hour": round(enc / enc_audio_s, 5),
        "batch_size": args.encode_batch,
        "frames": int(codes.shape[1]),
    }
    print(json.dumps(result, indent=2))
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
