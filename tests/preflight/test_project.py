"""preflight/project.py: the figure's wall time, the suggested micro-batch, peak TFLOP/s by GPU name."""

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
