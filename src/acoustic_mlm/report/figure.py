"""The figure stage: "Acoustic MLM Loss on Codebook-0 vs Training Steps", from loss_curves.csv only,
and the comparison chart beside the paper's digitised curves (the compare stage).

Seaborn line chart, logarithmic step axis labelled in thousands, codebook-0 loss in bits,
legend at the top right in the config's arm order. Arms are styled by their `role` (which of the
paper's curves they reproduce), never by name or position: tab10 blue circles, orange, green and
pink triangles as in the paper; arms without a role get the remaining tab10 colours. Arms whose
curves coincide stay visible: the Attn. Relax arm (PB-Relax is the identity in fp32) is drawn
dashed with hollow markers over the solid Clip=1 arm, and the legend names coinciding arms.
Written as PNG (300 dpi), PDF and SVG.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from acoustic_mlm import config as C  # noqa: E402
from acoustic_mlm.artifacts.curve_tables import NONFINITE  # noqa: E402
from acoustic_mlm.errors import UserError  # noqa: E402
from acoustic_mlm.report.reference import load_reference  # noqa: E402
from acoustic_mlm.utils import atomic_path, log  # noqa: E402

TITLE = "Acoustic MLM Loss on Codebook-0 vs Training Steps"
XLABEL = "Training Step"
YLABEL = "Acoustic MLM Loss on Codebook-0"
STEM = "acoustic_mlm_loss_codebook0"
FORMATS = ("png", "pdf", "svg")
SIDE_BY_SIDE = "paper_vs_reproduction.png"
PAPER_LEGEND = "Paper (digitised), dashed"
COINCIDE_BITS = 0.02  # two arms whose mean curves stay this close at every logged step coincide
X_PAD = 1.12  # the step axis reaches this factor beyond the first and last points: no marker is cut

_TAB10 = sns.color_palette("tab10")


class ArmStyle(NamedTuple):
    color: tuple
    marker: str
    dashes: tuple | str  # "" solid, else (on, off) in points
    hollow: bool = False  # markers drawn as outlines: what lies under them stays visible


# The paper's curves: blue circles, then orange, green and pink triangles. Attn. Relax is dashed so
# that it stays visible where it coincides with Clip=1 (PB-Relax is the identity in fp32).
ROLE_STYLES = {
    "clip10": ArmStyle(_TAB10[0], "o", ""),
    "clip1": ArmStyle(_TAB10[1], "^", ""),
    "deepnorm": ArmStyle(_TAB10[2], "^", ""),
    "attn_relax": ArmStyle(_TAB10[6], "^", (4, 2), hollow=True),
}
# Arms without a role get the remaining tab10 colours and other markers, dash-dotted.
EXTRA_STYLES = [
    ArmStyle(_TAB10[i], mk, (6, 2, 1, 2)) for i, mk in zip((3, 4, 5, 7, 8, 9), ("s", "D", "v", "P", "X", "*"))
]


def step_label(x: float, _pos=None) -> str:
    """Tick text: thousands as "1K", "10K", "100K"; smaller steps as plain numbers."""
    if x >= 1000:
        return f"{x / 1000:g}K"
    return f"{x:g}"


def log_step_axis(ax, first: float, last: float) -> None:
    """A logarithmic step axis labelled in thousands from `first` to `last`, padded by X_PAD so
    that markers at either end are drawn whole."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(FuncFormatter(step_label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(max(1.0, first) / X_PAD, last * X_PAD)


def arm_styles(runs: dict[str, C.RunConfig]) -> dict[str, ArmStyle]:
    """label -> style for the config's arms (`cfg.runs`), by role; extra arms in config order."""
    extra = iter(EXTRA_STYLES)
    styles = {}
    for name, r in runs.items():
        if r.role is not None:
            styles[r.label] = ROLE_STYLES[r.role]
            continue
        try:
            styles[r.label] = next(extra)
        except StopIteration:
            raise UserError(f"runs.{name}: the figure can style {len(EXTRA_STYLES)} arms without a role") from None
    return styles


def labels_of(runs: dict[str, C.RunConfig]) -> list[str]:
    return [r.label for r in runs.values()]


def coinciding(data: pd.DataFrame, labels: list[str]) -> list[tuple[str, str, float]]:
    """Pairs of arms whose mean curves stay within COINCIDE_BITS at every shared step: (a, b, max diff)."""
    means = data.groupby(["label", "step"])["loss_bits"].mean().unstack("label")
    pairs = []
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if a in means and b in means:
                diff = (means[a] - means[b]).abs().dropna()
                if len(diff) and diff.max() <= COINCIDE_BITS:
                    pairs.append((a, b, float(diff.max())))
    return pairs


def coincidence_note(data: pd.DataFrame, labels: list[str]) -> str | None:
    """The legend's title when arms coincide: which arm's curve hides under which."""
    pairs = coinciding(data, labels)
    return "\n".join(f"{b} coincides with\n{a} (within {COINCIDE_BITS:g} bits)" for a, b, _ in pairs) or None


def mark_divergence(ax, selected: pd.DataFrame, styles: dict[str, ArmStyle]) -> list[str]:
    """An X and "diverged" at the last finite point of every run (seed) whose curve ends non-finite."""
    marked = []
    for (label, seed), g in selected.groupby(["label", "seed"], sort=False):
        g = g.sort_values("step")
        finite = g["loss_bits"].notna() & (g["loss_bits"].abs() != float("inf"))
        if finite.all() or not finite.any() or label not in styles:
            continue
        last = g[finite].iloc[-1]
        ax.plot(
            [last["step"]],
            [last["loss_bits"]],
            marker="X",
            markersize=11,
            color=styles[label].color,
            markeredgecolor="black",
            linestyle="none",
            zorder=5,
        )
        ax.annotate(
            f"diverged (seed {seed})",
            (last["step"], last["loss_bits"]),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=8,
            color=styles[label].color,
        )
        marked.append(label)
    return marked


def mark_no_finite_loss(ax, selected: pd.DataFrame, styles: dict[str, ArmStyle]) -> list[str]:
    """A legend entry (an X in the arm's colour) for every arm with rows but no finite loss at all (it
    diverged at its first update): it has no point to draw, and the figure says so rather than drop it."""
    marked = []
    for label, g in selected.groupby("label", sort=False):
        finite = g["loss_bits"].notna() & (g["loss_bits"].abs() != float("inf"))
        if finite.any() or label not in styles:
            continue
        seeds = ", ".join(str(s) for s in sorted(g["seed"].unique()))
        ax.plot(
            [],
            [],
            marker="X",
            markersize=9,
            color=styles[label].color,
            markeredgecolor="black",
            linestyle="none",
            label=f"{label}: diverged at step {int(g['step'].max())}, no finite loss (seed {seeds})",
        )
        marked.append(label)
    return marked


def mark_nonfinite(ax, selected: pd.DataFrame, styles: dict[str, ArmStyle]) -> list[str]:
    """A note at the end of every run (seed) that completed after skipping non-finite updates:
    such a run is not clean, and the figure says so where its curve ends."""
    if NONFINITE not in selected.columns:
        return []
    marked = []
    for (label, seed), g in selected.groupby(["label", "seed"], sort=False):
        g = g.sort_values("step")
        finite = g[g["loss_bits"].notna() & (g["loss_bits"].abs() != float("inf"))]
        skipped = int(g[NONFINITE].max())
        if not skipped or finite.empty or len(finite) < len(g) or label not in styles:
            continue  # clean, or diverged (marked by mark_divergence)
        last = finite.iloc[-1]
        ax.annotate(
            f"{skipped} non-finite update{'s' * (skipped > 1)} skipped (seed {seed})",
            (last["step"], last["loss_bits"]),
            textcoords="offset points",
            xytext=(-6, 8),
            ha="right",
            fontsize=7,
            color=styles[label].color,
        )
        marked.append(label)
    return marked


def styled_lines(
    ax,
    data: pd.DataFrame,
    y: str,
    labels: list[str],
    styles: dict[str, ArmStyle],
    *,
    band: bool = True,
    linewidth: float = 1.4,
    markersize: float = 6,
    legend: bool | str = "auto",
) -> None:
    """The arms' mean `y` per step in their styles, markers spaced evenly along each line (readable on a
    log axis), hollow where the style says; a 95 % band over seeds if `band` (it appears only when an
    arm has several seeds). The figure and the stability figure draw their curves with it."""
    present = [lab for lab in labels if lab in set(data["label"])]
    before = len(ax.get_lines())
    sns.lineplot(
        data=data,
        x="step",
        y=y,
        hue="label",
        hue_order=present,
        style="label",
        style_order=present,
        palette={k: styles[k].color for k in present},
        markers={k: styles[k].marker for k in present},
        dashes={k: styles[k].dashes for k in present},
        errorbar=("ci", 95) if band else None,
        linewidth=linewidth,
        markersize=markersize,
        legend=legend,
        ax=ax,
    )
    for label, line in zip(present, ax.get_lines()[before : before + len(present)]):
        line.set_markevery(0.08)
        if styles[label].hollow:
            line.set_markerfacecolor("none")
            line.set_markeredgecolor(styles[label].color)


def _selected(curves: pd.DataFrame, runs: dict[str, C.RunConfig], split: str, codebook: int) -> pd.DataFrame:
    """The curves of the config's arms, labelled by the config (whatever the CSV says)."""
    data = curves[(curves["split"] == split) & (curves["codebook"] == codebook) & curves["run"].isin(list(runs))]
    return data.assign(label=data["run"].map({name: r.label for name, r in runs.items()}))


def draw(curves: pd.DataFrame, runs: dict[str, C.RunConfig], fig_cfg: C.FigureConfig, codebook: int = 0):
    """The chart on a new matplotlib figure; returns (fig, ax)."""
    split = fig_cfg.split
    labels, styles = labels_of(runs), arm_styles(runs)
    selected = _selected(curves, runs, split, codebook)
    data = selected[selected["loss_bits"].notna() & (selected["loss_bits"].abs() != float("inf"))]
    missing = [lab for lab in labels if lab not in set(selected["label"])]
    if missing:
        raise UserError(f"loss curves hold no {split} codebook-{codebook} rows for: {', '.join(missing)}")
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.1)
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    if len(data):
        styled_lines(ax, data, "loss_bits", labels, styles, markersize=6)
    mark_divergence(ax, selected, styles)
    mark_nonfinite(ax, selected, styles)
    mark_no_finite_loss(ax, selected, styles)
    steps = data["step"] if len(data) else selected["step"]
    log_step_axis(ax, float(steps.min()), fig_cfg.x_max or float(steps.max()))
    y_min, y_max = fig_cfg.y_min, fig_cfg.y_max
    if y_min is not None or y_max is not None:
        ax.set_ylim(y_min, y_max)
    ax.set_title(TITLE)
    ax.set_xlabel(XLABEL)
    ax.set_ylabel(YLABEL)
    ax.legend(loc="upper right", title=coincidence_note(data, labels), title_fontsize=7, frameon=True)
    fig.tight_layout()
    if y_max is None:
        make_room_for_legend(ax)
    return fig, ax


LEGEND_GAP = 0.02  # make_room_for_legend: clearance between the curves and the legend, in axes height


def make_room_for_legend(ax) -> None:
    """Raise the y axis' top until no curve runs under the legend, which stays at the top right as
    in the paper's figure (curves still high at the right end of the log axis would pass under it).

    The legend's size in axes fractions does not change with the y limits, so one step suffices:
    the highest curve value within the legend's x span, the ends of its segments included, must
    sit LEGEND_GAP below the legend's bottom edge.
    """
    legend = ax.get_legend()
    if legend is None:
        return
    ax.figure.canvas.draw()  # the legend's size needs a renderer
    box = legend.get_window_extent().transformed(ax.transAxes.inverted())  # axes fractions
    (x0, _), (x1, _) = ax.transData.inverted().transform(ax.transAxes.transform([(box.x0, 0), (box.x1, 0)]))
    highest = -math.inf
    for line in ax.get_lines():
        x = np.asarray(line.get_xdata(), dtype=float)
        y = np.asarray(line.get_ydata(), dtype=float)
        ok = np.isfinite(x) & np.isfinite(y) & (x > 0)
        if not ok.any():
            continue
        x, y = x[ok], y[ok]
        inside = y[(x >= x0) & (x <= x1)]
        ends = np.interp(np.log10([x0, x1]), np.log10(x), y, left=np.nan, right=np.nan)  # log x axis
        values = np.concatenate([inside, ends[np.isfinite(ends)]])
        if len(values):
            highest = max(highest, float(values.max()))
    lo, hi = ax.get_ylim()
    floor = box.y0 - LEGEND_GAP  # axes fraction the curves must stay under
    if not math.isfinite(highest) or floor <= 0 or lo + floor * (hi - lo) >= highest:
        return
    ax.set_ylim(lo, lo + (highest - lo) / floor)


def overlay(ax, reference: pd.DataFrame, runs: dict[str, C.RunConfig], legend: bool = True) -> list[Line2D]:
    """Draw the paper's curves dashed onto `ax`, each in the style of the arm with the same role.

    The lines stay out of the legend; with `legend`, an existing legend gains one entry saying
    that dashed lines are the paper's. Returns the lines drawn.
    """
    styles = arm_styles(runs)
    lines = []
    for r in runs.values():
        rows = reference[reference["role"] == r.role].sort_values("step")
        if r.role is None or rows.empty:
            continue
        st = styles[r.label]
        (line,) = ax.plot(
            rows["step"],
            rows["loss_bits"],
            linestyle="--",
            linewidth=1.2,
            color=st.color,
            marker=st.marker,
            markersize=5,
            markerfacecolor="none",
            label=f"_paper {r.label}",
        )  # "_": not in the legend
        lines.append(line)
    if legend and ax.get_legend() is not None:
        handles, texts = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], color="0.35", linestyle="--", linewidth=1.2))
        texts.append(PAPER_LEGEND)
        ax.legend(handles, texts, loc="upper right", title=None, frameon=True)
    return lines


def side_by_side(curves: pd.DataFrame, reference: pd.DataFrame, cfg: C.Config, codebook: int = 0):
    """Left: the paper's curves (dashed); right: the reproduction of cfg's arms as cfg.figure says.
    Returns (fig, (ax_paper, ax_repro))."""
    runs, fig_cfg = cfg.runs, cfg.figure
    split = fig_cfg.split
    labels, styles = labels_of(runs), arm_styles(runs)
    data = _selected(curves, runs, split, codebook).dropna(subset=["loss_bits"])
    if data.empty:
        raise UserError(f"loss curves hold no {split} codebook-{codebook} rows for any arm")
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.0)
    fig, (ax_p, ax_r) = plt.subplots(1, 2, figsize=(12.0, 5.4), sharey=True)

    overlay(ax_p, reference, runs, legend=False)
    ax_p.set_title("Paper (digitised from the figure's description)")
    styled_lines(ax_r, data, "loss_bits", labels, styles, markersize=5)
    ax_r.set_title(f"Reproduction ({split})")
    log_step_axis(ax_p, float(reference["step"].min()), float(reference["step"].max()))
    log_step_axis(ax_r, float(data["step"].min()), fig_cfg.x_max or float(data["step"].max()))
    for ax in (ax_p, ax_r):
        ax.set_xlabel(XLABEL)
    ax_p.set_ylabel(YLABEL)
    ax_r.set_ylabel("")
    y_min, y_max = fig_cfg.y_min, fig_cfg.y_max
    if y_min is not None or y_max is not None:
        ax_p.set_ylim(y_min, y_max)
    # one legend for both panels, below them: the arms as the right panel draws them (the paper's are dashed)
    ax_r.get_legend().remove()
    handles = [_handle(styles[lab]) for lab in labels]
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 2), title=None, frameon=True)
    fig.suptitle(TITLE)
    fig.tight_layout(rect=(0, 0.06 * math.ceil(len(labels) / 2), 1, 1))
    return fig, (ax_p, ax_r)


def _handle(style: ArmStyle) -> Line2D:
    """A legend entry drawn as `_lines` draws the arm: colour, marker, dashes, hollow markers."""
    return Line2D(
        [],
        [],
        color=style.color,
        marker=style.marker,
        linewidth=1.4,
        markersize=5,
        linestyle=(0, style.dashes) if style.dashes else "-",
        markerfacecolor="none" if style.hollow else style.color,
        markeredgecolor=style.color,
    )


def _read_curves(path: Path) -> pd.DataFrame:
    from acoustic_mlm.artifacts.curve_tables import read_curves

    return read_curves(path)


def _save(fig, path: Path, fmt: str, dpi: int | None) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi)
    return path


def save_formats(fig, out_dir: Path, stem: str, png_dpi: int = 300) -> list[Path]:
    """`fig` as <out_dir>/<stem>.png (at png_dpi), .pdf and .svg, each written atomically: every
    figure stage's outputs (the figure, the stability figure, the stability map's figure)."""
    return [_save(fig, Path(out_dir) / f"{stem}.{fmt}", fmt, png_dpi if fmt == "png" else None) for fmt in FORMATS]


def run(cfg: C.Config, curves_path: Path, out_dir: Path, reference_path: Path | None = None) -> list[Path]:
    """The figure stage: the chart as PNG, PDF and SVG in out_dir (the paper's curves overlaid
    when figure.overlay_paper)."""
    fig, ax = draw(_read_curves(curves_path), cfg.runs, cfg.figure)
    if cfg.figure.overlay_paper:
        overlay(ax, load_reference(reference_path), cfg.runs)
    written = save_formats(fig, out_dir, STEM)
    plt.close(fig)
    log.info("figure: wrote %s", ", ".join(str(p) for p in written))
    return written


def compare(cfg: C.Config, curves_path: Path, out_path: Path, reference_path: Path | None = None) -> Path:
    """The compare stage: the paper's curves beside the reproduction, one PNG (200 dpi)."""
    fig, _ = side_by_side(_read_curves(curves_path), load_reference(reference_path), cfg)
    out = _save(fig, Path(out_path), "png", 200)
    plt.close(fig)
    log.info("compare: wrote %s", out)
    return out
