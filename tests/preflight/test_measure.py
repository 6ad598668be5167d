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
    cfg = C.validate(smoke_cfg)
    m, t = C.model_config(cfg, "prenorm_clip1"), C.train_config(cfg, "prenorm_clip1")
    plan = measure.Plan(micro_batch=32, micro_batches=2, optimizer_steps=1, warmup=0)
    res, mb, no_fit = measure.fit_cuda(m, t, torch.device("cpu"), "fp32", 37, plan, 32, None, None)
    assert tried == [32, 16, 8, 4] and mb == 4 and no_fit == [32, 16, 8]
    summary = measure.fit_summary({**res, "did_not_fit": no_fit}, torch.device("cuda"), 32, 32, 0)
    assert summary["fits"] is False and summary["max_micro_batch"] == 4
    assert (summary["suggested_micro_batch"], summary["suggested_accum_steps"]) == (4, 8)


def test_cpu_fit_is_linear_in_the_micro_batch():
    # 312.5 M parameters: 5 GB of weights, gradients and Adam state, then 1 GB per crop
    res = {"measured_micro_batch": 1, "activation_gb_per_micro_batch": 1.0, "peak_memory_gb": 5.5,
           "params": 312_500_000}
    s = measure.fit_summary(res, torch.device("cpu"), 32, 32, int(20e9))
    assert s["fits"] is False and s["max_micro_batch"] == 15
    assert (s["suggested_micro_batch"], s["suggested_accum_steps"]) == (8, 4)
    s = measure.fit_summary(res, torch.device("cpu"), 8, 32, int(20e9))
    assert s["fits"] is True and (s["suggested_micro_batch"], s["suggested_accum_steps"]) == (8, 4)
    s = measure.fit_summary({**res, "peak_memory_gb": 25.0}, torch.device("cpu"), 8, 32, int(20e9))
    assert s["fits"] is False and s["max_micro_batch"] == 0 and s["suggested_micro_batch"] == 0  # nothing fits

