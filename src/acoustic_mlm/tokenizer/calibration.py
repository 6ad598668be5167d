"""Calibration: the untrained EnCodec's residual vector quantizer fitted by k-means, level by level
on the residuals, on encoder embeddings of the train split.

After calibration the codes still come out of EnCodec's own `model.encode`. The fit centres the
encoder's output (its last bias absorbs the mean), and runs on a fixed thread count, so the
calibrated model is identical for any --threads; the codes then differ between thread counts only
at float near-ties (measured: under 0.05% of codes).

    calibrate = crop windows -> pick crops -> embed (at the normalised loudness) -> centre the
                encoder -> per RVQ level: k-means, load the codebook, carry the residual

Tensor axes: N points (frames), D = 128 embedding channels.
"""

from __future__ import annotations

import contextlib
import time
from typing import Sequence

import numpy as np
import torch

from acoustic_mlm import encodec
from acoustic_mlm.tokenizer.codec import TokenizerError, n_codebooks
from acoustic_mlm.tokenizer.kmeans import kmeans, sq_dists
from acoustic_mlm.tokenizer.loudness import frame_gains, scaled_frames
from acoustic_mlm.utils import Progress, log

# Calibration always runs on this many torch threads. Float results depend on the thread count
# (work partitioning), and k-means amplifies last-bit differences in its input into different
# codebooks (measured: 1 vs 2 threads left 91% of level-0 codes and <25% of deeper ones equal).
# Fixed, the codebooks do not depend on the stage's --threads.
CALIBRATION_THREADS = 2


@contextlib.contextmanager
def _torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.no_grad()
def calibrate(
    model,
    audio_chunks: Sequence[np.ndarray],
    frames: int,
    iters: int,
    seed: int,
    *,
    crop_frames: int = 150,
    context_frames: int = 16,
    batch_size: int = 4,
    loudness: tuple[str, float] = ("none", 0.0),
) -> dict:
    """Fit the RVQ codebooks in use to the encoder's embeddings of `audio_chunks`, in place.

    audio_chunks: 1-D float arrays at 24 kHz (the train clips). They are cut into crops of
    `crop_frames` frames; a random subset covering `frames` frames is encoded (each crop with up
    to `context_frames` frames of left context whose outputs are dropped, so crop starts are
    not all zero-padded starts), and exactly `frames` embeddings are subsampled. Then, level by
    level: k-means on the current residual, centroids loaded into the level's codebook, residual
    minus its quantisation through the codebook's own encode/decode (leave-one-out for frames
    alone in their cluster, see below). The encoder's output is centred first (its last bias
    absorbs the mean), so the model changes in the encoder's last bias and in the codebooks.
    loudness: (method, target) of `frame_gains`: each picked chunk is normalised as encode will
    normalise it.
    Runs on CALIBRATION_THREADS torch threads whatever the caller's setting, so that the result
    depends only on the inputs and the seed.
    Returns statistics; the residual variance reported per level is that of the residual
    carried to the next level, relative to the embeddings' variance.
    """
    with _torch_threads(CALIBRATION_THREADS):
        return _calibrate(model, audio_chunks, frames, iters, seed, crop_frames, context_frames, batch_size, loudness)


def _calibrate(model, audio_chunks, frames, iters, seed, crop_frames, context_frames, batch_size, loudness) -> dict:
    t0 = time.perf_counter()
    bins = model.quantizer.bins
    if frames < bins:
        raise ValueError(f"calibrate: frames ({frames}) must be at least the codebook size ({bins})")
    g = torch.Generator().manual_seed(seed)  # draws, in order: the crops, the subsample, each level's k-means
    picked = _pick_crops(_crop_windows(audio_chunks, crop_frames, context_frames), frames, bins, g)
    t_enc = time.perf_counter()
    emb = _embed_crops(model, audio_chunks, picked, batch_size, _chunk_gains(audio_chunks, picked, loudness))  # (N, D)
    t_enc = time.perf_counter() - t_enc
    if len(emb) > frames:
        emb = emb[torch.randperm(len(emb), generator=g)[:frames]]
    offset = _centre_encoder(model, emb)
    emb = (emb - offset).contiguous()
    t_km = time.perf_counter()
    distinct, residual_variance = _fit_codebooks(model, emb, iters, g)
    t_km = time.perf_counter() - t_km
    return {
        "calibration_frames": int(len(emb)),
        "calibration_threads": CALIBRATION_THREADS,
        "calibration_encoder_offset_norm": round(float(offset.norm()), 6),
        "calibration_crops": len(picked),
        "calibration_encoder_seconds": round(t_enc, 3),
        "calibration_kmeans_seconds": round(t_km, 3),
        "calibration_seconds": round(time.perf_counter() - t0, 3),
        "calibration_distinct_codes": distinct,
        "calibration_residual_variance": [round(e, 5) for e in residual_variance],
    }


# ----------------------------------------------------------------------------- the frames fitted on


def _crop_windows(audio_chunks, crop_frames: int, context_frames: int) -> list[tuple[int, int, int, int]]:
    """Every crop of every chunk: (chunk index, start frame, context frames, frames kept)."""
    windows = []
    for ci, chunk in enumerate(audio_chunks):
        nf = len(chunk) // encodec.HOP
        for st in range(0, nf, crop_frames):
            windows.append((ci, st, min(st, context_frames), min(crop_frames, nf - st)))
    return windows


def _pick_crops(windows: list, frames: int, bins: int, generator: torch.Generator) -> list:
    """Crops in a random order until they hold `frames` frames (all of them when they hold fewer)."""
    available = sum(w[3] for w in windows)
    if available < bins:
        raise TokenizerError(f"calibration needs at least {bins} train frames; the train split has {available}")
    if available < frames:
        log.warning(
            "calibration: tokenizer.calibration_frames is %d (%.0f per code), the train split has %d "
            "(%.1f per code, %.1f min); fitting on all of it",
            frames,
            frames / bins,
            available,
            available / bins,
            available / encodec.FRAME_RATE / 60,
        )
    picked, have = [], 0
    for i in torch.randperm(len(windows), generator=generator).tolist():
        if have >= frames:
            break
        picked.append(windows[i])
        have += windows[i][3]
    return picked


def _chunk_gains(audio_chunks, picked: list, loudness: tuple[str, float]) -> dict | None:
    """Chunk index -> per-frame gain of each chunk a picked crop comes from; None for loudness none.
    Measured on the whole chunk, as encode_shard measures the whole clip."""
    method, target = loudness
    if method == "none":
        return None
    return {ci: frame_gains(np.asarray(audio_chunks[ci]), method, target) for ci in sorted({w[0] for w in picked})}


@torch.no_grad()
def _embed_crops(model, chunks, windows, batch_size: int, gains: dict | None = None) -> torch.Tensor:
    """Encoder embeddings (N, D) of the frames in `windows` = (chunk, start, ctx, keep) in frames.

    gains: chunk index -> per-frame gain (frame_gains), applied to the audio the encoder sees."""
    out = []
    by_len: dict[int, list] = {}
    for w in windows:
        by_len.setdefault(w[2] + w[3], []).append(w)
    total = sum(w[3] for w in windows)
    with Progress(total, "calibrate: encoder", unit="frame") as bar:
        for length in sorted(by_len):
            group = by_len[length]
            for s in range(0, len(group), batch_size):
                batch = group[s : s + batch_size]
                wav = np.stack(
                    [
                        scaled_frames(chunks[ci], gains.get(ci) if gains else None, st - ctx, st + keep)
                        for ci, st, ctx, keep in batch
                    ]
                )
                emb = model.encoder(torch.from_numpy(wav.astype(np.float32, copy=False))[:, None])  # (B, D, T)
                for b, (_, _, ctx, keep) in enumerate(batch):
                    out.append(emb[b, :, ctx : ctx + keep].t())  # (keep, D)
                bar.update(sum(w[3] for w in batch))
    return torch.cat(out)


def _centre_encoder(model, emb: torch.Tensor) -> torch.Tensor:
    """Fold the embeddings' mean (D,) into the encoder's last bias, in place; returns the mean.

    The untrained encoder emits a large constant offset (norm ~0.34) with tiny variation (~0.0045),
    so the float32 distances of EnCodec's quantize (|x|^2 - 2 x.c + |c|^2) cancel catastrophically:
    measured, 4% of codes changed with the thread count. Centred, under 0.05% do.
    """
    offset = emb.mean(0)
    head = model.encoder.model[-1].conv.conv  # SConv1d -> NormConv1d -> Conv1d (128 out)
    head.bias.sub_(offset)
    return offset


# ----------------------------------------------------------------------------- the codebooks


def _fit_codebooks(model, emb: torch.Tensor, iters: int, generator: torch.Generator) -> tuple[list[int], list[float]]:
    """Each RVQ level in use fitted to the residual the levels before it leave; per level, the codes
    used and the variance of the residual carried on, relative to the embeddings'."""
    bins = model.quantizer.bins
    residual = emb.clone()
    energy0 = float(emb.pow(2).sum())
    distinct, residual_energy = [], []
    for level, layer in enumerate(model.quantizer.vq.layers[: n_codebooks(model)]):
        codes, residual = _fit_level(layer, residual, bins, iters, generator)
        distinct.append(int(codes.unique().numel()))
        residual_energy.append(float(residual.pow(2).sum()) / max(energy0, 1e-30))
        log.info(
            "calibrate: level %d: %d/%d codes used, residual variance %.3f",
            level,
            distinct[-1],
            bins,
            residual_energy[-1],
        )
    return distinct, residual_energy


def _fit_level(
    layer, residual: torch.Tensor, bins: int, iters: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One RVQ level: k-means on `residual` (N, D), the centroids loaded into the level's codebook;
    returns the level's codes (N,) and the residual carried to the next level (N, D)."""
    centroids, counts = kmeans(residual, bins, iters, generator)
    cb = layer._codebook
    cb.embed.copy_(centroids)
    cb.embed_avg.copy_(centroids)  # as EnCodec's own init_embed_ does
    cb.cluster_size.copy_(counts.to(cb.cluster_size.dtype))
    cb.inited.fill_(1.0)
    codes = layer.encode(residual.t()[None])[0]  # (N,), EnCodec's own nearest-code rule
    quantized = layer.decode(codes[None])[0].t()  # (N, D)
    # Leave-one-out for singletons: a frame alone in its cluster is its own centroid, so its
    # residual is exactly zero, unlike that of any frame not in the calibration set. Carry
    # its residual against the next-nearest centroid instead. Without this, few frames per
    # code collapse the deeper levels (measured: 1,500 frames leave levels 2-7 with 1 code).
    single = torch.bincount(codes, minlength=bins)[codes] == 1
    if single.any():
        r = residual[single]
        second = sq_dists(r, centroids, centroids.pow(2).sum(1)[None]).topk(2, largest=False).indices[:, 1]
        quantized[single] = centroids[second]
    return codes, residual - quantized
