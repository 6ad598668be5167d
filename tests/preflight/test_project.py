"""preflight/project.py: the figure's wall time, the suggested micro-batch, peak TFLOP/s by GPU name."""

import pytest

from acoustic_mlm.preflight import project


def test_figure_wall_hours_longest_first():
    assert project.figure_wall_hours([3, 2, 2, 1], 1) == 8
    assert project.figure_wall_hours([3, 2, 2, 1], 2) == 4
    assert project.figure_wall_hours([3, 2, 2, 1], 8) == 3


def test_suggested_micro_batch_keeps_the_global_batch():
    assert project.suggest_micro_batch(32, 10) == 8
    assert project.suggest_micro_batch(24, 5) == 4
    assert project.suggest_micro_batch(32, 0) == 0


def test_peak_tflops_by_gpu_name_and_precision_and_none_for_unknown_gpus():
    assert project.peak_tflops("NVIDIA H200", "bf16") == 989.0
    assert project.peak_tflops("NVIDIA H100 PCIe", "fp16") == 756.0
    assert project.peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == 19.5
    assert project.peak_tflops("NVIDIA A10", "bf16") == 125.0
    assert project.peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None
    assert project.peak_tflops("Some New GPU", "bf16") is None


@pytest.mark.parametrize(
    "precision, h100, v100, bytes_per_param",
    [
        ("fp32", 67.0, 15.7, 4 + 4 + 8),  # weights, gradients, Adam state
        ("bf16", 989.0, None, 4 + 4 + 8),  # no bf16 on a V100
        ("fp16", 989.0, 125.0, 4 + 4 + 8),
        ("fp16_fairseq", 989.0, 125.0, 2 + 2 + 4 + 4 + 8),  # fp16 model beside fp32 masters
    ],
)
def test_each_precision_s_peak_and_bytes_come_from_its_traits(precision, h100, v100, bytes_per_param):
    assert project.peak_tflops("NVIDIA H100 80GB HBM3", precision) == h100
    assert project.peak_tflops("Tesla V100-SXM2-32GB", precision) == v100
    assert project.steady_bytes_per_param(precision) == bytes_per_param
