"""cqt.py: the CQT target is a plain magnitude (no log, no normalisation), computed crop by crop in
float32, and refuses bins above Nyquist. MERT's own settings (336 bins: a tone's peak bin, the frame
centring, autocast) are in test_recipe_model.py; here one octave of 12 bins above middle C keeps
the kernels small."""

import math

import pytest
import torch

from acoustic_mlm.model.cqt import CQTTarget, cqt_top_frequency

HOP = 320  # samples per code frame at 24 kHz


@pytest.fixture(scope="module")
def octave():
    return CQTTarget(bins=12, bins_per_octave=12, fmin=261.6)


def _tone(freq: float, frames: int) -> torch.Tensor:
    t = torch.arange(frames * HOP, dtype=torch.float64) / 24000
    return torch.sin(2 * math.pi * freq * t).float()


def test_one_row_per_code_frame_and_one_column_per_bin(octave):
    wav = torch.randn(3, 40 * HOP)
    spec = octave(wav)
    assert spec.shape == (3, 40, 12) and spec.dtype == torch.float32 and spec.is_contiguous()
    assert (spec >= 0).all()  # magnitudes


def test_silence_gives_zeros_and_the_magnitude_scales_with_the_amplitude(octave):
    assert torch.equal(octave(torch.zeros(1, 30 * HOP)), torch.zeros(1, 30, 12))
    wav = _tone(261.6 * 2 ** (5 / 12), 30)[None]
    torch.testing.assert_close(octave(0.5 * wav), 0.5 * octave(wav), rtol=1e-5, atol=1e-6)  # no log, no norm


def test_each_crop_is_transformed_alone(octave):
    a, b = _tone(300.0, 30), torch.randn(30 * HOP)
    both = octave(torch.stack([a, b]))
    torch.testing.assert_close(both[0], octave(a[None])[0])
    torch.testing.assert_close(both[1], octave(b[None])[0])


def test_a_float64_waveform_gives_the_float32_target(octave):
    wav = torch.randn(2, 30 * HOP, dtype=torch.float64)
    spec = octave(wav)
    assert spec.dtype == torch.float32
    torch.testing.assert_close(spec, octave(wav.float()))


def test_bins_reaching_nyquist_are_refused():
    # 12 kHz is Nyquist at 24 kHz: from 3 kHz, 25 bins per octave 12 reach 3 x 2^2 = 12 kHz
    assert cqt_top_frequency(3000.0, 25, 12) == pytest.approx(12000.0)
    with pytest.raises(ValueError, match=r"CQT bins up to 12000 Hz exceed Nyquist \(12000 Hz\)"):
        CQTTarget(bins=25, bins_per_octave=12, fmin=3000.0)


# ----------------------------------------------------------------------------- the fft path (model.cqt_impl: fft)

# Agreement with nnAudio's convolutions, measured on the 14 librosa recordings (benchmarks/cqt_cost.py,
# BENCHMARKS.md): max abs error 3.0e-5 at a largest magnitude of 6.1, i.e. 4.9e-6 of it. Held here
# on synthetic signals with margin: errors are float32 rounding, relative to the largest magnitude.
REL_TO_MAX = 2e-5  # max |fft - nnaudio| / max |nnaudio|
REL_LARGE = 5e-3  # |fft - nnaudio| / |nnaudio| where |nnaudio| is above 1e-3 of its maximum


def _signals(frames: int, seed: int = 0) -> torch.Tensor:
    """Tones at random pitches and levels over noise, a click train, and silence with one click."""
    g = torch.Generator().manual_seed(seed)
    n = frames * HOP
    t = torch.arange(n, dtype=torch.float64) / 24000
    tones = sum(
        float(torch.rand(1, generator=g))
        * torch.sin(2 * math.pi * (40 + 4000 * float(torch.rand(1, generator=g)) ** 2) * t)
        for _ in range(6)
    )
    noisy = tones + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)
    clicks = torch.zeros(n, dtype=torch.float64)
    clicks[:: 2 * HOP + 37] = 1.0
    one = torch.zeros(n, dtype=torch.float64)
    one[n // 3] = 0.5
    return torch.stack([noisy, clicks, one]).float()


def _agree(fft: torch.Tensor, ref: torch.Tensor) -> None:
    assert fft.shape == ref.shape and fft.dtype == torch.float32 and fft.is_contiguous()
    err = (fft - ref).abs()
    assert err.max() <= REL_TO_MAX * ref.max(), f"max abs error {err.max():.3g} of a largest magnitude {ref.max():.3g}"
    large = ref > 1e-3 * ref.max()
    assert (err[large] / ref[large]).max() <= REL_LARGE


@pytest.fixture(scope="module")
def merts():
    """MERT's settings (336 bins from 32.7 Hz, 48 per octave: kernels up to 65,536 taps) both ways."""
    return CQTTarget(impl="nnaudio"), CQTTarget(impl="fft")


@pytest.mark.slow
@pytest.mark.parametrize("frames", [1, 7, 64])
def test_fft_equals_nnaudio_at_merts_settings(merts, frames):
    nnaudio, fft = merts
    wav = _signals(frames)
    _agree(fft(wav), nnaudio(wav))


def test_fft_equals_nnaudio_on_one_octave_and_keeps_the_contract():
    nnaudio = CQTTarget(bins=12, bins_per_octave=12, fmin=261.6)
    fft = CQTTarget(bins=12, bins_per_octave=12, fmin=261.6, impl="fft")
    wav = _signals(40, seed=1)
    _agree(fft(wav), nnaudio(wav))
    assert torch.equal(fft(torch.zeros(2, 30 * HOP)), torch.zeros(2, 30, 12))  # silence: zeros
    torch.testing.assert_close(fft(0.5 * wav), 0.5 * fft(wav), rtol=1e-5, atol=1e-6)  # linear magnitude
    torch.testing.assert_close(fft(wav.double()), fft(wav))  # float64 in: the float32 target
    torch.testing.assert_close(fft(wav[1:2])[0], fft(wav)[1], rtol=1e-5, atol=1e-6)  # each crop alone


def test_fft_path_under_autocast_is_float32(merts):
    _, fft = merts
    wav = _signals(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fft(wav)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, fft(wav))


def test_an_unknown_impl_is_refused_by_the_class_and_by_the_schema():
    with pytest.raises(ValueError, match="CQT impl must be one of nnaudio, fft"):
        CQTTarget(bins=12, bins_per_octave=12, fmin=261.6, impl="librosa")
    from pathlib import Path

    from acoustic_mlm import config as C

    path = Path(__file__).resolve().parents[2] / "config" / "smoke.yaml"
    assert C.load(path).model.cqt_impl == "nnaudio"  # a preset without the key: today's path
    cfg = C.read_yaml(path)
    cfg["model"]["cqt_impl"] = "fft"
    assert C.from_mapping(cfg, source="smoke.yaml").model_for("prenorm_clip1").cqt_impl == "fft"
    cfg["model"]["cqt_impl"] = "FFT"
    with pytest.raises(C.ConfigError, match="cqt_impl"):
        C.validate(cfg, source="smoke.yaml")
