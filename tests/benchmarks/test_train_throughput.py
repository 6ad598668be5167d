"""benchmarks/train_throughput.py: its nn.TransformerEncoder baseline is a fair one, and its CLI runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml
from helpers import RUN_NAMES, load_benchmark
from torch.utils.flop_counter import FlopCounterMode

from acoustic_mlm import config as C
from acoustic_mlm.preflight.flops import step_flops

ROOT = Path(__file__).resolve().parents[2]
RUNS = list(RUN_NAMES)


bench = load_benchmark("train_throughput")


@pytest.fixture()
def tiny_settings(smoke_cfg) -> dict:
    """The smoke preset's mapping shrunk to a few thousand parameters and 2 x 15 frames (validated)."""
    smoke_cfg["model"].update(
        conv_layers=[[8, 10, 5], [8, 8, 4], [8, 4, 4], [8, 2, 2], [8, 2, 2]],  # stride 320
        dim=32, layers=2, heads=2, ffn_dim=64, pos_conv_kernel=4, pos_conv_groups=1,
        final_dim=8, codebooks=2, codebook_size=1024,  # the config requires EnCodec's 1024 codes
    )  # fmt: skip
    smoke_cfg["train"].update(batch_size=2, crop_seconds=0.2, threads=1)  # 15 frames
    return C.validate(smoke_cfg, source="tiny")


@pytest.fixture()
def tiny_cfg(tiny_settings) -> C.Config:
    """tiny_settings, typed."""
    return C.from_mapping(tiny_settings, source="tiny")


def _outside_blocks(model: nn.Module) -> dict[str, tuple]:
    return {
        name: tuple(p.shape)
        for name, p in model.named_parameters()
        if not name.startswith("encoder.transformer.blocks.")
    }


def _numel(model: nn.Module, prefix: str = "") -> int:
    return sum(p.numel() for name, p in model.named_parameters() if name.startswith(prefix))


@pytest.mark.parametrize("run", RUNS)
def test_baseline_has_the_arms_front_end_heads_and_size(tiny_cfg, run):
    baseline, arm = bench.build_baseline(tiny_cfg), bench.build_arm(tiny_cfg, run)
    assert _outside_blocks(baseline) == _outside_blocks(arm)  # same names, same shapes
    blocks = "encoder.transformer.blocks."
    assert _numel(baseline) - _numel(baseline, blocks) == _numel(arm) - _numel(arm, blocks)
    assert _numel(baseline, blocks) == _numel(arm, blocks)  # same width, depth and FFN
    assert _numel(baseline) == _numel(arm)


def test_baseline_blocks_are_torch_prenorm_layers(tiny_cfg):
    baseline = bench.build_baseline(tiny_cfg)
    (stack,) = baseline.encoder.transformer.blocks
    assert isinstance(stack, nn.TransformerEncoder) and len(stack.layers) == tiny_cfg.model.layers
    layer = stack.layers[0]
    assert layer.norm_first and layer.self_attn.batch_first and layer.activation_relu_or_gelu == 2  # gelu
    assert baseline.encoder.transformer.norm == "pre"  # the package's final LayerNorm closes the stack
    # everything but the blocks starts from the Pre-Norm arm's very weights
    arm = dict(bench.build_arm(tiny_cfg, "prenorm_clip1").named_parameters())
    for name, p in baseline.named_parameters():
        if not name.startswith("encoder.transformer.blocks."):
            assert torch.equal(p, arm[name]), name


def test_baseline_trains_one_step(tiny_cfg):
    device = torch.device("cpu")
    (tr,) = [t for t in bench.trainees(tiny_cfg, device) if t.name == bench.BASELINE]
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    loss = tr.step(bench.fixed_batch(tiny_cfg, device))
    assert math.isfinite(float(loss))
    changed = {n for n, p in tr.model.named_parameters() if not torch.equal(p, before[n])}
    assert any(n.startswith("encoder.transformer.blocks.0.layers.") for n in changed)
    assert "encoder.feature_extractor.blocks.0.0.weight" in changed and "heads.codewords" in changed


def test_model_flops_match_torch_flop_counter(tiny_cfg):
    """The PB-Relax arm does attention with explicit matmuls, so FlopCounterMode sees every FLOP
    (ungrouped positional conv: the counter ignores groups in a conv backward)."""
    device = torch.device("cpu")
    wav, codes, mask = bench.fixed_batch(tiny_cfg, device)
    model = bench.build_arm(tiny_cfg, "prenorm_attnrelax_clip1")
    model.static_shapes = True  # the heads score every frame, as on a GPU (step_flops counts that)
    with FlopCounterMode(display=False) as counter:
        model(wav, codes, mask).loss.backward()
    m = tiny_cfg.model_for("prenorm_attnrelax_clip1")
    assert step_flops(m, wav.shape[0], codes.shape[-1]) == counter.get_total_flops()


def test_main_reports_one_row_per_arm_and_the_baseline(tiny_settings, tmp_path, capsys):
    tiny_settings["train"]["accum_steps"] = 2  # an update is two micro-batches, as in train.run
    cfg_path, out = tmp_path / "tiny.yaml", tmp_path / "bench.json"
    cfg_path.write_text(yaml.safe_dump(tiny_settings, sort_keys=False))
    result = bench.main(
        ["--config", str(cfg_path), "--device", "cpu", "--steps", "2", "--repeats", "1", "--warmup", "0",
         "--threads", "1", "--json", str(out)]
    )  # fmt: skip
    assert result["frames_per_step"] == 2 * 2 * 15
    names = [r["model"] for r in result["rows"]]
    assert names == [bench.BASELINE, *RUNS]
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    for row in result["rows"]:
        assert row["precision"] == "fp32" and row["ms_per_step"] > 0 and row["frames_per_s"] > 0
        assert row["ratio_to_baseline"] > 0 and math.isfinite(row["final_loss"])
        assert row["mfu"] is None  # no peak on CPU unless --peak-tflops
    assert result["rows"][0]["ratio_to_baseline"] == 1.0
    relax = result["rows"][-1]
    assert relax["twin"] == "prenorm_clip1" and relax["ratio_to_twin"] > 0
    table = capsys.readouterr().out
    assert table.count("| fp32 |") == 1 + len(RUNS)


@pytest.mark.parametrize("scope", ["step", "transformer"])
def test_fp16_fairseq_steps_half_models_with_master_weights(tiny_cfg, scope):
    """The benchmark steps what `amlm train` steps: train.build_trainer's half model and fp32 masters."""
    device = torch.device("cpu")
    baseline = [t for t in bench.trainees(tiny_cfg, device, "fp16_fairseq", scope) if t.name == bench.BASELINE][0]
    assert {p.dtype for p in baseline.model.parameters()} == {torch.float16}
    assert {m.dtype for m in baseline.tr.precision.master} == {torch.float32}
    before = [m.detach().clone() for m in baseline.tr.precision.master]
    loss = baseline.step(bench.fixed_batch(tiny_cfg, device, scope))
    assert math.isfinite(float(loss)) and baseline.tr.precision.scaler.iter == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, baseline.tr.precision.master))


@pytest.mark.slow
def test_sequential_timing_builds_one_model_at_a_time_and_a_process_share_of_the_batch(
    tiny_settings, tmp_path, monkeypatch
):
    """On CUDA the default: each model built, timed and freed before the next (issue 34: all five paper-size
    models at once ran out of 139 GiB); the micro-batch is one process's share of the preset's."""
    tiny_settings["train"].update(processes=2, batch_size=4)  # two processes: 2 crops each
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_settings, sort_keys=False))
    import gc
    import weakref

    built, alive_at_build = [], []
    real = bench.build_trainer

    def counting(*a, **k):
        gc.collect()
        alive_at_build.append(sum(ref() is not None for ref in built))  # earlier models still in memory
        tr = real(*a, **k)
        built.append(weakref.ref(tr.model))
        return tr

    monkeypatch.setattr(bench, "build_trainer", counting)
    result = bench.main(
        [
            "--config",
            str(cfg_path),
            "--device",
            "cpu",
            "--steps",
            "1",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--sequential",
        ]
    )
    assert result["sequential"] and result["batch_size"] == 2 and result["frames_per_step"] == 2 * 15
    assert [r["model"] for r in result["rows"]] == [bench.BASELINE, *RUNS]
    assert all(len(r["ms_per_step_all"]) == 2 and math.isfinite(r["final_loss"]) for r in result["rows"])
    assert alive_at_build == [0] * (1 + len(RUNS))  # each model freed before the next was built
