"""The stability figure: why an arm spiked or stalled, beside its loss.

Read only from `loss_curves.csv` and `diagnostics.csv` (the aggregate stage's tidy files). The
same arms, colours and logarithmic step axis as the main figure (figure.py), one panel each,
sharing the x axis:

    1  codebook-0 loss in bits (the main figure's curve)
    2  gradient norm before clipping, the largest since the previous row (log y), with each
       arm's clip threshold drawn
    3  the largest attention logit |q.k| / sqrt(hd) over layers (log y), with float16's largest
       finite value (65504) drawn: above it a plain softmax attention overflows in fp16
    4  the fp16 loss scale (log y), only when an arm trains in fp16

Every loss spike (curves.detect_spikes with the claims' spike_threshold and recovery_margin,
the one definition of a spike) is marked by a dashed vertical line in the arm's colour at its
peak step on every panel. Written as PNG (300 dpi), PDF and SVG.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from acoustic_mlm import config as C  # noqa: E402
from acoustic_mlm import curves as K  # noqa: E402
from acoustic_mlm.artifacts import curve_tables  # noqa: E402
from acoustic_mlm.artifacts import metrics as M  # noqa: E402
from acoustic_mlm.errors import UserError  # noqa: E402
from acoustic_mlm.report import figure
from acoustic_mlm.utils import FP16_MAX, log  # noqa: E402

TITLE = "Training stability: loss, gradient norm, attention logits"
STEM = "stability"
# (panel key, diagnostic column in diagnostics.csv, y label, log y)
PANELS = (
    ("loss", None, "Codebook-0 loss (bits)", False),
    ("grad_norm", M.GRAD_NORM_MAX, "Gradient norm\nbefore clipping", True),
    ("attn_logit", M.ATTN_LOGIT_MAX, "Largest attention\nlogit |q.k|/sqrt(d)", True),
    ("loss_scale", M.LOSS_SCALE, "fp16 loss scale", True),
)
FP16_GID = "threshold:fp16"
CLIP_GID = "threshold:clip={:g}"
SPIKE_GID = "spike:{run}:seed{seed}"


def spikes(loss_curves: pd.DataFrame, runs: list[str], threshold: float, recovery_margin: float) -> list[dict]:
    """Every spike of every arm and seed on these codebook-0 rows: dicts of curves.detect_spikes
    plus run and seed, in arm order."""
    out = []
    for run in runs:
        for seed, g in loss_curves[loss_curves["run"] == run].groupby("seed", sort=True):
            g = g.groupby("step", sort=True)["loss_bits"].mean()
            finite = np.isfinite(g.to_numpy())
            for k in K.detect_spikes(g.index[finite], g.to_numpy()[finite], threshold, recovery_margin):
                out.append({"run": run, "seed": int(seed), **k})
    return out


def draw(
    loss_curves: pd.DataFrame,
    diagnostics: pd.DataFrame,
    runs: dict[str, C.RunConfig],
    fig_cfg: C.FigureConfig,
    spike_threshold: float,
    recovery_margin: float,
):
    """The panels on a new figure; returns (fig, {panel key: ax}, spikes).

    `runs`: run name -> its arm (label, clip), in legend order. `loss_curves` and
    `diagnostics` are the aggregate stage's tidy tables.
    """
    names = list(runs)
    labels, styles = figure.labels_of(runs), figure.arm_styles(runs)
    label_of = {n: runs[n].label for n in names}  # the config's labels, whatever the files say
    loss, diag = _selected(loss_curves, diagnostics, label_of, fig_cfg.split)
    fp16 = (diag["diagnostic"] == M.LOSS_SCALE) & diag["value"].notna()
    panels = [p for p in PANELS if p[0] != "loss_scale" or fp16.any()]  # loss scale: fp16 arms only

    sns.set_theme(style="whitegrid", context="paper", font_scale=1.0)
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.0, 2.3 * len(panels) + 0.6), sharex=True)
    axes = dict(zip((p[0] for p in panels), np.atleast_1d(axes)))
    for key, column, ylabel, log_y in panels:
        _panel(axes[key], loss if column is None else diag, column, ylabel, log_y, labels, styles, key == "loss")
    figure.mark_divergence(axes["loss"], loss, styles)
    figure.mark_no_finite_loss(axes["loss"], loss, styles)  # diverged at its first update: said in the legend
    _thresholds(axes, runs)
    found = spikes(loss, names, spike_threshold, recovery_margin)
    _mark_spikes(axes, found, {n: styles[label_of[n]].color for n in names})
    steps = pd.concat([loss["step"], diag["step"]])
    last = axes[panels[-1][0]]
    figure.log_step_axis(last, float(steps.min()), fig_cfg.x_max or float(steps.max()))
    last.set_xlabel(figure.XLABEL)
    for ax in axes.values():
        if ax is not last:
            ax.set_xlabel("")
    axes["loss"].legend(loc="upper right", title=None, frameon=True, fontsize=7)
    axes["loss"].set_title(TITLE)
    fig.tight_layout()
    return fig, axes, found


def _selected(
    loss_curves: pd.DataFrame, diagnostics: pd.DataFrame, label_of: dict[str, str], split: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The arms' codebook-0 rows of `split` and their diagnostics rows, labelled as the config
    labels them; an arm without a loss row is one line (an arm whose rows are all non-finite, one that
    diverged before any finite loss, is drawn as the main figure draws it)."""
    names = list(label_of)
    loss = loss_curves[
        (loss_curves["split"] == split) & (loss_curves["codebook"] == 0) & loss_curves["run"].isin(names)
    ]
    loss = loss.assign(label=loss["run"].map(label_of))
    missing = [n for n in names if n not in set(loss["run"])]
    if missing:
        raise UserError(f"loss curves hold no {split} codebook-0 rows for: {', '.join(missing)}")
    diag = diagnostics[diagnostics["run"].isin(names)]
    return loss, diag.assign(label=diag["run"].map(label_of))


def _panel(ax, rows: pd.DataFrame, column: str | None, ylabel: str, log_y: bool, labels, styles, loss: bool) -> None:
    """One panel: the loss rows (`column` None, a band over seeds and the legend) or a diagnostic's
    rows; a diagnostic without a finite (positive, on a log axis) value says it was not measured."""
    if column is None:
        data = rows.dropna(subset=["loss_bits"]).rename(columns={"loss_bits": "value"})
    else:
        data = rows[(rows["diagnostic"] == column)].replace([np.inf, -np.inf], np.nan).dropna(subset=["value"])
        if log_y:
            data = data[data["value"] > 0]
    if data.empty:
        ax.text(
            0.5,
            0.5,
            f"not measured ({column} absent: train.diagnostics false?)",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9,
            color="0.4",
        )
    else:
        figure.styled_lines(ax, data, "value", labels, styles, band=loss, linewidth=1.3, markersize=5, legend=loss)
    if log_y:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)


def _thresholds(axes: dict, runs: dict[str, C.RunConfig]) -> None:
    """Each arm's clip threshold on the gradient norm panel; float16's largest value on the
    attention logit panel, whose y range reaches past it."""
    for clip in sorted({float(r.clip) for r in runs.values() if float(r.clip) > 0}):
        line = axes["grad_norm"].axhline(clip, color="0.3", linestyle=":", linewidth=1.0)
        line.set_gid(CLIP_GID.format(clip))
        axes["grad_norm"].annotate(
            f"clip {clip:g}",
            (0.005, clip),
            xycoords=("axes fraction", "data"),
            xytext=(2, 2),
            textcoords="offset points",
            fontsize=7,
            color="0.3",
        )
    ax = axes["attn_logit"]
    line = ax.axhline(FP16_MAX, color="firebrick", linestyle="--", linewidth=1.0)
    line.set_gid(FP16_GID)
    ax.annotate(
        "fp16 max 65504",
        (0.005, FP16_MAX),
        xycoords=("axes fraction", "data"),
        xytext=(2, -9),
        textcoords="offset points",
        fontsize=7,
        color="firebrick",
    )
    low = ax.get_ylim()[0] if ax.get_yscale() == "log" and ax.has_data() else 1e-2
    ax.set_ylim(min(low, FP16_MAX / 10), FP16_MAX * 8)


def _mark_spikes(axes: dict, found: list[dict], colour: dict[str, str]) -> None:
    """One dashed line per spike on every panel, at its peak step, in its arm's colour; its height
    annotated on the loss panel (spikes at one step stacked, not overlaid)."""
    for k in found:
        for ax in axes.values():
            line = ax.axvline(k["peak_step"], color=colour[k["run"]], linestyle="--", linewidth=1.0, alpha=0.8)
            line.set_gid(SPIKE_GID.format(**k))
        same = sum(1 for j in found[: found.index(k)] if j["peak_step"] == k["peak_step"])
        axes["loss"].annotate(
            f"spike +{k['height_bits']:.2f} bits",
            (k["peak_step"], k["peak_bits"]),
            ha="right",
            xytext=(-4, -10 - 9 * same),
            textcoords="offset points",
            fontsize=7,
            color=colour[k["run"]],
        )


def run(cfg: C.Config, curves_path: Path, diagnostics_path: Path, out_dir: Path) -> list[Path]:
    for path, what in ((Path(curves_path), "loss curves"), (Path(diagnostics_path), "diagnostics")):
        if not path.is_file():
            raise UserError(f"{path}: {what} not found; run the aggregate stage first")
    loss_curves, diagnostics = curve_tables.read_curves(curves_path), curve_tables.read_diagnostics(diagnostics_path)
    need = {"run", "seed", "step", "diagnostic", "value"}
    if not need <= set(diagnostics.columns):
        raise UserError(f"{diagnostics_path}: lacks column(s) {', '.join(sorted(need - set(diagnostics.columns)))}")
    fig, _, found = draw(
        loss_curves, diagnostics, cfg.runs, cfg.figure, cfg.claims.spike_threshold, cfg.claims.recovery_margin
    )
    written = figure.save_formats(fig, out_dir, STEM)
    plt.close(fig)
    log.info("stability: %d spike(s) marked; wrote %s", len(found), ", ".join(str(p) for p in written))
    return written
