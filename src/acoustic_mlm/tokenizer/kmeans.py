"""Lloyd's k-means for the calibrated tokenizer's codebooks: k-means++-lite seeding, chunked
distances computed exactly as EnCodec's quantizer computes them, empty clusters re-seeded.

Tensor axes: N points, D channels, k centroids.
"""

from __future__ import annotations

import math

import torch


def sq_dists(x: torch.Tensor, c: torch.Tensor, c_sq: torch.Tensor) -> torch.Tensor:
    """(n, k) squared distances of points `x` to centroids `c` (c_sq: their squared norms, (1, k))."""
    # expanded as in EnCodec's EuclideanCodebook.quantize, so that k-means assigns points exactly
    # as model.encode will
    return x.pow(2).sum(1, keepdim=True) - 2 * x @ c.t() + c_sq


def _assign(x: torch.Tensor, c: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid of every point and its squared distance, in chunks of `chunk` points."""
    c_sq = c.pow(2).sum(1)[None]  # (1, k)
    idx = torch.empty(len(x), dtype=torch.long)
    d2 = torch.empty(len(x), dtype=x.dtype)
    for s in range(0, len(x), chunk):
        d = sq_dists(x[s : s + chunk], c, c_sq)  # (chunk, k)
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
            dn = sq_dists(x[s : s + chunk], new, new.pow(2).sum(1)[None]).min(dim=1).values
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
