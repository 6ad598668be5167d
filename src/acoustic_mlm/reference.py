"""The paper's curves, digitised from a description of its figure, and the comparison chart.

`data/reference/paper_curves.csv` (run, label, step, loss_bits, note) holds about 15 points
per arm read from the description of MERT's figure: stated values to about 0.1 bits, the
rest interpolated (see data/reference/README.md). This module loads them, draws them dashed
onto an axis (`overlay`) and draws the side-by-side chart `paper_vs_reproduction.png`:
left the paper's curves, right the reproduction, same colours and markers as the figure.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from .figure import TITLE, XLABEL, YLABEL, arm_styles, step_label  # noqa: E402
from .utils import atomic_path, log  # noqa: E402

# The repository's copy: src/acoustic_mlm/reference.py -> <repo>/data/reference/paper_curves.csv
REFERENCE_PATH = Path(__file__).resolve().parents[2] / "data" / "reference" / "paper_curves.csv"
COLUMNS = ["run", "label", "step", "loss_bits", "note"]
SIDE_BY_SIDE = "paper_vs_reproduction.png"
PAPER_LEGEND = "Paper (digitised), dashed"


def load_reference(path: str | Path | None = None) -> pd.DataFrame:
    """The digitised paper curves, sorted by run (file order) and step."""
    path = Path(path) if path is not None else REFERENCE_PATH
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the paper's digitised curves are not found; they ship in the repository "
            "(data/reference/paper_curves.csv), so run from a checkout or pass the path"
        )
    ref = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in ref.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (need {', '.join(COLUMNS)})")
    order = {run: i for i, run in enumerate(dict.fromkeys(ref["run"]))}
    return ref.sort_values(["run", "step"], key=lambda c: c.map(order) if c.name == "run" else c,
                           kind="stable").reset_index(drop=True)


def as_curves(reference: pd.DataFrame) -> pd.DataFrame:
    """The reference in loss_curves.csv's tidy shape (train split, codebook 0, seed 0)."""
    return reference.assign(seed=0, split="train", codebook=0)[
        ["run", "label", "seed", "step", "split", "codebook", "loss_bits"]]


def _arm_rows(reference: pd.DataFrame, labels: list[str], runs: list[str] | None):
    """(index, label, rows) for each arm the reference holds, matched by run name or label."""
    for i, label in enumerate(labels):
        key, col = (runs[i], "run") if runs is not None else (label, "label")
        rows = reference[reference[col] == key].sort_values("step")
        if len(rows):
            yield i, label, rows


def overlay(ax, reference: pd.DataFrame, labels: list[str], runs: list[str] | None = None,
            legend: bool = True) -> list[Line2D]:
    """Draw the paper's curves dashed onto `ax`, in the colours and markers of `labels`' arms.

    Arms are matched by label, or by run name when `runs` (parallel to `labels`) is given.
    The lines stay out of the legend; with `legend`, an existing legend gains one entry
    saying that dashed lines are the paper's. Returns the lines drawn.
    """
    palette, markers = arm_styles(labels)
    lines = []
    for _, label, rows in _arm_rows(reference, labels, runs):
        (line,) = ax.plot(rows["step"], rows["loss_bits"], linestyle="--", linewidth=1.2,
                          color=palette[label], marker=markers[label], markersize=5,
                          markerfacecolor="none", label=f"_paper {label}")  # "_": not in the legend
        lines.append(line)
    if legend and ax.get_legend() is not None:
        handles, texts = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], color="0.35", linestyle="--", linewidth=1.2))
        texts.append(PAPER_LEGEND)
        ax.legend(handles, texts, loc="upper right", title=None, frameon=True)
    return lines


def _log_step_axis(ax) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(FuncFormatter(step_label))
    ax.xaxis.set_minor_formatter(NullFormatter())


def side_by_side(curves: pd.DataFrame, reference: pd.DataFrame, labels: list[str], fig_cfg: dict,
                 runs: list[str] | None = None, codebook: int = 0):
    """Left: the paper's curves (dashed); right: the reproduction. Returns (fig, (ax_paper, ax_repro))."""
    split = fig_cfg.get("split", "train")
    data = curves[(curves["split"] == split) & (curves["codebook"] == codebook)].dropna(subset=["loss_bits"])
    if runs is not None:  # label the reproduction by the config's labels, whatever the CSV says
        data = data[data["run"].isin(runs)].assign(label=lambda d: d["run"].map(dict(zip(runs, labels))))
    present = [lab for lab in labels if lab in set(data["label"])]
    if not present:
        raise ValueError(f"loss curves hold no {split} codebook-{codebook} rows for any arm")
    palette, markers = arm_styles(labels)
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.0)
    fig, (ax_p, ax_r) = plt.subplots(1, 2, figsize=(12.0, 5.4), sharey=True)

    overlay(ax_p, reference, labels, runs, legend=False)
    ax_p.set_title("Paper (digitised from the figure's description)")
    sns.lineplot(data=data, x="step", y="loss_bits", hue="label", hue_order=present, style="label",
                 style_order=present, palette=palette, markers=markers, dashes=False,
                 errorbar=("ci", 95), linewidth=1.4, markersize=5, markevery=0.08, ax=ax_r)
    ax_r.set_title(f"Reproduction ({split})")

    for ax, d in ((ax_p, reference), (ax_r, data)):
        _log_step_axis(ax)
        ax.set_xlim(max(1.0, float(d["step"].min())), float(d["step"].max()))
        ax.set_xlabel(XLABEL)
    if fig_cfg.get("x_max"):
        ax_r.set_xlim(right=fig_cfg["x_max"])
    ax_p.set_ylabel(YLABEL)
    ax_r.set_ylabel("")
    y_min, y_max = fig_cfg.get("y_min"), fig_cfg.get("y_max")
    if y_min is not None or y_max is not None:
        ax_p.set_ylim(y_min, y_max)
    # one legend for both panels, below them: the arms (dashed on the left, solid on the right)
    ax_r.get_legend().remove()
    handles = [Line2D([], [], color=palette[lab], marker=markers[lab], linewidth=1.4, markersize=5)
               for lab in labels]
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 2), title=None, frameon=True)
    fig.suptitle(TITLE)
    fig.tight_layout(rect=(0, 0.06 * ((len(labels) + 1) // 2), 1, 1))
    return fig, (ax_p, ax_r)


def draw_side_by_side(curves: pd.DataFrame, reference: pd.DataFrame, labels: list[str], fig_cfg: dict,
                      out_path, runs: list[str] | None = None) -> Path:
    """Write the side-by-side chart (PNG, 200 dpi) atomically to `out_path`."""
    fig, _ = side_by_side(curves, reference, labels, fig_cfg, runs)
    out_path = Path(out_path)
    with atomic_path(out_path) as tmp:
        fig.savefig(tmp, format="png", dpi=200)
    plt.close(fig)
    log.info("reference: wrote %s", out_path)
    return out_path


def run(cfg: dict, curves_path, out_path, reference_path=None) -> Path:
    """CLI entry: `results/loss_curves.csv` + the reference -> `results/figures/paper_vs_reproduction.png`."""
    curves_path = Path(curves_path)
    if not curves_path.is_file():
        raise FileNotFoundError(f"{curves_path}: loss curves not found; run the aggregate stage first")
    runs = list(cfg["runs"])
    labels = [cfg["runs"][r]["label"] for r in runs]
    return draw_side_by_side(pd.read_csv(curves_path), load_reference(reference_path), labels,
                             cfg["figure"], out_path, runs=runs)
