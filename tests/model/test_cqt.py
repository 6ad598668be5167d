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
