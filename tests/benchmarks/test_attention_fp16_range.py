"""benchmarks/attention_fp16_range.py: the float16-mantissa baseline and its measurement summary, and the
range rule (experiments.rules.judge_range) on hand-made tables (the full measurement is a benchmark, its
tables in data/reference/pb_relax_range/)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from helpers import load_benchmark

from acoustic_mlm.experiments import declaration as D
from acoustic_mlm.experiments import rules

ROOT = Path(__file__).resolve().parents[2]


def test_mantissa_rounding_is_float16s_where_float16_has_the_range():
    r = load_benchmark("attention_fp16_range")
    # float32 values (float64 -> float16 in torch may round twice, through float32), none subnormal
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 1000
    x = x[x.abs() > 1e-3]
    assert torch.equal(r.round_mantissa(x.double()), x.half().double())
    # beyond 65504 float16 overflows; the baseline keeps 11 bits and any exponent
    big = torch.tensor([1e5, 2e6, -3.3e7], dtype=torch.float64)
    assert torch.isinf(big.half()).all()
    rounded = r.round_mantissa(big)
    assert torch.isfinite(rounded).all()
    assert ((rounded - big).abs() / big.abs() <= 2.0**-11).all()
    assert r.round_mantissa(torch.tensor([1 + 2.0**-12], dtype=torch.float64)).item() == 1.0


def test_the_baseline_matches_float64_attention_up_to_the_rounding():
    r = load_benchmark("attention_fp16_range")
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(1, 2, 16, 8, generator=gen, dtype=torch.float64) for _ in range(4))
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    ref = ((qr @ kr.transpose(-2, -1)) / 8**0.5).softmax(-1) @ vr
    (ref * g).sum().backward()
    out, grads = r.baseline(q, k, v, g)
    assert (out - ref.detach()).norm() / ref.norm() < 1e-3  # logits of order 1: 11 bits, errors about 1e-4
    for got, want in zip(grads, (qr.grad, kr.grad, vr.grad)):
        assert (got - want).norm() / want.norm() < 1e-2
    # with logits already 11-bit numbers (multiples of 1/8 of small size) the baseline is exact
    q8, k8 = torch.round(q * 4) / 4, torch.round(k * 4) / 4
    qr, kr = q8.clone().requires_grad_(True), k8.clone().requires_grad_(True)
    ref = ((qr @ kr.transpose(-2, -1)) / 8**0.5).softmax(-1) @ v  # /sqrt(8) is not exact: compare loosely
    assert (r.baseline(q8, k8, v, g)[0] - ref.detach()).norm() / ref.norm() < 1e-3


def _instances(holds_by_path: dict) -> pd.DataFrame:
    rows = []
    for path, holds in holds_by_path.items():
        for logit, h in zip([1e2, 1e4, 1e5, 2e6], holds):
            for instance in range(2):
                ok = bool(h) or instance == 0  # one instance failing is enough to break the range
                rows.append(
                    {
                        "path": path,
                        "logit_max": logit,
                        "instance": instance,
                        "finite_output": ok,
                        "finite_grads": ok,
                        "rel_error": 0.01,
                        "grad_rel_error": 0.02,
                        "baseline_rel_error": 0.01,
                        "baseline_grad_rel_error": 0.02,
                        "holds": ok,
                    }
                )
    return pd.DataFrame(rows)


def _judge(tmp_path: Path, table: pd.DataFrame) -> dict:
    """The range round judged (amlm experiment judge's rule) from this instances.csv."""
    doc = yaml.safe_load((ROOT / "config" / "experiments" / "pb_relax_range.yaml").read_text())
    doc["tables"] = str(tmp_path)
    decl = tmp_path / "pb_relax_range.yaml"
    decl.write_text(yaml.safe_dump(doc, sort_keys=False))
    table.to_csv(tmp_path / "instances.csv", index=False)
    return rules.judge_range(D.load(decl))


def test_the_range_is_the_last_logit_held_at_every_instance_up_to_it(tmp_path):
    """The benchmark measures (range.csv's counts); the verdict is the experiments stage's, from the
    instances alone."""
    r = load_benchmark("attention_fp16_range")
    table = _instances({"unfused": [1, 1, 0, 0], "pb_relax": [1, 1, 1, 0], "fused": [1, 0, 1, 1]})
    per = r.per_logit(table)
    assert per.loc[(per["path"] == "unfused") & (per["logit_max"] == 1e5), "holds"].item() == 1
    verdict = _judge(tmp_path, table)
    assert verdict["range"] == {"fused": 1e2, "pb_relax": 1e5, "unfused": 1e4}  # fused: not past its first failure
    assert verdict["verdict"] == "supported"
    for column in ("finite_output", "finite_grads", "holds"):  # PB-Relax measured as the unfused order was
        table.loc[table["path"] == "pb_relax", column] = table.loc[table["path"] == "unfused", column].to_numpy()
    assert _judge(tmp_path, table)["verdict"] == "not supported"
    # the forward-only range ignores the gradients
    table = _instances({"unfused": [1, 1, 0, 0], "pb_relax": [1, 1, 1, 0]}).assign(finite_grads=False, holds=False)
    assert _judge(tmp_path, table)["range_forward_only"]["pb_relax"] == pytest.approx(1e5)


def test_the_published_range_table_is_the_measurements_summary_and_holds_uses_the_rounds_rule():
    """range.csv recomputes from the published instances.csv, and the benchmark's tolerance is the
    round's declared one (one place for the rule)."""
    r = load_benchmark("attention_fp16_range")
    published = ROOT / "data" / "reference" / "pb_relax_range"
    instances = pd.read_csv(published / "instances.csv")
    assert rules.range_holds(instances, *r.rule()).equals(instances["holds"])  # the measured column is the rule's
    per = r.per_logit(instances)
    pd.testing.assert_frame_equal(per, pd.read_csv(published / "range.csv"), check_dtype=False)
    assert r.rule() == (2.0, 1e-6)
