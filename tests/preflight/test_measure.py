"""preflight/measure.py: the micro-batch search on CUDA and the linear memory fit on CPU."""

import torch

from acoustic_mlm import config as C
from acoustic_mlm.preflight import measure


def test_cuda_search_finds_the_largest_divisor_that_fits(smoke_cfg, monkeypatch):
    """On CUDA, a micro-batch that runs out of memory is retried at smaller divisors of the batch."""
    tried = []

    def fake_measure(m, t, device, precision, frames, plan, n_micro, probe, bar):
        tried.append(plan.micro_batch)
        if plan.micro_batch > 6:
            raise torch.OutOfMemoryError("out of memory")
        return {"ms_per_update_measured": None, "measured_micro_batch": plan.micro_batch}

    monkeypatch.setattr(measure, "measure_arm", fake_measure)
    cfg = C.from_mapping(smoke_cfg)
    m, t = cfg.model_for("prenorm_clip1"), cfg.train_for("prenorm_clip1")
    plan = measure.Plan(micro_batch=32, micro_batches=2, optimizer_steps=1, warmup=0)
    res, mb, no_fit = measure.fit_cuda(m, t, torch.device("cpu"), "fp32", 37, plan, 32, None, None)
    assert tried == [32, 16, 8, 4] and mb == 4 and no_fit == [32, 16, 8]
    summary = measure.fit_summary({**res, "did_not_fit": no_fit}, torch.device("cuda"), 32, 32, 0)
    assert summary["fits"] is False and summary["max_micro_batch"] == 4
    assert (summary["suggested_micro_batch"], summary["suggested_accum_steps"]) == (4, 8)


def test_cpu_fit_is_linear_in_the_micro_batch():
    # 312.5 M parameters: 5 GB of weights, gradients and Adam state, then 1 GB per crop
    res = {
        "measured_micro_batch": 1,
        "activation_gb_per_micro_batch": 1.0,
        "peak_memory_gb": 5.5,
        "params": 312_500_000,
    }
    s = measure.fit_summary(res, torch.device("cpu"), 32, 32, int(20e9))
    assert s["fits"] is False and s["max_micro_batch"] == 15
    assert (s["suggested_micro_batch"], s["suggested_accum_steps"]) == (8, 4)
    s = measure.fit_summary(res, torch.device("cpu"), 8, 32, int(20e9))
    assert s["fits"] is True and (s["suggested_micro_batch"], s["suggested_accum_steps"]) == (8, 4)
    s = measure.fit_summary({**res, "peak_memory_gb": 25.0}, torch.device("cpu"), 8, 32, int(20e9))
    assert s["fits"] is False and s["max_micro_batch"] == 0 and s["suggested_micro_batch"] == 0  # nothing fits


# ----------------------------------------------------------------------------- a CUDA preset without its GPU


def test_bounded_frames_fit_the_budget_and_stay_within_the_preset():
    from helpers import tiny_config

    from acoustic_mlm.preflight.flops import step_flops

    m = tiny_config()
    assert measure.bounded_frames(m, 384, 1, gflops=1e6) == 384  # a fast CPU: the preset's whole crop
    assert measure.bounded_frames(m, 384, 1, gflops=1e-6) == measure.MIN_FRAMES  # a slow one: the least
    assert measure.bounded_frames(m, 20, 1, gflops=1e-6) == 20  # never more than the preset's crop
    gflops = step_flops(m, 2, 100) / 1e9 / (measure.CPU_BUDGET_S * measure.CPU_STEP_EFFICIENCY)  # 100 frames fit
    assert measure.bounded_frames(m, 384, 2, gflops) == 100
    nnaudio = tiny_config(cqt_loss_weight=1.0, cqt_impl="nnaudio")  # nnAudio's CQT counts on top
    assert (
        measure.bounded_frames(nnaudio, 384, 2, gflops)
        < 100
        <= measure.bounded_frames(tiny_config(cqt_loss_weight=1.0, cqt_impl="fft"), 384, 2, gflops)
    )
    assert measure.cpu_matmul_gflops(size=64, repeats=2) > 0


def _saved(layers: int, frames: int = 40) -> measure.SavedBytes:
    from helpers import tiny_config

    from acoustic_mlm.model.objective import AcousticMLM

    torch.manual_seed(0)
    m = tiny_config(layers=layers)
    model = AcousticMLM(m)
    model.static_shapes = True
    wav, codes, mask = measure.synthetic_batch(m, 2, frames, torch.device("cpu"))
    with measure.SavedBytes(model) as counter:
        model(wav, codes, mask).loss.backward()
    return counter


def test_saved_bytes_of_a_cut_model_extrapolate_to_the_whole_one():
    """The bytes autograd saves: counted per block and for the rest; a 2-block cut extrapolates to the
    6-block model's own count (identical blocks), and no parameter is counted."""
    cut, whole = _saved(2), _saved(6)
    assert cut.rest > 0 and all(b > 0 for b in cut.blocks.values()) and len(whole.blocks) == 6
    assert cut.extrapolate(6) == whole.extrapolate(6) == whole.rest + sum(whole.blocks.values())
    longer = _saved(2, frames=80)  # about linear in the frames
    assert 1.8 < longer.extrapolate(2) / cut.extrapolate(2) < 2.2


def test_gpu_memory_projection_counts_bytes_per_parameter_and_activations():
    from acoustic_mlm.preflight import project

    # 100 M parameters under fp16_fairseq: 20 bytes each (2 GB); 1 GB per crop counted at 100 of 400 frames
    p = project.gpu_memory_projection(
        100_000_000, "fp16_fairseq", 1e9, micro_batch=8, counted_frames=100, preset_frames=400
    )
    assert p["static_gb"] == 2.0 and p["activation_gb_per_crop"] == 2.0  # x 4 frames, halved for fp16
    assert p["total_gb"] == 18.0
    fits = {g["memory_gb"]: (g["fits"], g["max_micro_batch"]) for g in p["gpus"]}
    assert fits == {141.0: (True, 69), 80.0: (True, 39), 40.0: (True, 19)}
    p = project.gpu_memory_projection(100_000_000, "bf16", 1e9, 64, 100, 400)  # autocast: float32 size
    assert p["static_gb"] == 1.6 and p["activation_gb_per_crop"] == 4.0 and p["total_gb"] == 1.6 + 256
    assert {g["memory_gb"]: g["fits"] for g in p["gpus"]} == {141.0: False, 80.0: False, 40.0: False}
