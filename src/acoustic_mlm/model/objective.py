"""The acoustic masked-language-model objective (MERT / HuBERT), apart from the backbone.

Span masks over frames, per-codebook cosine logits against learned codeword embeddings, and
cross-entropy on masked frames only, reported in bits as fairseq logs it.

Tensor axes, used throughout:
    B batch, L waveform samples (L = 320 T), T frames (75 Hz), K codebooks, V codebook size,
    D transformer width, F final (projection) width, N frames scored by the heads.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from acoustic_mlm.model.config import ModelConfig, mask_groups
from acoustic_mlm.model.cqt import CQTTarget
from acoustic_mlm.model.encoder import AcousticEncoder

LN2 = math.log(2)  # nats per bit


def nats_to_bits(x):
    """Cross-entropy in nats -> bits (fairseq logs loss_m_k / ln 2)."""
    return x / LN2


def compute_mask_indices(
    shape: tuple[int, int],
    mask_prob: float,
    mask_length: int,
    min_masks: int,
    rng: np.random.Generator,
    require_same_masks: bool = True,
) -> np.ndarray:
    """Random span masks, a (B, T) bool array; True = masked frame.

    A port of fairseq's `compute_mask_indices` (fairseq/data/data_utils.py, as HuBERT and
    MERT call it) restricted to mask_type "static", no_overlap=False, no padding mask,
    mask_dropout=0. Per row: num_mask = int(mask_prob * T / mask_length + U[0, 1)) span starts
    (at least min_masks), drawn without replacement from range(T - mask_length) (or
    range(num_mask + 1) when that is too short), each expanded to mask_length frames, clipped
    at T, overlaps merged. With require_same_masks every row is then subsampled to the
    smallest row's count, so each row masks the same number of frames.

    Changed from fairseq: randomness comes from the `rng` argument (fairseq uses the global
    np.random state or a per-row seeded generator), num_mask is drawn per row (fairseq's
    num_mask_ver=2 default); a row with zero spans yields no mask instead of an error.
    Because spans overlap, the masked fraction is below mask_prob: about
    1 - (1 - mask_prob / mask_length) ** mask_length (0.58 for 0.8 / 5).
    """
    bsz, T = shape
    rows = []
    for _ in range(bsz):
        num_mask = max(min_masks, int(mask_prob * T / float(mask_length) + rng.random()))
        min_len = mask_length
        if T - min_len <= num_mask:
            min_len = T - num_mask - 1  # too many spans for the length: allow starts up to num_mask
        starts = rng.choice(T - min_len, num_mask, replace=False)  # (num_mask,)
        idx = (starts[:, None] + np.arange(mask_length)[None, :]).reshape(-1)  # (num_mask * mask_length,)
        rows.append(np.unique(idx[idx < T]))
    mask = np.zeros((bsz, T), dtype=bool)
    target = min(len(r) for r in rows) if rows else 0
    for i, idx in enumerate(rows):
        if require_same_masks and len(idx) > target:
            idx = rng.choice(idx, target, replace=False)
        mask[i, idx] = True
    return mask


def compute_group_masks(
    batch: int, T: int, mask_prob: float, mask_length: int, min_masks: int, rng: np.random.Generator, group: int = 0
) -> np.ndarray:
    """(batch, T) span masks whose masked-frame count is equal within each group of `mask_groups`.

    fairseq's require_same_masks equalises the rows of one compute_mask_indices call, and
    HuBERT / MERT call it once per forward of one GPU's micro-batch (mert_model.py apply_mask;
    fairseq/data/data_utils.py): MERT-330M equalises 7 crops at a time, not the global batch.
    group 0 makes one call for the whole micro-batch, drawing exactly as before the switch.
    """
    groups = mask_groups(batch, group)
    if len(groups) == 1:
        return compute_mask_indices((batch, T), mask_prob, mask_length, min_masks, rng)
    mask = np.zeros((batch, T), dtype=bool)
    for rows in groups:
        mask[rows] = compute_mask_indices((len(rows), T), mask_prob, mask_length, min_masks, rng)
    return mask


def uniform_bits(codebook_size: int, special_symbols: int = 0) -> float:
    """Cross-entropy of a uniform guess over the softmax's classes, in bits: log2(V + S).

    fairseq's Dictionary adds bos, pad, eos and unk before the codes (fairseq/data/dictionary.py),
    and HuBERT / MERT score every dictionary entry: log2(1024 + 4) = 10.0056 bits.
    """
    return math.log2(codebook_size + special_symbols)


def cosine_logits(x: torch.Tensor, codewords: torch.Tensor, temp: float, round_to_input: bool = False) -> torch.Tensor:
    """cos(x_n, e_v) / temp, (N, F) x (V, F) -> (N, V), float32; the cosines are computed in float32.

    round_to_input (model.fp16_logits): as MERT's compute_nce (mert_model.py: the float cosine
    similarity `.type_as(x)`, then `/= self.logit_temp`; HuBERT's get_logits then casts to float), the
    cosines are rounded to x's dtype and divided by temp in it. In an fp16 model that rounds the
    logits to fp16, and their backward (loss scale x (p - y) / temp) overflows once the loss scale
    passes about 65504 x temp; in an fp32 model it changes nothing.
    A zero vector has cosine 0 with everything (its logits are all equal).
    """
    dtype = x.dtype
    x = F.normalize(x.float(), dim=-1)  # (N, F)
    e = F.normalize(codewords.float(), dim=-1)  # (V, F)
    if round_to_input and dtype != torch.float32:
        return ((x @ e.t()).to(dtype) / temp).float()  # (N, V)
    return x @ e.t() / temp  # (N, V)


class CodebookHeads(nn.Module):
    """One projection per codebook and its learned codeword embeddings (HuBERT's final_proj and
    label_embs_concat): (N, D) states -> (N, K, V + S) cosine logits.

    special_symbols S > 0 adds S embeddings that are never a target, first, as fairseq's
    Dictionary (bos, pad, eos, unk at ids 0-3): HuBERT's label encoder maps code c to id c + S
    (hubert_pretraining.py / mert_pretraining.py LabelEncoder, Dictionary.encode_line), and
    `compute_nce` scores the target against all V + S embeddings (mert_model.py), so the softmax
    has V + S classes; `target_ids` applies the offset.
    """

    def __init__(
        self,
        dim: int,
        final_dim: int,
        codebooks: int,
        codebook_size: int,
        special_symbols: int = 0,
        fp16_logits: bool = False,
    ):
        super().__init__()
        self.fp16_logits = fp16_logits  # model.fp16_logits: MERT's rounding of the logits (cosine_logits)
        self.codebooks = codebooks
        self.special_symbols = special_symbols
        self.proj = nn.Linear(dim, final_dim * codebooks)  # PyTorch default init, as fairseq
        classes = codebook_size + special_symbols
        self.codewords = nn.Parameter(torch.empty(codebooks, classes, final_dim).uniform_())  # (K, V + S, F)

    def target_ids(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes -> class ids: c + S (the dictionary's special symbols come first)."""
        return codes + self.special_symbols if self.special_symbols else codes

    def forward(self, h: torch.Tensor, temp: float) -> torch.Tensor:
        z = self.proj(h).chunk(self.codebooks, dim=-1)  # K x (N, F)
        logits = [
            cosine_logits(z[k], self.codewords[k], temp, self.fp16_logits) for k in range(self.codebooks)
        ]  # K x (N, V)
        return torch.stack(logits, dim=1)  # (N, K, V)


class MLMOutput(NamedTuple):
    loss: torch.Tensor  # scalar to backprop: sum_k CE_k (nats) + feature_penalty_weight * penalty [+ cqt weight * cqt]
    bits: torch.Tensor  # (K,) detached: per-codebook mean masked cross-entropy in bits
    feature_penalty: torch.Tensor  # detached scalar, unweighted
    n_masked: torch.Tensor  # detached scalar: masked frames in the batch (a tensor: reading it syncs a GPU)
    cqt_loss: torch.Tensor | None = None  # detached scalar, unweighted CQT reconstruction MSE (None: off)


class CQTHead(nn.Module):
    """MERT's CQT reconstruction (mert_model.py `model_cqt_pred`, `audio_cqt_loss_m`): one Linear
    from the encoder output to the CQT bins, trained with the mean squared error (nn.MSELoss)
    against the clean crop's CQT magnitudes (cqt.py) on masked frames only, averaged over
    frames and bins. hubert_criterion.py weighs it with loss_weights[1] (1 in both MERT configs)."""

    def __init__(self, dim: int, bins: int, bins_per_octave: int, fmin: float, impl: str = "nnaudio"):
        super().__init__()
        self.proj = nn.Linear(dim, bins)  # PyTorch default init, as MERT's fc
        self.target = CQTTarget(bins, bins_per_octave, fmin, impl=impl)  # constant, outside the module tree

    def forward(self, h: torch.Tensor, clean: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """h (B, T, D) states, clean (B, L) waveform, weight (B, T) 0/1 masked frames -> scalar MSE."""
        target = self.target(clean)  # (B, T, bins), no gradient
        err = (self.proj(h).float() - target).pow(2).mean(-1)  # (B, T)
        w = weight.to(err.dtype)
        return (err * w).sum() / w.sum()


def masked_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-codebook mean cross-entropy in nats over the frames with weight 1 (None: every frame).

    logits (N, K, V), targets (N, K), weights (N,) of 0 / 1 -> (K,): sum_n w_n CE_nk / sum_n w_n.
    No frame at all (N = 0, or every weight 0) gives 0 / 0 = NaN, which the training loop's
    finite-loss check skips.
    """
    ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (N, K)
    if weights is None:
        return ce.mean(dim=0)  # (K,)
    return (ce * weights.unsqueeze(1)).sum(dim=0) / weights.sum()  # (K,)


class AcousticMLM(nn.Module):
    """MERT's acoustic MLM: backbone + per-codebook heads; forward returns the loss as MLMOutput.

    forward(wav (B, L), codes (B, K, T) long, mask (B, T) bool). Only masked frames enter the
    loss, computed one of two ways that agree to float rounding (tests/train/test_gpu_paths.py):

    - static shapes (on a GPU, and whenever torch.compile traces the model): the heads score
      every frame and the unmasked ones are weighted 0. No shape depends on the mask and nothing
      is read back to the host: no GPU sync, one compiled graph for every batch. It scores
      1 / (masked share) times the frames (BENCHMARKS.md, the masked loss).
    - selection (eager on CPU, where a host read costs nothing): the heads score the masked
      frames only, `h[mask]`; at the CPU default's size the heads are a large part of the step
      (BENCHMARKS.md, benchmarks/masked_loss.py).

    `static_shapes` forces one or the other (None: as above).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = AcousticEncoder(cfg)
        self.heads = CodebookHeads(
            cfg.dim, cfg.final_dim, cfg.codebooks, cfg.codebook_size, cfg.special_symbols, cfg.fp16_logits
        )
        self.cqt = (
            CQTHead(cfg.dim, cfg.cqt_bins, cfg.cqt_bins_per_octave, cfg.cqt_fmin, cfg.cqt_impl)
            if cfg.cqt_loss_weight > 0
            else None
        )
        self.static_shapes: bool | None = None

    def forward(
        self, wav: torch.Tensor, codes: torch.Tensor, mask: torch.Tensor, clean: torch.Tensor | None = None
    ) -> MLMOutput:
        """`clean`: the crops before noise mixing (augment.py), for the CQT target; None: `wav`."""
        B, K, T = codes.shape
        if K != self.cfg.codebooks:
            raise ValueError(f"codes have {K} codebooks, the model predicts {self.cfg.codebooks}")
        stride = self.encoder.feature_extractor.stride
        if wav.shape[-1] != stride * T:
            raise ValueError(f"codes have T={T} frames but the waveform has {wav.shape[-1]} samples, not {stride} T")
        h, penalty = self.encoder(wav, mask)  # (B, T, D), scalar
        static = self.static_shapes
        if static is None:
            static = mask.device.type != "cpu" or torch.compiler.is_compiling()
        ids = self.heads.target_ids(codes).transpose(1, 2)  # (B, T, K) class ids (codes + special symbols)
        if static:
            weights = mask.reshape(B * T).float()  # (B T,) 1 = masked frame
            logits = self.heads(h.reshape(B * T, -1), self.cfg.logit_temp)  # (B T, K, V + S)
            ce = masked_cross_entropy(logits, ids.reshape(B * T, K), weights)  # (K,) nats
            n_masked = weights.sum()
        else:
            logits = self.heads(h[mask], self.cfg.logit_temp)  # (N, K, V + S), N masked frames
            ce = masked_cross_entropy(logits, ids[mask])  # (K,) nats
            n_masked = mask.sum()
        loss = ce.sum() + self.cfg.feature_penalty * penalty
        cqt = None
        if self.cqt is not None:
            cqt = self.cqt(h, wav if clean is None else clean, mask)
            loss = loss + self.cfg.cqt_loss_weight * cqt
            cqt = cqt.detach()
        return MLMOutput(loss, nats_to_bits(ce.detach()), penalty.detach(), n_masked.detach().float(), cqt)
