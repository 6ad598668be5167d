"""The figure stage: "Acoustic MLM Loss on Codebook-0 vs Training Steps", from loss_curves.csv only.

Seaborn line chart, logarithmic step axis labelled in thousands, codebook-0 loss in bits,
legend at the top right in the paper's order with its colours and markers (tab10 blue
circles, orange, green and pink triangles). Written as PNG (300 dpi), PDF and SVG.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from .utils import atomic_path, log  # noqa: E402

TITLE = "Acoustic MLM Loss on Codebook-0 vs Training Steps"
XLABEL = "Training Step"
YLABEL = "Acoustic MLM Loss on Codebook-0"
STEM = "acoustic_mlm_loss_codebook0"
FORMATS = ("png", "pdf", "svg")

_TAB10 = sns.color_palette("tab10")
# The paper's arms in legend order: blue circles, then orange, green and pink triangles.
ARM_STYLES = [(_TAB10[0], "o"), (_TAB10[1], "^"), (_TAB10[2], "^"), (_TAB10[6], "^")]
# Further arms a user adds get the remaining tab10 colours and other markers.
EXTRA_STYLES = [(_TAB10[i], mk) for i, mk in zip((3, 4, 5, 7, 8, 9), ("s", "D", "v", "P", "X", "*"))]


def step_label(x: float, _pos=None) -> str:
    """Tick text: thousands as "1K", "10K", "100K"; smaller steps as plain numbers."""
    if x >= 1000:
        return f"{x / 1000:g}K"
    return f"{x:g}"


def arm_styles(labels: list[str]) -> tuple[dict, dict]:
    styles = ARM_STYLES + EXTRA_STYLES
    if len(labels) > len(styles):
        raise ValueError(f"the figure can style {len(styles)} arms, the config has {len(labels)}")
    palette = {lab: styles[i][0] for i, lab in enumerate(labels)}
    markers = {lab: styles[i][1] for i, lab in enumerate(labels)}
    return palette, markers


def mark_divergence(ax, selected: pd.DataFrame, labels: list[str], palette: dict) -> list[str]:
    """An X and "diverged" at the last finite point of every run (seed) whose curve ends non-finite."""
    marked = []
    for (label, seed), g in selected.groupby(["label", "seed"], sort=False):
        g = g.sort_values("step")
        finite = g["loss_bits"].notna() & (g["loss_bits"].abs() != float("inf"))
        if finite.all() or not finite.any() or label not in palette:
            continue
        last = g[finite].iloc[-1]
        ax.plot([last["step"]], [last["loss_bits"]], marker="X", markersize=11, color=palette[label],
                markeredgecolor="black", linestyle="none", zorder=5)
        ax.annotate(f"diverged (seed {seed})", (last["step"], last["loss_bits"]), textcoords="offset points",
                    xytext=(6, 6), fontsize=8, color=palette[label])
        marked.append(label)
    return marked


def draw(curves: pd.DataFrame, labels: list[str], fig_cfg: dict, codebook: int = 0):
    """The chart on a new matplotlib figure; returns (fig, ax)."""
    split = fig_cfg.get("split", "train")
    selected = curves[(curves["split"] == split) & (curves["codebook"] == codebook)]
    data = selected.dropna(subset=["loss_bits"])
    missing = [lab for lab in labels if lab not in set(data["label"])]
    if missing:
        raise ValueError(f"loss curves hold no {split} codebook-{codebook} rows for: {', '.join(missing)}")
    palette, markers = arm_styles(labels)
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.1)
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    sns.lineplot(
        data=data,
        x="step",
        y="loss_bits",
        hue="label",
        hue_order=labels,
        style="label",
        style_order=labels,
        palette=palette,
        markers=markers,
        dashes=False,
        errorbar=("ci", 95),  # a band only appears when an arm has several seeds
        linewidth=1.4,
        markersize=6,
        markevery=0.08,  # equal visual spacing along the line: readable on a log axis
        ax=ax,
    )
    mark_divergence(ax, selected, labels, palette)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(FuncFormatter(step_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    x_max = fig_cfg.get("x_max") or float(data["step"].max())
    ax.set_xlim(max(1.0, float(data["step"].min())), x_max)
    y_min, y_max = fig_cfg.get("y_min"), fig_cfg.get("y_max")
    if y_min is not None or y_max is not None:
        ax.set_ylim(y_min, y_max)
    ax.set_title(TITLE)
    ax.set_xlabel(XLABEL)
    ax.set_ylabel(YLABEL)
    ax.legend(loc="upper right", title=None, frameon=True)
    fig.tight_layout()
    return fig, ax


def run(cfg: dict, curves_path: Path, out_dir: Path) -> list[Path]:
    curves_path = Path(curves_path)
    if not curves_path.is_file():
        raise FileNotFoundError(f"{curves_path}: loss curves not found; run the aggregate stage first")
    curves = pd.read_csv(curves_path)
    labels = [r["label"] for r in cfg["runs"].values()]
    fig, ax = draw(curves, labels, cfg["figure"])
    if cfg["figure"].get("overlay_paper"):
        from . import reference

        reference.overlay(ax, reference.load_reference(), labels, runs=list(cfg["runs"]))
    out_dir = Path(out_dir)
    written = []
    for fmt in FORMATS:
        path = out_dir / f"{STEM}.{fmt}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=300 if fmt == "png" else None)
        written.append(path)
    plt.close(fig)
    log.info("figure: wrote %s", ", ".join(str(p) for p in written))
    return written
