"""The stability map's figure is drawn from the map's table alone: one panel per depth, every arm's line,
a diverged point at its first loss, the three formats written."""

from __future__ import annotations

import math

import pandas as pd
from helpers import make_config

from acoustic_mlm.report import stability_map as S
from acoustic_mlm.report.stability_map_figure import draw, run_figure


def _map(cfg) -> pd.DataFrame:
    rows = []
    for arm, run in cfg.runs.items():
        for layers in (2, 16):
            for lr, loss in ((1e-3, 6.0), (1e-2, 5.0), (1e-1, math.nan)):
                rows.append(
                    {
                        "run": f"{arm}__lr-{lr:g}__layers-{layers}",
                        "arm": arm,
                        "role": run.role,
                        "lr": lr,
                        "layers": layers,
                        "precision": "fp32",
                        "seed": 1,
                        "status": "diverged" if math.isnan(loss) else "completed",
                        "diverged_at_step": 10 if math.isnan(loss) else None,
                        "steps": 100,
                        "first_train_loss_cb0": 10.0,
                        "final_train_loss_cb0": loss,
                        "final_valid_loss_cb0": loss,
                        "capped_loss": S.capped_loss(loss, 10.0),
                        "flattened": True,
                        "late_change_share": 0.01,
                        "max_grad_norm": 3.0,
                        "attn_logit_max": 100.0 * layers,
                        "attn_logit_fp16_frac": 100.0 * layers / S.FP16_MAX,
                        "clipped_frac": 0.5,
                        "overflow_skips": 0,
                        "nonfinite_steps": 0,
                        "wall_time_s": 1.0,
                    }
                )
    return pd.DataFrame(rows, columns=S.COLUMNS)


def test_one_panel_per_depth_every_arm_and_three_formats(tmp_path):
    cfg = make_config()
    table = _map(cfg)
    fig = draw(cfg, table)
    top = [ax for ax in fig.axes if ax.get_yscale() == "linear"]
    assert len(top) == 2  # depths 2 and 16: a loss panel each
    assert all(len(ax.get_lines()) >= len(cfg.runs) for ax in top)
    path = tmp_path / "map.csv"
    table.to_csv(path, index=False)
    written = run_figure(cfg, path, tmp_path / "figures")
    assert sorted(p.suffix for p in written) == [".pdf", ".png", ".svg"] and all(p.stat().st_size for p in written)
