"""MERT's in-batch noise mixing: crops of a micro-batch are mixed with segments of the others.

MERT (yizhilll/MERT, `mert_fairseq/models/mert/mert_model.py`, `MERTModel.inbatch_noise_augment`
and the start of `MERTModel.forward`) augments the input waveform of a training micro-batch:

- each crop is mixed with probability 1 - `mixture_prob` (the code mixes when U[0, 1) >
  mixture_prob; the 330M and 95M configs set 0.5, where both readings agree). Here
  `mixture_prob` is the probability that a crop is mixed;
- the noise pool is the other crops of the same micro-batch (one GPU's, 7 crops at 330M),
  clean, concatenated in batch order; the crop itself is left out;
- U{n_min..n_max} segments (inclusive; `inbatch_noise_augment_number_range` "[1, 3]"), each
  of U{len_min..len_max} samples (inclusive; "[12000, 36000]" at 330M, "[12000, 24000]" at 95M),
  read from the pool at a start U{0..pool - len_max} (the bound uses len_max, as MERT) and
  added, times `inbatch_noise_augment_volume` (1.0), at a position U{0..L - length} of the crop;
- only the model's input changes: the EnCodec targets are untouched and the CQT target is
  computed from the clean crop, before mixing (mert_model.py, `forward`).

Differences: MERT draws from torch's global generator inside the model; here the draws come
from the data path's generator, so a batch is a pure function of (seed, step) and a run
resumes exactly. MERT also mixes in validation (its check has no `self.training`); here the
fixed validation set stays clean. MERT silently skips a crop whose draw fails (a pool or crop
shorter than len_max); here the configuration check rejects such settings before training.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Segment(NamedTuple):
    row: int  # the mixed crop (index in the micro-batch)
    pool_start: int  # first pool sample of the noise
    length: int  # noise samples
    position: int  # where in the crop the noise is added


def draw_mixture(
    rng: np.random.Generator,
    groups: list[np.ndarray],
    crop_samples: int,
    prob: float,
    segments: tuple[int, int],
    samples: tuple[int, int],
) -> list[Segment]:
    """The noise segments of one micro-batch; `groups` lists the rows of each pool (MERT: one
    GPU's micro-batch). Rows are visited in order, so the plan does not depend on which process
    will apply it. Raises ValueError when a draw is impossible (pool or crop below len_max)."""
    n_min, n_max = segments
    len_min, len_max = samples
    if not (1 <= n_min <= n_max and 1 <= len_min <= len_max):
        raise ValueError(f"mixture ranges must be increasing and positive: segments {segments}, samples {samples}")
    if len_max > crop_samples:
        raise ValueError(f"noise segments of up to {len_max} samples do not fit crops of {crop_samples}")
    plan: list[Segment] = []
    for group in groups:
        pool = (len(group) - 1) * crop_samples  # the other crops of the group, concatenated
        if pool < len_max:
            raise ValueError(
                f"a group of {len(group)} crops of {crop_samples} samples cannot supply {len_max} noise samples"
            )
        for row in group:
            if rng.random() >= prob:
                continue
            n = int(rng.integers(n_min, n_max + 1))
            starts = rng.integers(0, pool - len_max + 1, size=n)
            lengths = rng.integers(len_min, len_max + 1, size=n)
            positions = [int(rng.integers(0, crop_samples - length + 1)) for length in lengths]
            plan += [Segment(int(row), int(s), int(length), p) for s, length, p in zip(starts, lengths, positions)]
    return plan


def apply_mixture(
    wav: np.ndarray, rows: np.ndarray, groups: list[np.ndarray], plan: list[Segment], volume: float
) -> np.ndarray:
    """Mixed copies of the crops `wav` (n, L), which hold the micro-batch rows `rows` (each group
    whose rows appear must appear whole); the noise is read from the clean crops."""
    local = {int(r): j for j, r in enumerate(rows)}
    group_of = {int(r): g for g in groups for r in g}
    out = wav.copy()
    for seg in plan:
        if seg.row not in local:
            continue  # another process's crop
        others = [local[int(r)] for r in group_of[seg.row] if r != seg.row]  # KeyError: a group split between processes
        pool = wav[others].reshape(-1)  # (pool,) clean, in batch order
        out[local[seg.row], seg.position : seg.position + seg.length] += (
            volume * pool[seg.pool_start : seg.pool_start + seg.length]
        )
    return out
