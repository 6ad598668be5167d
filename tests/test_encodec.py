"""encodec.py: the codec's constants and the codebooks each bandwidth gives."""

import pytest

from acoustic_mlm import encodec


@pytest.mark.parametrize("bandwidth, n", [(1.5, 2), (3.0, 4), (6.0, 8), (12.0, 16), (24.0, 32)])
def test_each_bandwidth_gives_its_codebooks(bandwidth, n):
    assert encodec.codebooks(bandwidth) == n


def test_frames_are_75_per_second_and_a_hop_of_them_makes_the_sample_rate():
    assert encodec.FRAME_RATE == 75
    assert encodec.HOP * encodec.FRAME_RATE == encodec.SAMPLE_RATE
