"""The CQT reconstruction target of MERT: a constant-Q magnitude spectrogram per code frame.

MERT (yizhilll/MERT, `mert_fairseq/models/mert/mert_model.py`, class `model_cqt_pred`) builds
nnAudio's `features.cqt.CQT` with sr = 24000, hop_length = sr // label_rate = 320, fmin = 32.7 Hz,
fmax None, n_bins = `audio_cqt_bins` = 336, bins_per_octave = n_bins // 7 = 48 (seven octaves,
32.7 Hz to 4.1 kHz), filter_scale 1, norm 1, Hann window, center True, pad_mode "constant",
not trainable, output "Magnitude"; the target is that magnitude, transposed to (B, T, bins),
without a log or any normalisation, and its first T frames are kept.

Frame alignment. With center=True, nnAudio's frame t is centred on sample 320 t, so MERT's
targets sit half a hop (160 samples, 6.7 ms) before the frames of the conv front end and of
EnCodec, which span samples [320 t, 320 t + 320). Here the waveform's first 160 samples are
dropped before the transform, so frame t is centred on sample 320 t + 160, the centre of code
frame t, and exactly T frames come out of a crop of 320 T samples.

The transform runs in float32 outside autocast: its kernels are up to 65,536 taps long (the
32.7 Hz bin), too long a sum for float16. Its constant kernels (176 MB at MERT's settings) are
kept out of the model's module tree, so they are neither saved in checkpoints nor broadcast
by DDP; each device gets one copy, made on first use.
"""

from __future__ import annotations

import copy

import torch

from acoustic_mlm import encodec
# Formulas kept with their config check; cqt_bin_frequency is re-exported beside the CQT (tests import it here).
from acoustic_mlm.config import cqt_bin_frequency, cqt_top_frequency  # noqa: F401  (cqt_bin_frequency)


class CQTTarget:
    """(B, L) waveform at 24 kHz, L = 320 T -> (B, T, bins) CQT magnitudes, one row per code frame."""

    def __init__(self, bins: int = 336, bins_per_octave: int = 48, fmin: float = 32.7,
                 sample_rate: int = encodec.SAMPLE_RATE, hop: int = encodec.HOP):
        from nnAudio.features.cqt import CQT  # the maintained CQT that MERT uses (PyPI: nnAudio)

        if cqt_top_frequency(fmin, bins, bins_per_octave) >= sample_rate / 2:
            raise ValueError(f"CQT bins up to {cqt_top_frequency(fmin, bins, bins_per_octave):.0f} Hz exceed "
                             f"Nyquist ({sample_rate / 2:.0f} Hz)")
        self.hop = hop
        self.spec = CQT(sr=sample_rate, hop_length=hop, fmin=fmin, fmax=None, n_bins=bins,
                        bins_per_octave=bins_per_octave, filter_scale=1, norm=1, window="hann", center=True,
                        pad_mode="constant", trainable=False, output_format="Magnitude", verbose=False)
        self.bins = bins
        self._on: dict[torch.device, torch.nn.Module] = {}  # one copy of the kernels per device

    @torch.no_grad()
    def __call__(self, wav: torch.Tensor) -> torch.Tensor:
        B, L = wav.shape
        T = L // self.hop
        if wav.device not in self._on:
            self._on[wav.device] = self.spec if not self._on else copy.deepcopy(self.spec)
            self._on[wav.device].to(wav.device)
        with torch.autocast(device_type=wav.device.type, enabled=False):
            x = wav.float()[:, self.hop // 2 :]  # frame t centred on sample hop * t + hop / 2
            spec = self._on[wav.device](x)  # (B, bins, T)
        if spec.shape[-1] != T:
            raise RuntimeError(f"CQT gave {spec.shape[-1]} frames for {T} code frames")
        return spec.transpose(1, 2).contiguous()  # (B, T, bins)

