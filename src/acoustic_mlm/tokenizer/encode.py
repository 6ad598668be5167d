"""Encoding: the codes of every clip of a shard through EnCodec's own `model.encode`, in zero-padded
batches (longest first), long clips in segments with left context, each clip's codes trimmed to its
own frames and written into columns aligned with the shard's audio.

Tensor axes: K codebooks (RVQ levels), T frames, B clips of a batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from acoustic_mlm import encodec
from acoustic_mlm.tokenizer.codec import n_codebooks
from acoustic_mlm.tokenizer.loudness import scaled_frames
from acoustic_mlm.utils import Progress

if TYPE_CHECKING:
    from acoustic_mlm.config import TokenizerConfig


@dataclass(frozen=True)
class EncodeSettings:
    """How `encode_clips` batches and cuts the clips. They bound memory and set the speed; the codes
    move only at float near-ties (see `encode_clips`)."""

    batch_size: int = 1  # clips per zero-padded batch, longest first
    segment_frames: int = 0  # a clip longer than this (> 0) is encoded in segments; 0: never
    context_frames: int = 0  # left context per segment, its codes dropped
    device: torch.device | str = "cpu"  # where EnCodec encodes

    @classmethod
    def from_config(cls, tc: TokenizerConfig, device: torch.device | str) -> "EncodeSettings":
        """From the typed `tokenizer:` section (`Config.tokenizer`; its seconds rounded to whole frames)
        and the device picked for it."""
        return cls(
            batch_size=int(tc.batch_size),
            segment_frames=int(round(tc.segment_seconds * encodec.FRAME_RATE)),
            context_frames=int(round(tc.context_seconds * encodec.FRAME_RATE)),
            device=device,
        )


def padded_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Clip indices in batches of up to `batch_size`, longest first, so that padding stays small."""
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    return [order[b : b + batch_size] for b in range(0, len(order), batch_size)]


def pieces(
    offsets: Sequence[int], lengths: Sequence[int], segment_frames: int = 0, context_frames: int = 0
) -> list[tuple[int, int, int, int]]:
    """What to encode for each clip, in frames: (first input frame, input frames, leading frames to
    drop, first output column). A clip longer than `segment_frames` (> 0) is cut into segments,
    each encoded with up to `context_frames` frames of the clip before it as left context, whose
    codes are dropped; shorter clips are one piece."""
    out = []
    for o, s in zip(offsets, lengths):
        first, n = int(o) // encodec.HOP, int(s) // encodec.HOP
        if segment_frames <= 0 or n <= segment_frames:
            out.append((first, n, 0, first))
            continue
        for st in range(0, n, segment_frames):
            a, end = max(0, st - context_frames), min(n, st + segment_frames)
            out.append((first + a, end - a, st - a, first + st))
    return out


@torch.no_grad()
def encode_clips(
    model,
    audio: np.ndarray,
    clips,
    settings: EncodeSettings = EncodeSettings(),
    *,
    frame_gain: np.ndarray | None = None,
    out: np.ndarray | None = None,
    label: str = "tokenize",
) -> np.ndarray:
    """Codes of every clip through `model.encode`, aligned with `audio`: (K, len(audio) // 320) int16.

    clips: rows with offset and num_samples into `audio` (a shard's manifest rows). Clip i fills
    columns offset_i // 320 ... + num_samples_i // 320, exactly; columns of no clip hold -1.
    Clips are encoded in zero-padded batches of up to `settings.batch_size` (longest first) and each
    clip's codes are trimmed to its own frames. The 24 kHz encoder is causal, so padding on the
    right leaves a clip's frames unchanged (measured: bit-identical embeddings); batch_size 1 is
    bit-identical to `model.encode` of each clip alone, larger batches may flip rare near-tie
    frames (float summation order differs). Clips longer than `settings.segment_frames` (> 0) are
    encoded in segments with `settings.context_frames` of left context (see `pieces`), so that memory
    is bounded by batch_size x segment, not by the longest file (measured on a 60 s clip, calibrated
    tokenizer: 1 s of context or more gives codes identical to the whole clip's; none, 98.5 %).
    `frame_gain`: a gain per frame of `audio` (float32, len(audio) // 320), applied to what the
    encoder sees (loudness normalisation, `loudness.clip_loudness`); None: the audio as is.
    `out`: an int16 array of that shape to fill (e.g. a memory-mapped .npy, so that codes never
    sit in memory). `label`: the progress line's name.
    """
    K = n_codebooks(model)
    shape = (K, len(audio) // encodec.HOP)
    if out is None:
        out = np.empty(shape, dtype=np.int16)
    if out.shape != shape or out.dtype != np.int16:
        raise ValueError(f"encode_clips: out must be int16 {shape}, got {out.dtype} {out.shape}")
    codes = out
    codes[:] = -1
    todo = pieces(
        clips["offset"].to_numpy(np.int64),
        clips["num_samples"].to_numpy(np.int64),
        settings.segment_frames,
        settings.context_frames,
    )
    frames = [p[1] for p in todo]
    total = sum(p[1] - p[2] for p in todo)
    t0, done = time.perf_counter(), 0
    with Progress(total, label, unit="frame") as bar:
        for batch in padded_batches(frames, settings.batch_size):
            wav = np.zeros((len(batch), max(frames[i] for i in batch) * encodec.HOP), dtype=np.float32)
            for row, i in enumerate(batch):
                first, n = todo[i][0], todo[i][1]
                wav[row, : n * encodec.HOP] = scaled_frames(audio, frame_gain, first, first + n)
            encoded = model.encode(torch.from_numpy(wav)[:, None].to(settings.device))  # [(codes (B, K, T), scale)]
            c = torch.cat([f[0] for f in encoded], dim=-1).cpu().numpy()
            kept = 0
            for row, i in enumerate(batch):
                _, n, drop, dest = todo[i]
                if c.shape[1] != K or c.shape[2] < n:
                    raise RuntimeError(f"EnCodec gave {c.shape[1:]} codes for {n} frames, want ({K}, {n})")
                codes[:, dest : dest + n - drop] = c[row, :, drop:n]
                kept += n - drop
            done += kept
            bar.update(kept, x_real_time=done / encodec.FRAME_RATE / max(time.perf_counter() - t0, 1e-9))
    return codes
