"""The tone corpus's oracle tokenizer (`tokenizer.mode: pitch`, with `data.source: tones`): the codes the
tone corpus was drawn from, read back from its prepared audio.

Each EnCodec frame of the tone corpus (acoustic_mlm.data.tones) is one pure tone at one of CODES
frequencies, its phase restarting at the frame. Codebook 0's code is the frequency whose sinusoid fits
the frame best: for each candidate f, the least-squares fit of a sin(2 pi f t) + b cos(2 pi f t) over the
frame's 320 samples (a matched filter on the sine and cosine pair, their overlap over a frame that holds
no whole number of periods accounted for), the code the one of largest fitted energy. The deeper
codebooks are the corpus's fixed functions of it (tones.codes_of). At the corpus's noise (0.01 against an
amplitude of 0.3) every frame is recovered exactly (tests/tokenizer/test_pitch.py). A frame the best
tone explains less than MIN_EXPLAINED of is no frame of the tone corpus: refused in one line, so that
the oracle never gives codes for other audio. Silent frames (the zero padding of a batch) give code 0.

It stands where EnCodec stands in the stage (`encode(wav)` -> [(codes, scale)], `n_codebooks`, `to`), so
that fit, encode_shard and merge run for it as for the other modes; fit records `record()` in fit.json.
"""

from __future__ import annotations

import numpy as np
import torch

from acoustic_mlm.data import tones
from acoustic_mlm.tokenizer.codec import TokenizerError

MIN_EXPLAINED = 0.9  # the least share of a frame's energy its best tone must explain (the corpus's: > 0.99)
SILENT = 1e-12  # a frame's mean square at or below this is silence (padding): code 0


def _fits() -> tuple[np.ndarray, np.ndarray]:
    """(basis (HOP, 2 CODES): sin and cos of each candidate frequency over one frame, float64;
    inverse Gram matrices (CODES, 2, 2)), so that a frame's fitted energy at f is p' G^-1 p, p its projections."""
    t = np.arange(tones.HOP) / tones.RATE
    phase = 2 * np.pi * tones.FREQUENCIES[None, :] * t[:, None]  # (HOP, CODES)
    basis = np.concatenate([np.sin(phase), np.cos(phase)], axis=1)
    s, c = basis[:, : tones.CODES], basis[:, tones.CODES :]
    gram = np.stack(
        [np.stack([(s * s).sum(0), (s * c).sum(0)], -1), np.stack([(s * c).sum(0), (c * c).sum(0)], -1)], -2
    )
    return basis, np.linalg.inv(gram)


def read_frames(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codebook 0's code (N,) int64, share of each frame's energy its best tone explains (N,)) for
    frames (N, HOP); silent frames: code 0, share 1."""
    x = np.asarray(frames, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != tones.HOP:
        raise ValueError(f"read_frames: frames must be (N, {tones.HOP}), got {x.shape}")
    basis, inv = _fits()
    p = x @ basis  # (N, 2 CODES)
    p = np.stack([p[:, : tones.CODES], p[:, tones.CODES :]], -1)  # (N, CODES, 2)
    fitted = np.einsum("nfi,fij,nfj->nf", p, inv, p)  # least-squares energy of each candidate tone
    code = fitted.argmax(axis=1)
    energy = (x * x).sum(axis=1)
    silent = energy <= SILENT * tones.HOP
    share = np.where(silent, 1.0, fitted[np.arange(len(x)), code] / np.where(silent, 1.0, energy))
    return np.where(silent, 0, code), share


class PitchTokenizer:
    """The oracle in EnCodec's place: `encode(wav (B, 1, T))` -> [(codes (B, K, T // HOP), None)]."""

    def __init__(self, codebooks: int):
        self.n_codebooks = int(codebooks)  # codec.n_codebooks reads it

    def to(self, device):  # the stage moves its model to tokenizer.device; the oracle computes on the CPU
        return self

    def encode(self, wav: torch.Tensor) -> list[tuple[torch.Tensor, None]]:
        x = wav.detach().to("cpu", torch.float64).numpy()
        if x.ndim != 3 or x.shape[1] != 1:
            raise ValueError(f"PitchTokenizer.encode: wav must be (B, 1, T), got {tuple(x.shape)}")
        b, n = x.shape[0], x.shape[2] // tones.HOP
        code, share = read_frames(x[:, 0, : n * tones.HOP].reshape(b * n, tones.HOP))
        worst = int(share.argmin()) if len(share) else 0
        if len(share) and share[worst] < MIN_EXPLAINED:
            raise TokenizerError(
                f"tokenizer.mode pitch: a frame is no tone of the tone corpus (its best tone, "
                f"{tones.FREQUENCIES[code[worst]]:g} Hz, explains {100 * share[worst]:.1f}% of its energy, under "
                f"{100 * MIN_EXPLAINED:.0f}%); the pitch tokenizer reads only the audio of data.source tones"
            )
        codes = np.stack([tones.codes_of(row, self.n_codebooks) for row in code.reshape(b, n)])  # (B, K, n)
        return [(torch.from_numpy(codes.astype(np.int64)).to(wav.device), None)]


def record() -> dict:
    """What fit.json records of the oracle: its candidate tones, its frame, its refusal threshold."""
    return {
        "codes": tones.CODES,
        "frequencies_hz": [float(f) for f in tones.FREQUENCIES],
        "frame_samples": tones.HOP,
        "fit": "least-squares sinusoid per candidate frequency, largest fitted energy",
        "deeper_codebooks": f"(c0 * (2k + 1) + k) mod {tones.CODES}",
        "min_explained_share": MIN_EXPLAINED,
    }
