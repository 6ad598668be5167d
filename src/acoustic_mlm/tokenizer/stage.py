"""Tokenize stage: EnCodec 24 kHz codes (8 RVQ levels x 1024 codes at 75 Hz) for every clip.

Two modes, one per `tokenizer.mode`:

- `pretrained`: the official EnCodec weights (`encodec_24khz-d7cc33bc.th`, Defossez et al. 2022,
  arXiv 2210.13438), as MERT used them. They cannot be downloaded on offline machines.
- `calibrated` (offline default): an untrained EnCodec built under a fixed seed, whose residual
  vector quantizer is fitted here by k-means, level by level on the residuals, on encoder
  embeddings of the train split. Why not EnCodec as it comes: an untrained model's codebooks are
  all zero until a training-mode forward runs its k-means init, so it emits **all-zero codes**;
  and that k-means builds an (n, 1024, 128) tensor per iteration, far too slow on CPU.
  After calibration the codes still come out of EnCodec's own `model.encode`. The tokenizer sees
  each clip at a normalised level (`tokenizer.level`: kweighted, ITU-R BS.1770 K-weighted loudness
  per 107 ms window through pyloudnorm's meter; lufs, BS.1770 integrated loudness per clip; rms,
  per 107 ms window; none), so that codebook 0 describes the music
  rather than how loud it was recorded; silence stays silence, and the model still trains on the
  raw waveform (MERT: `normalize: false`). Pretrained mode feeds EnCodec 24 kHz as released,
  which does not normalise (encodec/model.py: `audio_normalize=False` for the 24 kHz model). The fit centres
  the encoder's output (its last bias absorbs the mean), and runs on a fixed thread count, so
  `tokenizer.pt` is identical for any --threads; the codes then differ between thread counts
  only at float near-ties (measured: under 0.05% of codes).

Three steps over the prepared shards (Snakemake: one job per shard; `run` does all three in one
process for DVC and by hand), each written atomically into the stage's output folder:

1. `fit` -> `model/`: `fit.json` (mode, bandwidth, seed, calibration statistics or the
   pretrained checkpoint's sha256) and, in calibrated mode, `tokenizer.pt`: the calibrated
   model's state_dict (torch.load with weights_only=True; `load_calibrated` rebuilds the exact
   tokenizer from it). Calibration draws on the train clips of every shard.
2. `encode_shard` -> `shard-<k>/`: `codes.npy`, int16, shape (K, len(audio.npy) // 320) for the
   shard's audio.npy. Column t holds the codes of samples [320 t, 320 (t + 1)), so clip i's codes
   are columns offset_i // 320 ... + num_frames_i. Columns that belong to no clip hold -1.
   Clips are encoded in zero-padded batches of `tokenizer.batch_size` and trimmed to their own
   frames; clips longer than `tokenizer.segment_seconds` in segments with `context_seconds` of
   left context. `encode.json`: clips, seconds, speed.
   `levels.csv`: each clip's RMS dBFS, LUFS and the mean gain applied.
3. `merge` -> `files.csv` (one row per clip: level, codebook-0 codes used, entropy, most frequent
   code's share) and `tokenizer.json`: the fit, the level normalisation applied, codes used,
   unigram entropy and most frequent code's share per level on the whole corpus, total encode time
   and speed; one warning line when a code holds more than 10% of a level's frames. Written last:
   it marks the codes complete.

Tensor axes: K codebooks (RVQ levels), T frames, D = 128 embedding channels, N points.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from acoustic_mlm import readers
from acoustic_mlm.errors import UserError
from acoustic_mlm import encodec
from acoustic_mlm.encodec import CODEBOOK_SIZE, FRAME_RATE, SAMPLE_RATE
from acoustic_mlm.devices import pick_device
from acoustic_mlm.data.corpus import check_calibration_data
from acoustic_mlm.utils import Progress, atomic_dir, atomic_path, keep_freed_memory, log, set_threads, write_json

OFFICIAL_URL = "https://dl.fbaipublicfiles.com/encodec/v0/encodec_24khz-d7cc33bc.th"
OFFICIAL_SHA256_PREFIX = "d7cc33bc"  # EnCodec names its checkpoints <name>-<sha256 prefix>.th
# Calibration always runs on this many torch threads. Float results depend on the thread count
# (work partitioning), and k-means amplifies last-bit differences in its input into different
# codebooks (measured: 1 vs 2 threads left 91% of level-0 codes and <25% of deeper ones equal).
# Fixed, the codebooks do not depend on the stage's --threads.
CALIBRATION_THREADS = 2


class TokenizerError(UserError, ValueError):
    """An input or checkpoint problem; the message is one line naming the file."""


# ----------------------------------------------------------------------------- models


def _bare_encodec():
    from encodec import EncodecModel

    with warnings.catch_warnings():  # encodec uses the deprecated torch.nn.utils.weight_norm
        warnings.simplefilter("ignore", FutureWarning)
        return EncodecModel.encodec_model_24khz(pretrained=False)


def build_encodec(bandwidth: float = 6.0, seed: int = 0):
    """An untrained EnCodec 24 kHz model, identical for a seed, in eval mode at `bandwidth` kbps.

    Its codebooks are still zero (all-zero codes) until `calibrate` fits them.
    """
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG untouched
        torch.manual_seed(seed)
        model = _bare_encodec()
    model.set_target_bandwidth(float(bandwidth))
    return model.eval()


def n_codebooks(model) -> int:
    """RVQ levels in use at the model's bandwidth (6 kbps: 8)."""
    return model.quantizer.get_num_quantizers_for_bandwidth(model.frame_rate, model.bandwidth)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _name_prefix(name: str) -> str | None:
    """The sha256 prefix an EnCodec-style file name carries (`encodec_24khz-d7cc33bc.th`), if any."""
    m = re.fullmatch(r".+-([0-9a-f]{8,64})", Path(name).stem)
    return m.group(1) if m else None


def _verify(path: Path, prefix: str) -> str:
    digest = sha256_file(path)
    if not digest.startswith(prefix.lower()):
        raise TokenizerError(f"{path}: sha256 mismatch: expected a digest starting with {prefix}, got {digest}")
    return digest


def _download(url: str, dest: Path, prefix: str) -> None:
    """Fetch `url` to a temporary name beside `dest`, check its sha256 prefix, then rename."""
    log.info("downloading %s -> %s", url, dest)
    try:
        with atomic_path(dest) as tmp:
            with urllib.request.urlopen(url, timeout=60) as resp, open(tmp, "wb") as f:
                for block in iter(lambda: resp.read(1 << 20), b""):
                    f.write(block)
            digest = sha256_file(tmp)
            if not digest.startswith(prefix):
                raise TokenizerError(f"{url}: sha256 mismatch: expected a digest starting with {prefix}, got {digest}")
    except OSError as exc:  # URLError, HTTPError, timeouts
        raise TokenizerError(
            f"{url}: download failed ({exc}); set tokenizer.checkpoint to a local copy of {dest.name}"
        ) from None


def _load_state(model, path: Path):
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as exc:  # unpickling and key/shape errors are multi-line: keep one
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerError(f"{path}: not an EnCodec 24 kHz state_dict ({first})") from None
    return model


def hub_checkpoint_path(url: str = OFFICIAL_URL) -> Path:
    """Where a downloaded checkpoint lives: torch.hub.get_dir()/checkpoints/<file name>."""
    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def load_pretrained(
    checkpoint: str | Path | None = None,
    bandwidth: float = 6.0,
    *,
    expected_prefix: str = OFFICIAL_SHA256_PREFIX,
    url: str = OFFICIAL_URL,
):
    """EnCodec 24 kHz with the official weights, in eval mode at `bandwidth` kbps.

    checkpoint: a local `encodec_24khz-d7cc33bc.th`; None downloads `url` into
    torch.hub.get_dir()/checkpoints (once). The file's sha256 must start with the prefix its name
    carries (`<name>-<prefix>.th`), or `expected_prefix` when the name carries none.
    """
    if checkpoint is None:
        path = hub_checkpoint_path(url)
        prefix = _name_prefix(path.name) or expected_prefix
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            _download(url, path, prefix)
    else:
        path = Path(checkpoint).expanduser()
        if not path.is_file():
            raise TokenizerError(f"{path}: EnCodec checkpoint not found (tokenizer.checkpoint)")
        prefix = _name_prefix(path.name) or expected_prefix
    _verify(path, prefix)
    model = _load_state(_bare_encodec(), path)
    model.set_target_bandwidth(float(bandwidth))
    return model.eval()


def load_calibrated(path: str | Path, bandwidth: float = 6.0):
    """The exact calibrated tokenizer from a `tokenizer.pt` written by `run`."""
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"{path}: calibrated tokenizer not found")
    model = _load_state(_bare_encodec(), path)
    model.set_target_bandwidth(float(bandwidth))
    return model.eval()


# ----------------------------------------------------------------------------- level

LEVEL_METHODS = ("kweighted", "lufs", "rms", "none")
LUFS_GATE_DB = -70.0  # ITU-R BS.1770's absolute gate: a clip quieter than this is silence, left as is
# levels kweighted and rms: a window at or below this level (LUFS or dBFS RMS) is silence and keeps gain 1.
# 16-bit audio's quantization noise is -101 dBFS RMS; the floor sweep (-70 to -120) is in docs/tokenizer.md.
WINDOW_SILENCE_DB = -100.0
LEVEL_WINDOW_FRAMES = 8  # levels kweighted and rms: one gain per 8 frames (107 ms); 75 (1 s) measured in docs/tokenizer.md
LUFS_MIN_SAMPLES = int(0.4 * SAMPLE_RATE)  # BS.1770 measures in 400 ms blocks: a shorter clip is left as is


def rms_dbfs(x: np.ndarray) -> float:
    """Root-mean-square level in dB relative to full scale (a full-scale square wave: 0 dBFS); -inf for silence."""
    x = np.asarray(x, dtype=np.float64)
    ms = float(np.mean(x * x)) if len(x) else 0.0
    return 10 * math.log10(ms) if ms > 0 else -math.inf


def loudness_lufs(x: np.ndarray) -> float:
    """Integrated loudness (ITU-R BS.1770-4, gated; pyloudnorm) of a 24 kHz mono clip, in LUFS.

    -inf when every 400 ms block is below the absolute gate (silence); NaN for a clip under 400 ms.
    """
    import pyloudnorm

    if len(x) < LUFS_MIN_SAMPLES:
        return math.nan
    with warnings.catch_warnings(), np.errstate(divide="ignore"):
        warnings.simplefilter("ignore")  # pyloudnorm warns about possible clipping: we measure only
        return float(pyloudnorm.Meter(SAMPLE_RATE).integrated_loudness(np.asarray(x, dtype=np.float64)))


def window_loudness(clip: np.ndarray, window: int) -> np.ndarray:
    """BS.1770 loudness (K-weighted mean square, -0.691 dB; pyloudnorm's meter) of each window of
    `window` samples of a 24 kHz mono clip, in LUFS; -inf for a silent window.

    The K-weighting filter runs over the whole clip; the last, partial window is measured on its own
    samples. A 0 dBFS 1 kHz sine reads -3.01 LUFS (BS.1770-4's calibration).
    """
    import pyloudnorm

    n_win = -(-len(clip) // window)
    padded = np.zeros(n_win * window, dtype=np.float64)
    padded[: len(clip)] = clip
    meter = pyloudnorm.Meter(SAMPLE_RATE, block_size=window / SAMPLE_RATE, overlap=0.0)
    with warnings.catch_warnings(), np.errstate(divide="ignore"):
        warnings.simplefilter("ignore")  # pyloudnorm warns about possible clipping: we measure only
        meter.integrated_loudness(padded)  # fills blockwise_loudness: one value per window, ungated
    loud = np.asarray(meter.blockwise_loudness, dtype=np.float64)[:n_win]
    tail = len(clip) - (n_win - 1) * window
    if tail < window:  # the zero padding diluted the last window's mean square
        loud[-1] += 10 * math.log10(window / tail)
    return loud


def frame_gains(clip: np.ndarray, method: str, target_db: float) -> np.ndarray:
    """The gain the tokenizer applies to each EnCodec frame of `clip` (float32, len(clip) // 320).

    lufs: one gain per clip, bringing its integrated loudness to `target_db` LUFS.
    rms: one gain per window of LEVEL_WINDOW_FRAMES frames, bringing its RMS to `target_db` dBFS.
    kweighted: one gain per window of LEVEL_WINDOW_FRAMES frames, bringing its BS.1770 loudness
    (K-weighted, `window_loudness`) to `target_db` LUFS.
    none: 1. Silence stays silence: a clip below LUFS_GATE_DB, a window at or below WINDOW_SILENCE_DB,
    or a clip that cannot be measured keeps gain 1 (and digital zeros stay zeros whatever the gain).
    """
    n = len(clip) // encodec.HOP
    gains = np.ones(n, dtype=np.float32)
    if method == "none" or n == 0:
        return gains
    if method == "lufs":
        level = loudness_lufs(clip)
        if math.isfinite(level) and level > LUFS_GATE_DB:
            gains[:] = 10 ** ((target_db - level) / 20)
        return gains
    body, window = clip[: n * encodec.HOP], LEVEL_WINDOW_FRAMES * encodec.HOP
    if method == "rms":
        return _window_gains(np.array([rms_dbfs(body[st : st + window]) for st in range(0, len(body), window)]),
                             n, target_db)
    if method == "kweighted":
        return _window_gains(window_loudness(body, window), n, target_db)
    raise TokenizerError(f"config: 'tokenizer.level' must be one of {', '.join(LEVEL_METHODS)}, got {method!r}")


def _window_gains(levels: np.ndarray, n: int, target_db: float) -> np.ndarray:
    """Per-frame gains (float32, n) from one level per window of LEVEL_WINDOW_FRAMES frames: each
    window brought to `target_db`; a window at or below WINDOW_SILENCE_DB keeps gain 1."""
    with np.errstate(over="ignore"):
        gains = np.where(levels > WINDOW_SILENCE_DB, 10 ** ((target_db - levels) / 20), 1.0)
    return np.repeat(gains, LEVEL_WINDOW_FRAMES)[:n].astype(np.float32)


def level_of(cfg: dict) -> dict:
    """What the tokenizer's input is normalised to (recorded in fit.json and tokenizer.json).

    Pretrained mode: EnCodec 24 kHz as released, which does not normalise its input
    (`audio_normalize=False` in encodec/model.py; only the 48 kHz model does): always none.
    """
    tc = cfg["tokenizer"]
    method = tc.get("level", "none") if tc["mode"] == "calibrated" else "none"
    if method not in LEVEL_METHODS:
        raise TokenizerError(f"config: 'tokenizer.level' must be one of {', '.join(LEVEL_METHODS)}, got {method!r}")
    target = float(tc.get("level_target", -23.0)) if method != "none" else None
    window = f"window of {LEVEL_WINDOW_FRAMES} frames"
    unit = {"lufs": "LUFS", "kweighted": "LUFS", "rms": "dBFS RMS"}.get(method)
    return {"method": method, "target": target, "unit": unit,
            "per": {"lufs": "clip", "rms": window, "kweighted": window}.get(method),
            "silence_gate_db": {"lufs": LUFS_GATE_DB, "rms": WINDOW_SILENCE_DB, "kweighted": WINDOW_SILENCE_DB}.get(method),
            "applies_to": "the tokenizer's input only; the model trains on the raw waveform"}


# ----------------------------------------------------------------------------- k-means


def _sq_dists(x: torch.Tensor, c: torch.Tensor, c_sq: torch.Tensor) -> torch.Tensor:
    # (n, k) squared distances, expanded as in EnCodec's EuclideanCodebook.quantize, so that
    # k-means assigns points exactly as model.encode will
    return x.pow(2).sum(1, keepdim=True) - 2 * x @ c.t() + c_sq


def _assign(x: torch.Tensor, c: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid of every point and its squared distance, in chunks of `chunk` points."""
    c_sq = c.pow(2).sum(1)[None]  # (1, k)
    idx = torch.empty(len(x), dtype=torch.long)
    d2 = torch.empty(len(x), dtype=x.dtype)
    for s in range(0, len(x), chunk):
        d = _sq_dists(x[s : s + chunk], c, c_sq)  # (chunk, k)
        d2[s : s + chunk], idx[s : s + chunk] = d.min(dim=1)
    return idx, d2.clamp_min_(0)


def _init_plusplus(x: torch.Tensor, k: int, generator: torch.Generator, rounds: int, chunk: int) -> torch.Tensor:
    """k-means++-lite: D^2 sampling (Arthur & Vassilvitskii 2007) in `rounds` batches, not k steps."""
    n = len(x)
    chosen = torch.zeros(n, dtype=torch.bool)
    first = torch.randint(n, (1,), generator=generator)
    chosen[first] = True
    centroids = [x[first]]
    d2 = (x - x[first]).pow(2).sum(1)
    per_round = max(1, math.ceil((k - 1) / max(1, rounds)))
    while sum(len(c) for c in centroids) < k:
        b = min(per_round, k - sum(len(c) for c in centroids))
        w = d2.clone()
        w[chosen] = 0
        if int((w > 0).sum()) < b:  # (near-)duplicate data: fall back to uniform over the rest
            w = (~chosen).to(x.dtype)
        pick = torch.multinomial(w, b, replacement=False, generator=generator)
        chosen[pick] = True
        centroids.append(x[pick])
        new = x[pick]
        for s in range(0, n, chunk):
            dn = _sq_dists(x[s : s + chunk], new, new.pow(2).sum(1)[None]).min(dim=1).values
            d2[s : s + chunk] = torch.minimum(d2[s : s + chunk], dn.clamp_min(0))
    return torch.cat(centroids)


def kmeans(
    x: torch.Tensor,
    k: int,
    iters: int,
    generator: torch.Generator,
    *,
    init: str = "plusplus",
    chunk: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's k-means; returns centroids (k, D) and the number of points nearest each (k,).

    init: "plusplus" (k-means++-lite, 32 batched rounds) or "random" (k distinct points).
    A cluster left empty is re-seeded with the points farthest from their centroid, so with
    N >= k distinct points no code is wasted. Deterministic for the generator's state.
    """
    x = torch.as_tensor(x, dtype=torch.float32)
    n = len(x)
    if x.dim() != 2 or n < k:
        raise ValueError(f"kmeans needs an (N, D) array with N >= k={k}; got shape {tuple(x.shape)}")
    if init == "plusplus":
        c = _init_plusplus(x, k, generator, rounds=32, chunk=chunk)
    elif init == "random":
        c = x[torch.randperm(n, generator=generator)[:k]].clone()
    else:
        raise ValueError(f"kmeans: unknown init '{init}' (plusplus | random)")
    prev = None
    for _ in range(iters):
        idx, d2 = _assign(x, c, chunk)
        if prev is not None and torch.equal(idx, prev):
            break  # converged: the update would reproduce c
        prev = idx
        counts = torch.bincount(idx, minlength=k)
        sums = torch.zeros_like(c).index_add_(0, idx, x)
        empty = counts == 0
        c = torch.where(empty[:, None], c, sums / counts.clamp_min(1)[:, None].to(x.dtype))
        if empty.any():  # re-seed from the worst-served points
            far = torch.topk(d2, int(empty.sum())).indices
            c[empty] = x[far]
    idx, _ = _assign(x, c, chunk)
    return c, torch.bincount(idx, minlength=k)


# ----------------------------------------------------------------------------- calibration


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
                wav = np.stack([_scaled(chunks[ci], gains.get(ci) if gains else None, st - ctx, st + keep)
                                for ci, st, ctx, keep in batch])
                emb = model.encoder(torch.from_numpy(wav.astype(np.float32, copy=False))[:, None])  # (B, D, T)
                for b, (_, _, ctx, keep) in enumerate(batch):
                    out.append(emb[b, :, ctx : ctx + keep].t())  # (keep, D)
                bar.update(sum(w[3] for w in batch))
    return torch.cat(out)


def _scaled(audio: np.ndarray, gains: np.ndarray | None, first: int, end: int) -> np.ndarray:
    """Frames [first, end) of `audio` as float32, each multiplied by its gain (None: as is)."""
    x = np.asarray(audio[first * encodec.HOP : end * encodec.HOP], dtype=np.float32)
    if gains is None:
        return x
    return x * np.repeat(gains[first:end], encodec.HOP)


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
    level: tuple[str, float] = ("none", 0.0),
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
    level: (method, target) of `frame_gains`: each picked chunk is normalised as encode will
    normalise it.
    Runs on CALIBRATION_THREADS torch threads whatever the caller's setting, so that the result
    depends only on the inputs and the seed.
    Returns statistics; the residual variance reported per level is that of the residual
    carried to the next level, relative to the embeddings' variance.
    """
    with _torch_threads(CALIBRATION_THREADS):
        return _calibrate(model, audio_chunks, frames, iters, seed, crop_frames, context_frames, batch_size, level)


def _calibrate(model, audio_chunks, frames, iters, seed, crop_frames, context_frames, batch_size, level) -> dict:
    t0 = time.perf_counter()
    bins = model.quantizer.bins
    if frames < bins:
        raise ValueError(f"calibrate: frames ({frames}) must be at least the codebook size ({bins})")
    g = torch.Generator().manual_seed(seed)
    windows = []  # (chunk index, start frame, context frames, frames kept)
    for ci, chunk in enumerate(audio_chunks):
        nf = len(chunk) // encodec.HOP
        for st in range(0, nf, crop_frames):
            windows.append((ci, st, min(st, context_frames), min(crop_frames, nf - st)))
    available = sum(w[3] for w in windows)
    if available < bins:
        raise TokenizerError(f"calibration needs at least {bins} train frames; the train split has {available}")
    if available < frames:
        log.warning("calibration: tokenizer.calibration_frames is %d (%.0f per code), the train split has %d "
                    "(%.1f per code, %.1f min); fitting on all of it", frames, frames / bins, available,
                    available / bins, available / FRAME_RATE / 60)
    picked, have = [], 0
    for i in torch.randperm(len(windows), generator=g).tolist():
        if have >= frames:
            break
        picked.append(windows[i])
        have += windows[i][3]
    t_enc = time.perf_counter()
    gains = None
    if level[0] != "none":  # measured on the whole chunk, as encode_shard measures the whole clip
        gains = {ci: frame_gains(np.asarray(audio_chunks[ci]), level[0], level[1]) for ci in sorted({w[0] for w in picked})}
    emb = _embed_crops(model, audio_chunks, picked, batch_size, gains)  # (N, D)
    t_enc = time.perf_counter() - t_enc
    if len(emb) > frames:
        emb = emb[torch.randperm(len(emb), generator=g)[:frames]]
    # Centre the encoder's output by folding its mean into the last conv's bias. The untrained
    # encoder emits a large constant offset (norm ~0.34) with tiny variation (~0.0045), so the
    # float32 distances of EnCodec's quantize (|x|^2 - 2 x.c + |c|^2) cancel catastrophically:
    # measured, 4% of codes changed with the thread count. Centred, under 0.05% do.
    offset = emb.mean(0)
    head = model.encoder.model[-1].conv.conv  # SConv1d -> NormConv1d -> Conv1d (128 out)
    head.bias.sub_(offset)
    emb = (emb - offset).contiguous()

    n_q = n_codebooks(model)
    residual = emb.clone()
    energy0 = float(emb.pow(2).sum())
    distinct, residual_energy = [], []
    t_km = time.perf_counter()
    for level, layer in enumerate(model.quantizer.vq.layers[:n_q]):
        centroids, counts = kmeans(residual, bins, iters, g)
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
            second = _sq_dists(r, centroids, centroids.pow(2).sum(1)[None]).topk(2, largest=False).indices[:, 1]
            quantized[single] = centroids[second]
        residual = residual - quantized
        distinct.append(int(codes.unique().numel()))
        residual_energy.append(float(residual.pow(2).sum()) / max(energy0, 1e-30))
        log.info(
            "calibrate: level %d: %d/%d codes used, residual variance %.3f",
            level, distinct[-1], bins, residual_energy[-1],
        )
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
        "calibration_residual_variance": [round(e, 5) for e in residual_energy],
    }


# ----------------------------------------------------------------------------- encoding


def padded_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Clip indices in batches of up to `batch_size`, longest first, so that padding stays small."""
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    return [order[b : b + batch_size] for b in range(0, len(order), batch_size)]


def pieces(offsets: Sequence[int], lengths: Sequence[int], segment_frames: int = 0,
           context_frames: int = 0) -> list[tuple[int, int, int, int]]:
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
    model, audio: np.ndarray, clips, *, out: np.ndarray | None = None, batch_size: int = 1,
    segment_frames: int = 0, context_frames: int = 0, device: torch.device | str = "cpu", label: str = "tokenize",
    frame_gain: np.ndarray | None = None,
) -> np.ndarray:
    """Codes of every clip through `model.encode`, aligned with `audio`: (K, len(audio) // 320) int16.

    clips: rows with offset and num_samples into `audio` (a shard's manifest rows). Clip i fills
    columns offset_i // 320 ... + num_samples_i // 320, exactly; columns of no clip hold -1.
    Clips are encoded in zero-padded batches of up to `batch_size` (longest first) and each
    clip's codes are trimmed to its own frames. The 24 kHz encoder is causal, so padding on the
    right leaves a clip's frames unchanged (measured: bit-identical embeddings); batch_size 1 is
    bit-identical to `model.encode` of each clip alone, larger batches may flip rare near-tie
    frames (float summation order differs). Clips longer than `segment_frames` (> 0) are encoded
    in segments with `context_frames` of left context (see `pieces`), so that memory is bounded
    by batch_size x segment, not by the longest file (measured on a 60 s clip, calibrated
    tokenizer: 1 s of context or more gives codes identical to the whole clip's; none, 98.5 %).
    `out`: an int16 array of that shape to fill (e.g. a memory-mapped .npy, so that codes never
    sit in memory). `frame_gain`: a gain per frame of `audio` (float32, len(audio) // 320), applied
    to what the encoder sees (level normalisation, `frame_gains`); None: the audio as is.
    """
    K = n_codebooks(model)
    shape = (K, len(audio) // encodec.HOP)
    if out is None:
        out = np.empty(shape, dtype=np.int16)
    if out.shape != shape or out.dtype != np.int16:
        raise ValueError(f"encode_clips: out must be int16 {shape}, got {out.dtype} {out.shape}")
    codes = out
    codes[:] = -1
    todo = pieces(clips["offset"].to_numpy(np.int64), clips["num_samples"].to_numpy(np.int64),
                  segment_frames, context_frames)
    frames = [p[1] for p in todo]
    total = sum(p[1] - p[2] for p in todo)
    t0, done = time.perf_counter(), 0
    with Progress(total, label, unit="frame") as bar:
        for batch in padded_batches(frames, batch_size):
            wav = np.zeros((len(batch), max(frames[i] for i in batch) * encodec.HOP), dtype=np.float32)
            for row, i in enumerate(batch):
                first, n = todo[i][0], todo[i][1]
                wav[row, : n * encodec.HOP] = _scaled(audio, frame_gain, first, first + n)
            encoded = model.encode(torch.from_numpy(wav)[:, None].to(device))  # [(codes (B, K, T), scale)]
            c = torch.cat([f[0] for f in encoded], dim=-1).cpu().numpy()
            kept = 0
            for row, i in enumerate(batch):
                _, n, drop, dest = todo[i]
                if c.shape[1] != K or c.shape[2] < n:
                    raise RuntimeError(f"EnCodec gave {c.shape[1:]} codes for {n} frames, want ({K}, {n})")
                codes[:, dest : dest + n - drop] = c[row, :, drop:n]
                kept += n - drop
            done += kept
            bar.update(kept, x_real_time=done / FRAME_RATE / max(time.perf_counter() - t0, 1e-9))
    return codes


def code_counts(codes: np.ndarray) -> np.ndarray:
    """How often each of the CODEBOOK_SIZE codes occurs in `codes` (-1, no clip, is not counted)."""
    codes = np.asarray(codes).astype(np.int64, copy=False)
    if codes.size and int(codes.max()) >= CODEBOOK_SIZE:
        raise TokenizerError(f"code {int(codes.max())} exceeds the codebook size {CODEBOOK_SIZE}")
    return np.bincount(codes[codes >= 0], minlength=CODEBOOK_SIZE)


def _entropy_bits(counts: np.ndarray) -> float:
    p = counts[counts > 0] / max(int(counts.sum()), 1)
    return float(-(p * np.log2(p)).sum())


# ----------------------------------------------------------------------------- inputs and stage

MODEL_DIR = "model"  # data/codes/model/: fit.json (+ tokenizer.pt in calibrated mode)


def read_prepared(prepared_dir: str | Path):
    """The prepared corpus through `corpus.load_prepared`, its errors as TokenizerError."""
    from acoustic_mlm.data.corpus import load_prepared

    try:
        return load_prepared(prepared_dir)
    except UserError as exc:
        raise TokenizerError(str(exc)) from None


def _check_config(cfg: dict) -> None:
    sr = cfg.get("data", {}).get("sample_rate", SAMPLE_RATE)
    if sr != SAMPLE_RATE:
        raise TokenizerError(f"config: 'data.sample_rate' is {sr}; EnCodec 24 kHz needs {SAMPLE_RATE}")
    if cfg["tokenizer"]["mode"] not in ("calibrated", "pretrained"):
        raise TokenizerError(f"config: 'tokenizer.mode' must be calibrated or pretrained, got {cfg['tokenizer']['mode']!r}")
    level_of(cfg)  # a known level method


def fit(cfg: dict, prepared_dir: Path, out_dir: Path, threads: int = 1) -> dict:
    """The tokenizer for the corpus, into out_dir/model/ (atomically): fit.json, and tokenizer.pt
    in calibrated mode (codebooks fitted on the train split of every shard).

    In pretrained mode it checks the checkpoint (downloading it if needed) and records its sha256.
    """
    set_threads(threads)
    keep_freed_memory()
    _check_config(cfg)
    tc = cfg["tokenizer"]
    mode, bandwidth, seed = tc["mode"], float(tc["bandwidth"]), int(tc["seed"])
    level = level_of(cfg)
    info: dict = {"mode": mode, "bandwidth": bandwidth, "seed": seed, "checkpoint": None, "level": level,
                  "calibration_frames_requested": None, "calibration_iters": None}
    with atomic_dir(Path(out_dir) / MODEL_DIR) as tmp:
        if mode == "calibrated":
            corpus = read_prepared(prepared_dir)
            train = np.flatnonzero((corpus.manifest["split"] == "train").to_numpy())
            if not len(train):
                raise TokenizerError(f"{Path(prepared_dir) / 'manifest.csv'}: no train clips to calibrate on")
            check_calibration_data(cfg, corpus.manifest, where=str(Path(prepared_dir) / "manifest.csv"))
            model = build_encodec(bandwidth, seed)
            chunks = [corpus.clip(int(i)) for i in train]
            info.update(calibrate(model, chunks, int(tc["calibration_frames"]), int(tc["calibration_iters"]), seed,
                                  level=(level["method"], level["target"] or 0.0)))
            info.update(calibration_frames_requested=int(tc["calibration_frames"]),
                        calibration_frames_per_code=round(info["calibration_frames"] / CODEBOOK_SIZE, 2),
                        calibration_iters=int(tc["calibration_iters"]))
            torch.save(model.state_dict(), tmp / "tokenizer.pt")
        else:
            load_pretrained(tc["checkpoint"], bandwidth)
            path = Path(tc["checkpoint"]).expanduser() if tc["checkpoint"] else hub_checkpoint_path()
            info["checkpoint"] = {"path": str(path), "sha256": sha256_file(path)}
        write_json(tmp / "fit.json", info)
    return info


def load_tokenizer(cfg: dict, out_dir: Path):
    """The model `fit` made for this corpus (calibrated: out_dir/model/tokenizer.pt; pretrained: the checkpoint)."""
    tc = cfg["tokenizer"]
    folder = Path(out_dir) / MODEL_DIR
    if not (folder / "fit.json").is_file():
        raise UserError(f"{folder / 'fit.json'}: not found (run `amlm tokenize --fit` first)")
    fitted = readers.read_json(folder / "fit.json", "the tokenizer's fit", "tokenize").get(
        "level", level_of({"tokenizer": {"mode": "pretrained"}}))
    wanted = level_of(cfg)
    if (fitted["method"], fitted["target"]) != (wanted["method"], wanted["target"]):
        raise TokenizerError(f"{folder / 'fit.json'}: fitted with level {fitted['method']} {fitted['target']}, the config "
                             f"asks for {wanted['method']} {wanted['target']} (tokenizer.level); rerun `amlm tokenize --fit`")
    if tc["mode"] == "calibrated":
        return load_calibrated(folder / "tokenizer.pt", float(tc["bandwidth"]))
    return load_pretrained(tc["checkpoint"], float(tc["bandwidth"]))


def encode_shard(cfg: dict, prepared_dir: Path, out_dir: Path, shard: int, threads: int = 1) -> dict:
    """One shard's codes into out_dir/shard-<k>/ (atomically): codes.npy aligned with the shard's
    audio.npy (int16 (K, frames), -1 where no clip is), encode.json (clips, seconds, speed).

    Memory: one padded batch and a memory map of the shard's codes.
    """
    from acoustic_mlm.data.corpus import shard_name

    set_threads(threads)
    keep_freed_memory()  # 1.6x faster encoding on CPU (BENCHMARKS.md)
    _check_config(cfg)
    tc = cfg["tokenizer"]
    corpus = read_prepared(prepared_dir)
    if int(shard) not in corpus.shards and int(shard) not in _planned_shards(prepared_dir):
        raise TokenizerError(f"{Path(prepared_dir) / 'manifest.csv'}: no clips in shard {shard}")
    # A planned shard whose files were all rejected gets its (empty) codes too: every shard of
    # the plan is encoded, so that Snakemake can ask for all of them before the manifest exists.
    clips = corpus.manifest[corpus.manifest["shard"] == int(shard)]
    audio = corpus.audio(int(shard))
    try:
        device = pick_device(tc["device"], "tokenizer.device")
    except ValueError as exc:
        raise TokenizerError(f"config: {exc}") from None
    model = load_tokenizer(cfg, out_dir).to(device)
    level = level_of(cfg)
    levels, frame_gain = clip_levels(audio, clips, level)
    with atomic_dir(Path(out_dir) / shard_name(shard)) as tmp:
        levels.to_csv(tmp / LEVELS, index=False)
        shape = (n_codebooks(model), len(audio) // encodec.HOP)  # (K, frames of the shard)
        codes = np.lib.format.open_memmap(tmp / "codes.npy", mode="w+", dtype=np.int16, shape=shape)
        t0 = time.perf_counter()
        encode_clips(model, audio, clips, out=codes, batch_size=int(tc["batch_size"]), device=device,
                     segment_frames=int(round(tc["segment_seconds"] * FRAME_RATE)),
                     context_frames=int(round(tc["context_seconds"] * FRAME_RATE)), label=f"tokenize {shard_name(shard)}",
                     frame_gain=frame_gain)
        seconds = time.perf_counter() - t0
        codes.flush()
        del codes  # close the memory map before the folder is renamed into place
        audio_s = float(clips["num_samples"].sum()) / SAMPLE_RATE
        info = {"shard": int(shard), "clips": len(clips), "audio_seconds": round(audio_s, 3),
                "encode_seconds": round(seconds, 3), "x_real_time": round(audio_s / max(seconds, 1e-9), 2),
                "batch_size": int(tc["batch_size"]), "segment_seconds": tc["segment_seconds"],
                "context_seconds": tc["context_seconds"], "device": str(device), "threads": int(threads)}
        write_json(tmp / "encode.json", info)
    log.info("tokenize %s: %d clips, %.0f s of audio in %.1f s (%.1fx real time)", shard_name(shard),
             info["clips"], audio_s, seconds, info["x_real_time"])
    return info


LEVELS = "levels.csv"  # shard-<k>/levels.csv: each clip's measured level and the gain the tokenizer applied
LEVEL_COLUMNS = ("clip_id", "rms_dbfs", "lufs", "gain_db")


def clip_levels(audio: np.ndarray, clips, level: dict) -> tuple:
    """Each clip's level (RMS dBFS and BS.1770 LUFS, whatever the method) and the gain applied to it
    (the mean over its frames, in dB), and the per-frame gains for `encode_clips` (None for level none)."""
    method, target = level["method"], level["target"]
    frame_gain = np.ones(len(audio) // encodec.HOP, dtype=np.float32) if method != "none" else None
    rows = []
    for o, n, cid in zip(clips["offset"].to_numpy(np.int64), clips["num_samples"].to_numpy(np.int64), clips["clip_id"]):
        clip = np.asarray(audio[o : o + n], dtype=np.float32)
        gains = frame_gains(clip, method, target or 0.0)
        if frame_gain is not None:
            frame_gain[o // encodec.HOP : o // encodec.HOP + len(gains)] = gains
        rows.append((cid, round(rms_dbfs(clip), 2), round(loudness_lufs(clip), 2),
                     round(float(np.mean(20 * np.log10(gains))) if len(gains) else 0.0, 2)))
    return pd.DataFrame(rows, columns=list(LEVEL_COLUMNS)), frame_gain


def _planned_shards(prepared_dir: Path) -> set[int]:
    """The shards prepare's plan (shards.csv) lists; empty when there is no plan."""
    from acoustic_mlm.data.corpus import PLAN, read_plan

    if not (Path(prepared_dir) / PLAN).is_file():
        return set()
    return {int(k) for k in read_plan(prepared_dir)["shard"]}


def shard_codes(codes_dir: Path, shard: int) -> np.ndarray:
    """A shard's codes.npy, memory-mapped read-only."""
    from acoustic_mlm.data.corpus import shard_name

    path = Path(codes_dir) / shard_name(shard) / "codes.npy"
    if not path.is_file():
        raise UserError(f"{path}: codes not found; run the tokenize stage first")
    try:
        return np.load(path, mmap_mode="r")
    except Exception as exc:  # noqa: BLE001
        raise UserError(f"{path}: not a readable .npy array ({exc})") from None


def merge(cfg: dict, prepared_dir: Path, out_dir: Path) -> dict:
    """tokenizer.json for the whole corpus: the fit, codes used and unigram entropy per level over
    every shard (counted shard by shard), total encode time. Written last: it marks the codes complete."""
    from acoustic_mlm.data.corpus import shard_name

    out_dir = Path(out_dir)
    corpus = read_prepared(prepared_dir)
    fit_path = out_dir / MODEL_DIR / "fit.json"
    if not fit_path.is_file():
        raise TokenizerError(f"{fit_path}: not found (run `amlm tokenize --fit` first)")
    info = readers.read_json(fit_path, "the tokenizer's fit", "tokenize")
    counts = None  # (K, CODEBOOK_SIZE) code counts over every shard
    shards, tables = [], []
    for k in corpus.shards:
        enc_path = out_dir / shard_name(k) / "encode.json"
        if not enc_path.is_file():
            raise TokenizerError(f"{enc_path}: not found (run `amlm tokenize --shard {k}` first)")
        shards.append(readers.read_json(enc_path, "a shard's encoding record", "tokenize",
                                        {"clips": int, "audio_seconds": (int, float), "encode_seconds": (int, float)}))
        codes = readers.read_codes(out_dir / shard_name(k) / "codes.npy", len(corpus.audio(k)) // encodec.HOP, None,
                                   CODEBOOK_SIZE)
        part = np.stack([code_counts(np.asarray(row)) for row in codes])
        counts = part if counts is None else counts + part
        tables.append(_file_table(corpus.manifest[corpus.manifest["shard"] == k], codes, out_dir / shard_name(k)))
    audio_s = sum(s["audio_seconds"] for s in shards)
    encode_s = sum(s["encode_seconds"] for s in shards)
    meta = {
        **info,
        "n_codebooks": int(counts.shape[0]),
        "codebook_size": CODEBOOK_SIZE,
        "frame_rate": FRAME_RATE,
        "hop_length": encodec.HOP,
        "sample_rate": SAMPLE_RATE,
        "shards": len(shards),
        "clips": int(sum(s["clips"] for s in shards)),
        "audio_seconds": round(audio_s, 3),
        "distinct_codes": [int((row > 0).sum()) for row in counts],
        "top_code": [int(row.argmax()) for row in counts],
        "top_code_share": [round(float(row.max()) / max(int(row.sum()), 1), 5) for row in counts],
        "max_code": [int(np.flatnonzero(row).max()) if row.any() else -1 for row in counts],
        "unigram_entropy_bits": [round(_entropy_bits(row), 4) for row in counts],
        "encode_seconds": round(encode_s, 3),
        "real_time_factor": round(encode_s / max(audio_s, 1e-9), 5),  # encode seconds per audio second
        "x_real_time": round(audio_s / max(encode_s, 1e-9), 2),  # audio seconds per encode second
        "batch_size": int(cfg["tokenizer"]["batch_size"]),
        "versions": {"torch": torch.__version__, "encodec": _encodec_version()},
    }
    files = pd.concat(tables, ignore_index=True).sort_values("path", kind="stable")
    with atomic_path(out_dir / FILES) as tmp:
        files.to_csv(tmp, index=False)
    meta["files_table"] = FILES
    crowded = [f"level {k} code {meta['top_code'][k]} ({100 * share:.1f}%)"
               for k, share in enumerate(meta["top_code_share"]) if share > TOP_CODE_WARNING]
    if crowded:
        log.warning("tokenize: one code holds more than %d%% of a level's frames: %s; see %s for each file's level "
                    "and codebook-0 entropy", round(100 * TOP_CODE_WARNING), ", ".join(crowded), out_dir / FILES)
    write_json(out_dir / "tokenizer.json", meta)
    log.info("tokenize: %d clips in %d shard(s), %.0f s of audio in %.1f s (%.1fx real time); codes used per level %s",
             meta["clips"], meta["shards"], audio_s, encode_s, meta["x_real_time"], meta["distinct_codes"])
    return meta


FILES = "files.csv"  # data/codes/files.csv: one row per clip, its level and its codebook-0 statistics
TOP_CODE_WARNING = 0.10  # tokenize warns when one code holds more than this share of a level's frames


def _file_table(clips, codes: np.ndarray, shard_dir: Path):
    """One row per clip of a shard: its level (levels.csv) and its codebook-0 codes used, unigram
    entropy and most frequent code's share."""
    path = shard_dir / LEVELS
    if not path.is_file():
        raise TokenizerError(f"{path}: not found (rerun `amlm tokenize --shard {int(clips['shard'].iloc[0])}`)")
    levels = readers.read_csv_table(path, "a shard's levels", "tokenize", ["clip_id", "gain_db"],
                                    numbers=["rms_dbfs", "lufs"],
                                    finite=["gain_db"])
    rows = []
    for cid, o, nf in zip(clips["clip_id"], clips["offset"].to_numpy(np.int64), clips["num_frames"].to_numpy(np.int64)):
        c = code_counts(np.asarray(codes[0, o // encodec.HOP : o // encodec.HOP + nf]))
        rows.append((cid, int((c > 0).sum()), round(_entropy_bits(c), 4), round(float(c.max()) / max(int(c.sum()), 1), 5)))
    stats = pd.DataFrame(rows, columns=["clip_id", "cb0_codes_used", "cb0_entropy_bits", "cb0_top_code_share"])
    table = pd.DataFrame({"clip_id": clips["clip_id"].to_numpy(),
                          "path": clips["path"].to_numpy() if "path" in clips else clips["clip_id"].to_numpy(),
                          "split": clips["split"].to_numpy(),
                          "seconds": (clips["num_samples"].to_numpy(np.int64) / SAMPLE_RATE).round(3)})
    table = table.merge(levels, on="clip_id", how="left").merge(stats, on="clip_id")
    if table["gain_db"].isna().any():
        raise TokenizerError(f"{path}: does not list every clip of its shard; rerun tokenize")
    return table


def run(cfg: dict, prepared_dir: Path, out_dir: Path, threads: int = 1) -> None:
    """The whole stage in one process: fit, every shard in turn, merge; out_dir appears complete or not at all.

    Snakemake runs the same three steps as separate jobs (one per shard), DVC runs this.
    """
    _check_config(cfg)
    corpus = read_prepared(prepared_dir)
    with atomic_dir(out_dir) as tmp:
        fit(cfg, prepared_dir, tmp, threads)
        for shard in corpus.shards:
            encode_shard(cfg, prepared_dir, tmp, shard, threads)
        merge(cfg, prepared_dir, tmp)


def _encodec_version() -> str | None:
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        return version("encodec")
    return None
