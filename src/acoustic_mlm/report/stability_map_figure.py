"""The stability map's figure: each arm's final loss against the peak learning rate, one panel per
depth and precision, drawn from the map's table alone (report.stability_map.read_map)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.run_summary import DIVERGED
from acoustic_mlm.report.stability_map import FIGURE_STEM, _in_panel, panels, read_map, relax_reach
from acoustic_mlm.utils import FP16_MAX  # attention logits beyond it overflow in float16

log = logging.getLogger(__name__)


def _styled_line(ax, x, y, st, linewidth: float, label: str | None = None):
    """One arm's line in its figure style (markers, hollow or filled, dashes); returns the line."""
    kwargs = {"label": label} if label is not None else {}
    (line,) = ax.plot(
        x,
        y,
        color=st.color,
        marker=st.marker,
        markersize=5,
        linewidth=linewidth,
        markerfacecolor="none" if st.hollow else st.color,
        **kwargs,
    )
    if st.dashes:
        line.set_dashes(st.dashes)
    return line


def draw(cfg: C.Config, t: pd.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from acoustic_mlm.report.figure import arm_styles

    styles = arm_styles(cfg.runs)
    ps = panels(t)
    fig, axes = plt.subplots(2, len(ps), figsize=(4.2 * len(ps) + 1.5, 7.2), squeeze=False, sharex=True)
    reach = relax_reach(cfg.model.relax_alpha)
    handles = {}
    for j, p in enumerate(ps):
        top, bottom = axes[0, j], axes[1, j]
        panel = t[_in_panel(t, p)]
        for arm, run in cfg.runs.items():
            g = panel[panel["arm"] == arm]
            if g.empty:
                continue
            st = styles[run.label]
            by = g.groupby("lr")
            lr = np.array(sorted(g["lr"].unique()), dtype=float)
            mean, lo, hi = (by["capped_loss"].agg(f).reindex(lr).to_numpy() for f in ("mean", "min", "max"))
            handles.setdefault(run.label, _styled_line(top, lr, mean, st, 1.4, label=run.label))
            if g[M.SEED].nunique() > 1:
                top.fill_between(lr, lo, hi, color=st.color, alpha=0.18, linewidth=0)
            div = g[g["status"] == DIVERGED]
            if len(div):
                top.scatter(div["lr"], div["capped_loss"], marker="x", s=60, color=st.color, zorder=5, linewidths=2)
            logit = by[M.ATTN_LOGIT_MAX].max().reindex(lr).to_numpy()
            _styled_line(bottom, lr, logit, st, 1.2)
        top.set_xscale("log")
        top.set_title(p["label"], fontsize=10)
        top.grid(True, which="major", alpha=0.3)
        bottom.set_xscale("log")
        bottom.set_yscale("log")
        bottom.axhline(FP16_MAX, color="black", linewidth=1, linestyle="--")
        bottom.axhline(reach, color="grey", linewidth=1, linestyle=":")
        bottom.grid(True, which="major", alpha=0.3)
        bottom.set_xlabel("Peak learning rate")
        ymax = max(
            FP16_MAX * 2, float(np.nanmax(panel[M.ATTN_LOGIT_MAX])) * 2 if panel[M.ATTN_LOGIT_MAX].notna().any() else 0
        )
        bottom.set_ylim(top=ymax)
    axes[0, 0].set_ylabel("Final codebook-0 loss (bits)\nmin(L, L0); diverged = x at L0")
    axes[1, 0].set_ylabel("Largest attention logit")
    axes[1, 0].text(
        0.02, FP16_MAX, " float16 limit", transform=axes[1, 0].get_yaxis_transform(), va="bottom", fontsize=8
    )
    axes[1, 0].text(
        0.02,
        reach,
        f" limit / {cfg.model.relax_alpha:g} (PB-Relax)",
        transform=axes[1, 0].get_yaxis_transform(),
        va="bottom",
        fontsize=8,
        color="grey",
    )
    fig.suptitle("LR sensitivity: final codebook-0 loss vs peak learning rate")
    fig.legend(
        list(handles.values()), list(handles), loc="lower center", ncol=min(3, len(handles)), fontsize=8, frameon=False
    )
    fig.tight_layout(rect=(0, 0.04 + 0.025 * math.ceil(len(handles) / 3), 1, 0.96))
    return fig


def run_figure(cfg: C.Config, map_path: Path, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    from acoustic_mlm.report.figure import save_formats

    t = read_map(map_path)
    fig = draw(cfg, t)
    written = save_formats(fig, out_dir, FIGURE_STEM, png_dpi=200)
    plt.close(fig)
    log.info("map-figure: wrote %s", ", ".join(map(str, written)))
    return written
