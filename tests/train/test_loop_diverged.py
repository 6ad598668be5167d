"""A run that diverges before any finite loss (at its first update: fp16_fairseq reaching the minimum
loss scale; every loss NaN or infinite) is recorded as diverged with every row it has, in strict JSON,
and `amlm status`, the figure and `amlm decide` show it."""

import copy
import json
import math

import pandas as pd
import pytest
import yaml
from helpers import make_config

from acoustic_mlm import cli
from acoustic_mlm.artifacts.run_summary import read_arm_summary, read_seed_summary
from acoustic_mlm.model.objective import AcousticMLM
from acoustic_mlm.report import aggregate, decisive, figure, status
from acoustic_mlm.report.stability_map import NO_LOSS_BITS, capped_loss
from acoustic_mlm.train import loop as train


@pytest.fixture()
def tiny_cfg(smoke_cfg):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["train"].update(
        steps=8, warmup_steps=2, log_interval=4, batch_size=2, valid_crops=3, crop_seconds=0.4, checkpoint_interval=0
    )
    return cfg


def _broken(factor: float):
    """AcousticMLM.forward whose training loss is multiplied by `factor` (NaN or inf) on every call."""
    real = AcousticMLM.forward

    def forward(self, wav, codes, mask):
        out = real(self, wav, codes, mask)
        return out._replace(loss=out.loss * factor) if self.training else out

    return forward


def _strict_json(path):
    def refuse(token):
        raise AssertionError(f"{path} holds {token}, not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


WAYS = [  # (precision, what every training loss becomes, the stop reason, the step it stops at)
    ("fp16_fairseq", float("inf"), "min_loss_scale", 1),
    ("fp32", float("nan"), "nonfinite", 3),
    ("bf16", float("inf"), "nonfinite", 3),
]


@pytest.mark.parametrize("precision, factor, reason, stop", WAYS)
def test_a_run_with_no_finite_loss_is_recorded_as_diverged(
    data_dirs, tiny_cfg, tmp_path, monkeypatch, precision, factor, reason, stop
):
    tiny_cfg["train"].update(precision=precision, max_nonfinite=3)
    monkeypatch.setattr(AcousticMLM, "forward", _broken(factor))
    out = tmp_path / "r"
    summary = train.run(make_config(tiny_cfg), "prenorm_clip1", *data_dirs, out, threads=1)
    assert summary["status"] == "diverged" and summary["final_train_loss_cb0"] is None
    seed = _strict_json(out / "seeds" / "seed1" / "summary.json")
    assert seed["status"] == "diverged" and seed["stop_reason"] == reason and seed["diverged_at_step"] == stop
    assert seed["final_train_loss_cb0"] is None and seed["first_train_loss_cb0"] is None
    assert _strict_json(out / "summary.json")["per_seed"]["1"]["status"] == "diverged"
    m = pd.read_csv(out / "metrics.csv")
    assert len(m) >= 1 and m["train_loss_cb0"].isna().all() and m["diverged"].iloc[-1] == 1
    assert m["step"].iloc[-1] == stop
    assert read_seed_summary(out / "seeds" / "seed1" / "summary.json")["status"] == "diverged"
    # run again: the diverged seed is complete, not trained again (its summary reads back)
    assert train.run(make_config(tiny_cfg), "prenorm_clip1", *data_dirs, out, threads=1)["status"] == "diverged"
    line = status.seed_status(out, "prenorm_clip1", 1, 8)
    assert line.status == "diverged" and line.step == stop and math.isnan(line.cb0)


def test_status_figure_and_decide_show_a_seed_with_no_finite_loss(data_dirs, tiny_cfg, tmp_path, monkeypatch, capsys):
    cfg = copy.deepcopy(tiny_cfg)
    cfg["runs"] = {k: v for k, v in cfg["runs"].items() if k in ("prenorm_clip1", "prenorm_clip10")}
    for run in cfg["runs"].values():
        run["seeds"] = [1, 2]
    cfg["train"].update(max_nonfinite=2)
    runs = tmp_path / "runs"
    train.run(make_config(cfg), "prenorm_clip10", *data_dirs, runs / "prenorm_clip10", threads=1)
    monkeypatch.setattr(AcousticMLM, "forward", _broken(float("nan")))
    train.run(make_config(cfg), "prenorm_clip1", *data_dirs, runs / "prenorm_clip1", threads=1)
    monkeypatch.undo()
    assert read_arm_summary(runs / "prenorm_clip1" / "summary.json")["status"] == "diverged"

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["status", "--config", str(path), "--runs-dir", str(runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("prenorm_clip1 ") and line.endswith("diverged") for line in lines) == 2

    curves = aggregate.run(make_config(cfg), runs, tmp_path / "loss_curves.csv")
    fig, ax = figure.draw(curves, make_config(cfg).runs, make_config(cfg).figure)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    label = make_config(cfg).runs["prenorm_clip1"].label
    assert any(t.startswith(f"{label}: diverged at step 2, no finite loss (seed 1, 2)") for t in texts), texts

    table = decisive.run_table(runs, data_dirs[1])
    lost = table[table["run"] == "prenorm_clip1"]
    assert len(lost) == 2 and (lost["status"] == "diverged").all() and lost["failed"].all()
    assert not lost["trained"].any() and (lost["capped_loss"] == NO_LOSS_BITS).all()
    out = tmp_path / "decisive"
    code = cli.main(["decide", "--runs-dir", str(runs), "--codes", str(data_dirs[1]), "--out", str(out)])
    assert code == 0 and json.loads((out / "decisive.json").read_text())["promises"]


def test_the_capped_loss_of_a_run_without_any_finite_loss_is_an_untrained_models():
    assert NO_LOSS_BITS == 10.0
    assert capped_loss(math.nan, math.nan) == NO_LOSS_BITS
    assert capped_loss(math.nan, 9.5) == 9.5 and capped_loss(7.0, 9.5) == 7.0
