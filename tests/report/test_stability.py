"""The stability figure (stability.py): panels, axes, thresholds and marked spikes, on hand-made
tables and on a run where a spike is forced (benchmarks/forced_spike.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import load_benchmark, make_config

from acoustic_mlm import config as C
from acoustic_mlm.cli import main
from acoustic_mlm.report import aggregate, claims, figure, stability
from acoustic_mlm.utils import FP16_MAX

ROOT = Path(__file__).resolve().parents[2]


def _tables(runs: dict[str, C.RunConfig], spike_run: str, spike_step: int, fp16: bool):
    """Tidy loss curves and diagnostics: every arm falls from 10 bits; one arm spikes at spike_step."""
    steps = [1, 2, 4, 8, 16, 32, 50, 64, 100, 128, 150, 200]
    loss, diag = [], []
    for name, r in runs.items():
        for s in steps:
            bits = 10.0 - 3.0 * np.log10(s) / np.log10(200)
            if name == spike_run and s == spike_step:
                bits += 2.0
            loss.append(
                {
                    "run": name,
                    "label": r.label,
                    "seed": 1,
                    "step": s,
                    "split": "train",
                    "codebook": 0,
                    "loss_bits": bits,
                }
            )
            values = {
                "grad_norm_max": 5.0 * (50.0 if name == spike_run and s == spike_step else 1.0),
                "attn_logit_max": 2.0 + s / 10,
            }
            if fp16:
                values["loss_scale"] = 65536.0 / (2 if s > 64 else 1)
            diag += [
                {"run": name, "label": r.label, "seed": 1, "step": s, "diagnostic": k, "value": v}
                for k, v in values.items()
            ]
    return pd.DataFrame(loss), pd.DataFrame(diag)


def _gids(ax, prefix: str) -> dict[str, list]:
    return {
        line.get_gid(): list(line.get_xdata()) + list(line.get_ydata())
        for line in ax.get_lines()
        if str(line.get_gid()).startswith(prefix)
    }


@pytest.mark.parametrize("fp16", [False, True])
def test_panels_axes_thresholds_and_the_spike_on_every_panel(smoke_cfg, fp16):
    cfg = C.from_mapping(smoke_cfg)
    runs = cfg.runs
    loss, diag = _tables(runs, "postnorm_deepnorm_clip1", 100, fp16)
    fig, axes, found = stability.draw(loss, diag, runs, cfg.figure, 0.5, 0.2)
    expect = ["loss", "grad_norm", "attn_logit"] + (["loss_scale"] if fp16 else [])
    assert list(axes) == expect and len(fig.axes) == len(expect)
    assert [ax.get_ylabel() for ax in axes.values()] == [p[2] for p in stability.PANELS][: len(expect)]
    for key, ax in axes.items():
        assert ax.get_xscale() == "log"
        assert ax.xaxis.get_major_formatter().func is figure.step_label  # the main figure's tick labels
        assert ax.get_yscale() == ("linear" if key == "loss" else "log")
    assert list(axes.values())[-1].get_xlabel() == figure.XLABEL
    # the arms' clip thresholds (1 and 10) and float16's limit
    clips = _gids(axes["grad_norm"], "threshold:clip")
    assert set(clips) == {"threshold:clip=1", "threshold:clip=10"}
    assert clips["threshold:clip=10"][2:] == [10.0, 10.0]
    assert _gids(axes["attn_logit"], stability.FP16_GID)[stability.FP16_GID][2:] == [FP16_MAX, FP16_MAX]
    assert axes["attn_logit"].get_ylim()[1] > FP16_MAX  # the limit is inside the panel
    # one spike (curves.detect_spikes), marked at its peak step on every panel in the arm's colour
    assert [(k["run"], k["peak_step"]) for k in found] == [("postnorm_deepnorm_clip1", 100)]
    styles = figure.arm_styles(runs)
    for ax in axes.values():
        marks = [line for line in ax.get_lines() if line.get_gid() == "spike:postnorm_deepnorm_clip1:seed1"]
        assert len(marks) == 1 and list(marks[0].get_xdata()) == [100, 100]
        assert marks[0].get_color() == styles[runs["postnorm_deepnorm_clip1"].label].color
    # the legend names every arm, in the config's order
    assert [t.get_text() for t in axes["loss"].get_legend().get_texts()] == [r.label for r in runs.values()]


def test_no_spike_no_marks_and_missing_diagnostics_said(smoke_cfg):
    cfg = C.from_mapping(smoke_cfg)
    loss, diag = _tables(cfg.runs, "none", 0, False)
    diag = diag[diag["diagnostic"] != "attn_logit_max"]  # as with train.diagnostics: false
    _, axes, found = stability.draw(loss, diag, cfg.runs, cfg.figure, 0.5, 0.2)
    assert found == [] and not any(_gids(ax, "spike:") for ax in axes.values())
    assert any("not measured" in t.get_text() for t in axes["attn_logit"].texts)


@pytest.mark.slow
def test_cli_writes_three_formats_and_names_a_missing_file(smoke_cfg, tmp_path, capsys):
    loss, diag = _tables(C.from_mapping(smoke_cfg).runs, "prenorm_clip1", 64, False)
    loss.to_csv(tmp_path / "loss_curves.csv", index=False)
    diag.to_csv(tmp_path / "diagnostics.csv", index=False)
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(smoke_cfg))
    args = [
        "stability",
        "--config",
        str(cfg_path),
        "--curves",
        str(tmp_path / "loss_curves.csv"),
        "--out",
        str(tmp_path / "fig"),
    ]
    assert main(args + ["--diagnostics", str(tmp_path / "diagnostics.csv")]) == 0
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == ["stability.pdf", "stability.png", "stability.svg"]
    assert main(args + ["--diagnostics", str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.csv" in err[0] and "aggregate" in err[0]


def test_claims_say_what_the_diagnostics_show_at_each_spike(smoke_cfg, tmp_path):
    loss, diag = _tables(C.from_mapping(smoke_cfg).runs, "postnorm_deepnorm_clip1", 100, False)
    quiet = diag["diagnostic"].eq("grad_norm_max") & diag["step"].eq(100)
    loss.to_csv(tmp_path / "loss_curves.csv", index=False)
    diag.to_csv(tmp_path / "diagnostics.csv", index=False)
    claims.run(
        make_config(smoke_cfg),
        tmp_path / "loss_curves.csv",
        tmp_path / "c.json",
        tmp_path / "c.md",
        check_reference=False,
        diagnostics_path=tmp_path / "diagnostics.csv",
    )
    md = (tmp_path / "c.md").read_text()
    assert "## What the diagnostics show at each spike" in md
    line = next(x for x in md.splitlines() if x.startswith("- `postnorm_deepnorm_clip1`"))
    assert "peak step 100" in line and "gradient norm up to 250 (50.00x" in line and "**unusual**" in line
    # the same spike with a quiet gradient norm: nothing unusual, said plainly
    diag.loc[quiet, "value"] = 5.0
    diag.to_csv(tmp_path / "diagnostics.csv", index=False)
    claims.run(
        make_config(smoke_cfg),
        tmp_path / "loss_curves.csv",
        tmp_path / "c.json",
        tmp_path / "c.md",
        check_reference=False,
        diagnostics_path=tmp_path / "diagnostics.csv",
    )
    line = next(x for x in (tmp_path / "c.md").read_text().splitlines() if x.startswith("- `postnorm_deepnorm_clip1`"))
    assert "**nothing unusual** in the diagnostics" in line and "(1.00x its median 5" in line


@pytest.mark.slow
def test_forced_spike_is_caught_by_the_diagnostics_and_marked_on_every_panel(tmp_path):
    fs = load_benchmark("forced_spike")
    cfg = fs.forced_config()
    cfg["train"]["steps"] = 60  # the spikes come during and just after warm-up (24 steps)
    result = fs.run(tmp_path, threads=1, cfg=make_config(cfg, source="forced_spike"))
    forced = [e for e in result["explained"] if e["run"] == "postnorm_noclip"]
    assert forced, "the Post-Norm arm without DeepNorm or clipping did not spike at lr 0.05"
    for e in result["explained"]:  # every spike over 2 bits comes with a gradient-norm surge
        assert e["height_bits"] > 2.0 and e["grad_norm"]["ratio"] >= 3.0 and e["unusual"]
    loss = pd.read_csv(tmp_path / "loss_curves.csv")
    diag = pd.read_csv(tmp_path / aggregate.DIAGNOSTICS)
    typed = C.from_mapping(cfg)
    _, axes, found = stability.draw(
        loss, diag, typed.runs, typed.figure, typed.claims.spike_threshold, typed.claims.recovery_margin
    )
    assert {(k["run"], k["peak_step"]) for k in found} == {(e["run"], e["peak_step"]) for e in result["explained"]}
    for k in found:
        for ax in axes.values():
            marks = [
                line
                for line in ax.get_lines()
                if line.get_gid() == f"spike:{k['run']}:seed{k['seed']}"
                and list(line.get_xdata()) == [k["peak_step"]] * 2
            ]
            assert len(marks) == 1
    assert set(_gids(axes["grad_norm"], "threshold:clip")) == {"threshold:clip=1"}  # the clip-0 arm draws none
    assert all(p.is_file() and p.stat().st_size > 0 for p in result["figures"])
