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

Two ways to compute the same transform (`model.cqt_impl`):

- `nnaudio`: nnAudio's own module, as MERT runs it: two strided convolutions of the padded crop
  with the 336 complex kernels, each padded to the longest (65,536 taps): 34 GFLOP per 5.12 s crop,
  in float32 (half the GPU step at MERT's sizes, issue 34). The CPU presets keep it.
- `fft`: the same kernels (taken from nnAudio's module), applied in the frequency domain. Frame t
  of bin k is the correlation c_k(s) = sum_m x[m] h_k[m - s] of the crop x with the kernel h_k
  centred on sample s = 320 t. With N = 320 M samples of zero padding enough that no wrap-around
  reaches the kernel's support (N > crop + half the longest kernel), the correlation is
  ifft_N(X . V_k), V_k = N ifft_N(h_k centred at 0); sampling every 320th value of an N-point
  inverse DFT is, by the DFT's decimation identity, the M-point inverse DFT of the spectrum folded
  into 320 blocks of M bins: c_k(320 t) = ifft_M(sum_a X[a M + j] V_k[a M + j] / 320)[t]. So per
  crop: one FFT of N samples, one batched complex matmul over the blocks (for each of the M bins j,
  (crops x blocks) @ (blocks x 336)), one M-point inverse FFT per bin. The kernels' spectra are
  band-limited (Hann windows); blocks in which no bin's spectrum reaches `FFT_BLOCK_TOL` of its
  peak are left out (81 of 320 at MERT's settings), every bin's values in the kept ones are kept.
  Cost: about 0.1 GFLOP per 5.12 s crop.
  It equals `nnaudio` to float32 rounding, not bit for bit (BENCHMARKS.md, tests/model/test_cqt.py:
  closer to a float64 evaluation than nnAudio's own float32 convolution is).

The transform runs in float32 outside autocast: its kernels are up to 65,536 taps long (the
32.7 Hz bin), too long a sum for float16. Its constant kernels (176 MB at MERT's settings;
the `fft` path's spectra a little less on the device) are kept out of the model's module tree,
so they are neither saved in checkpoints nor broadcast by DDP; each device gets one copy, made on
first use.
"""

from __future__ import annotations

import copy
import functools
import math

import torch

from acoustic_mlm import encodec
from acoustic_mlm.model.config import CQT_IMPLS, cqt_top_frequency

# A block of the folded spectrum is kept when some bin's kernel spectrum reaches this share of that
# bin's peak in it. Measured (benchmarks/cqt_cost.py, librosa's recordings): at 1e-5 the fft path is
# within 7e-6 of a float64 evaluation, five times closer than nnAudio's float32 convolution is.
FFT_BLOCK_TOL = 1e-5
_PLAN_CHUNK = 16  # bins per chunk when the kernels' spectra are computed (float64, on CPU)


def _smooth(n: int) -> int:
    """The smallest 2^a 3^b 5^c >= n: an FFT length without large prime factors (pocketfft, cuFFT)."""
    best = None
    p5 = 1
    while p5 < 2 * n:
        p3 = p5
        while p3 < 2 * n:
            p2 = p3
            while p2 < n:
                p2 *= 2
            best = p2 if best is None else min(best, p2)
            p3 *= 3
        p5 *= 5
    return best


class _FFTPlan:
    """The fft path's constants for one crop length on one device: the kernels' spectra on the kept
    blocks, W (M, blocks, bins) complex64, with the blocks' indices and the FFT length N = hop M."""

    def __init__(
        self,
        kernels: torch.Tensor,
        lengths: torch.Tensor,
        samples: int,
        hop: int,
        tol: float,
        device: torch.device,
        dtype: torch.dtype = torch.complex64,
    ):
        # kernels: (bins, K) complex128, nnAudio's h_k (K taps, centred on tap K // 2), conjugated as
        # nnAudio applies them (real part minus i imaginary part)
        bins, K = kernels.shape
        centre = K // 2
        support = (kernels != 0).any(0).nonzero()[:, 0]
        half = max(centre - int(support.min()), int(support.max()) - centre + 1)  # taps either side of the centre
        # no wrap-around reaches the kernel's support; M without large prime factors keeps both FFTs fast
        self.M = _smooth(math.ceil((samples + half + 1) / hop))
        self.N = hop * self.M
        self.hop = hop
        scale = lengths.double().sqrt() / hop  # nnAudio's "librosa" normalisation, and the 1/hop of the folding

        def spectra(lo: int, hi: int) -> torch.Tensor:  # (hi - lo, hop, M) complex128: V_k / hop x sqrt(l_k)
            h = torch.zeros(hi - lo, self.N, dtype=torch.complex128)
            h[:, :half] = kernels[lo:hi, centre : centre + half]  # the kernel centred on sample 0 (circularly)
            h[:, self.N - half :] = kernels[lo:hi, centre - half : centre]
            v = self.N * torch.fft.ifft(h, dim=1) * scale[lo:hi, None]
            return v.reshape(hi - lo, hop, self.M)

        chunks = [(lo, min(lo + _PLAN_CHUNK, bins)) for lo in range(0, bins, _PLAN_CHUNK)]
        # two passes, so that only the kept blocks are ever held: each bin's peak per block first
        peak = torch.cat([spectra(lo, hi).abs().amax(dim=2) for lo, hi in chunks])  # (bins, hop)
        keep = (peak > tol * peak.amax(dim=1, keepdim=True)).any(dim=0)
        self.blocks = keep.nonzero()[:, 0]
        W = torch.cat([spectra(lo, hi)[:, self.blocks].to(dtype) for lo, hi in chunks])  # (bins, blocks, M)
        self.W = W.permute(2, 1, 0).contiguous().to(device)  # (M, blocks, bins)
        self.blocks = self.blocks.to(device)

    def __call__(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        """x (B, samples) float32 -> (B, frames, bins) magnitudes (float64 for a complex128 plan)."""
        B = x.shape[0]
        # (B, blocks, M)
        X = torch.fft.fft(x.to(self.W.real.dtype), n=self.N).reshape(B, self.hop, self.M)[:, self.blocks]
        F = torch.bmm(X.permute(2, 0, 1).contiguous(), self.W)  # (M, B, bins): each bin's folded spectrum
        c = torch.fft.ifft(F, dim=0)[:frames]  # (frames, B, bins), times M / M: ifft's 1/M is the DFT's
        return c.abs().transpose(0, 1).contiguous()  # (B, frames, bins)


# nnAudio's other CQT settings, every one stated: nnAudio is not pinned, and a new default would
# change the target silently. pad_mode and verbose differ from nnAudio 0.3.4's defaults.
_NNAUDIO_CQT = {
    "fmax": None,
    "filter_scale": 1,
    "norm": 1,
    "window": "hann",
    "center": True,
    "pad_mode": "constant",
    "trainable": False,
    "output_format": "Magnitude",
    "verbose": False,
}


@functools.lru_cache(maxsize=4)
def _nnaudio_cqt(sample_rate: int, hop: int, fmin: float, bins: int, bins_per_octave: int) -> torch.nn.Module:
    """nnAudio's CQT module (its kernels built once per process and setting; each device gets a copy)."""
    from nnAudio.features.cqt import CQT  # the maintained CQT that MERT uses (PyPI: nnAudio)

    return CQT(sr=sample_rate, hop_length=hop, fmin=fmin, n_bins=bins, bins_per_octave=bins_per_octave, **_NNAUDIO_CQT)


_PLANS: dict[tuple, _FFTPlan] = {}  # the fft path's constants, per setting, crop length and device


class CQTTarget:
    """(B, L) waveform at 24 kHz, L = 320 T -> (B, T, bins) CQT magnitudes, one row per code frame.

    `impl`: "nnaudio" (nnAudio's convolutions, as MERT) or "fft" (the same kernels in the frequency
    domain; equal to float32 rounding, a small fraction of the cost). See the module's docstring.
    """

    def __init__(
        self,
        bins: int = 336,
        bins_per_octave: int = 48,
        fmin: float = 32.7,
        sample_rate: int = encodec.SAMPLE_RATE,
        hop: int = encodec.HOP,
        impl: str = "nnaudio",
        fft_tol: float = FFT_BLOCK_TOL,
    ):
        if impl not in CQT_IMPLS:
            raise ValueError(f"CQT impl must be one of {', '.join(CQT_IMPLS)}, got {impl!r}")
        if cqt_top_frequency(fmin, bins, bins_per_octave) >= sample_rate / 2:
            raise ValueError(
                f"CQT bins up to {cqt_top_frequency(fmin, bins, bins_per_octave):.0f} Hz exceed "
                f"Nyquist ({sample_rate / 2:.0f} Hz)"
            )
        self.hop = hop
        self.impl = impl
        self.fft_tol = fft_tol
        self.spec = _nnaudio_cqt(sample_rate, hop, float(fmin), bins, bins_per_octave)  # shared, stays on the CPU
        self._setting = (sample_rate, hop, float(fmin), bins, bins_per_octave, fft_tol)
        self.bins = bins
        self._on: dict[torch.device, torch.nn.Module] = {}  # nnaudio: one copy of the kernels per device
        self._plans: dict[tuple[torch.device, int], _FFTPlan] = {}  # fft: the plans this target used

    def _plan(self, device: torch.device, samples: int) -> _FFTPlan:
        key = (device, samples)
        if key not in self._plans and (*self._setting, *key) in _PLANS:  # another target's, same constants
            self._plans[key] = _PLANS[(*self._setting, *key)]
        if key not in self._plans:
            s = self.spec  # nnAudio applies conv(x, real) and -conv(x, imag): h = real - i imag
            re, im = s.cqt_kernels_real[:, 0].cpu(), s.cqt_kernels_imag[:, 0].cpu()
            support = ((re != 0) | (im != 0)).any(0).nonzero()[:, 0]  # the taps any kernel uses, about the centre
            K, centre = re.shape[1], re.shape[1] // 2
            half = max(centre - int(support.min()), int(support.max()) - centre + 1)
            lo, hi = centre - half, min(centre + half, K)  # the centre stays at index half: (half taps) + (the rest)
            kernels = torch.complex(re[:, lo:hi].double(), -im[:, lo:hi].double())
            self._plans[key] = _PLANS[(*self._setting, *key)] = _FFTPlan(
                kernels, s.lenghts.cpu(), samples, self.hop, self.fft_tol, device
            )
        return self._plans[key]

    @torch.no_grad()
    def __call__(self, wav: torch.Tensor) -> torch.Tensor:
        B, L = wav.shape
        T = L // self.hop
        with torch.autocast(device_type=wav.device.type, enabled=False):
            x = wav.float()[:, self.hop // 2 :]  # frame t centred on sample hop * t + hop / 2
            if self.impl == "fft":
                return self._plan(wav.device, x.shape[-1])(x, T)  # (B, T, bins)
            if wav.device not in self._on:  # a copy: the shared module keeps its kernels on the CPU
                self._on[wav.device] = copy.deepcopy(self.spec).to(wav.device)
            spec = self._on[wav.device](x)  # (B, bins, T)
        if spec.shape[-1] != T:
            raise RuntimeError(f"CQT gave {spec.shape[-1]} frames for {T} code frames")
        return spec.transpose(1, 2).contiguous()  # (B, T, bins)
