"""figure.py: which arms coincide, the step axis, the marks at a diverged or skipped run's end, and
the refusals, on curves made up in the test; then whole figures drawn from run folders (through the
aggregate stage): the saved files, axes, legend and styles."""

import dataclasses
import re

import matplotlib
import numpy as np
import pandas as pd
import pytest
from helpers import fake_metrics, make_config
from matplotlib.colors import to_hex

from acoustic_mlm import config as C
from acoustic_mlm.errors import UserError
from acoustic_mlm.report import aggregate, figure

plt = figure.plt  # pyplot on the Agg backend, as figure.py sets it

STEPS = [1, 2, 4, 8, 16]
FIG = C.FigureConfig(x_max=None, y_min=None, y_max=None, split="train", overlay_paper=False)  # limits fit the data


def _curve(label: str, loss, seed: int = 1, nonfinite: int = 0) -> pd.DataFrame:
    return pd.DataFrame(
        {"label": label, "seed": seed, "step": STEPS[: len(loss)], "loss_bits": loss, "nonfinite": nonfinite}
    )


def test_arms_within_two_hundredths_of_a_bit_at_every_step_coincide():
    base = np.array([10.0, 9.0, 8.0, 7.0, 6.0])
    data = pd.concat(
        [
            _curve("A", base),
            _curve("B", base + [0.0, 0.01, -0.015, 0.005, 0.0]),
            _curve("C", base + [0.0, 0.0, 0.0, 0.03, 0.0]),
        ]
    )  # C leaves the band once
    ((a, b, diff),) = figure.coinciding(data, ["A", "B", "C"])
    assert (a, b) == ("A", "B") and diff == pytest.approx(0.015)
    assert figure.coincidence_note(data, ["A", "B", "C"]) == "B coincides with\nA (within 0.02 bits)"
    assert figure.coincidence_note(data, ["A", "C"]) is None


def test_coincidence_compares_the_means_over_seeds():
    data = pd.concat(
        [_curve("A", [10.0, 9.0, 8.0], seed=1), _curve("A", [10.2, 9.2, 8.2], seed=2), _curve("B", [10.1, 9.1, 8.1])]
    )  # B is A's mean, not within 0.02 of either seed
    assert [(a, b) for a, b, _ in figure.coinciding(data, ["A", "B"])] == [("A", "B")]


def test_the_step_axis_is_logarithmic_in_thousands_and_padded_at_both_ends():
    fig, ax = plt.subplots()
    figure.log_step_axis(ax, 0.0, 50_000)  # a first step of 0 still gives a positive left limit
    assert ax.get_xscale() == "log"
    assert ax.get_xlim() == pytest.approx((1 / figure.X_PAD, 50_000 * figure.X_PAD))
    assert [figure.step_label(x) for x in (0.5, 20, 1500, 1e6)] == ["0.5", "20", "1.5K", "1000K"]
    plt.close(fig)


def test_a_diverged_seed_gets_an_x_at_its_last_finite_point():
    styles = {"A": figure.ROLE_STYLES["clip10"], "B": figure.ROLE_STYLES["clip1"]}
    selected = pd.concat(
        [
            _curve("A", [10.0, 9.0, 8.5, np.nan, np.inf]),
            _curve("B", [10.0, 9.0, 8.0, 7.0, 6.0]),
            _curve("B", [np.nan, np.nan], seed=2),
        ]
    )  # no finite point at all: nothing to mark
    fig, ax = plt.subplots()
    assert figure.mark_divergence(ax, selected, styles) == ["A"]
    (x_mark,) = ax.get_lines()
    assert x_mark.get_marker() == "X" and list(x_mark.get_xdata()) == [4] and list(x_mark.get_ydata()) == [8.5]
    assert [t.get_text() for t in ax.texts] == ["diverged (seed 1)"]
    plt.close(fig)


def test_a_completed_run_that_skipped_one_update_says_so_in_the_singular():
    styles = {"A": figure.ROLE_STYLES["clip10"], "B": figure.ROLE_STYLES["clip1"]}
    selected = pd.concat([_curve("A", [10.0, 9.0, 8.0], nonfinite=1), _curve("B", [10.0, 9.0, np.nan], nonfinite=2)])
    fig, ax = plt.subplots()
    assert figure.mark_nonfinite(ax, selected, styles) == ["A"]  # B diverged: mark_divergence marks it
    assert [t.get_text() for t in ax.texts] == ["1 non-finite update skipped (seed 1)"]
    assert figure.mark_nonfinite(ax, selected.drop(columns="nonfinite"), styles) == []
    plt.close(fig)


def test_more_arms_without_a_role_than_styles_are_refused_naming_the_arm():
    runs = {
        f"extra{i}": C.RunConfig(
            name=f"extra{i}", label=f"Extra {i}", norm="pre", attention="softmax", clip=1.0, seeds=(1,), role=None
        )
        for i in range(len(figure.EXTRA_STYLES) + 1)
    }
    with pytest.raises(UserError, match=r"runs\.extra6: the figure can style 6 arms without a role"):
        figure.arm_styles(runs)


def test_an_arm_without_rows_in_the_split_is_named(smoke_cfg):
    labels = [r["label"] for r in smoke_cfg["runs"].values()]
    rows = [
        {"run": name, "seed": 1, "step": s, "split": "train", "codebook": 0, "loss_bits": 10.0 - s / 10}
        for name in list(smoke_cfg["runs"])[:3]
        for s in STEPS
    ]
    with pytest.raises(UserError, match=re.escape(f"loss curves hold no train codebook-0 rows for: {labels[3]}")):
        figure.draw(pd.DataFrame(rows), C.from_mapping(smoke_cfg).runs, FIG)


def test_step_labels_write_thousands_as_k():
    assert [figure.step_label(x) for x in (1, 10, 100, 1000, 10_000, 100_000, 2500)] == [
        "1",
        "10",
        "100",
        "1K",
        "10K",
        "100K",
        "2.5K",
    ]


def test_figure_files_and_axes(runs_dir, tmp_path, smoke_cfg):
    curves_path = tmp_path / "curves.csv"
    aggregate.run(make_config(smoke_cfg), runs_dir, curves_path)
    written = figure.run(make_config(smoke_cfg), curves_path, tmp_path / "fig")
    assert [p.name for p in written] == [f"acoustic_mlm_loss_codebook0.{e}" for e in ("png", "pdf", "svg")]
    assert all(p.stat().st_size > 1000 for p in written)
    assert written[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    labels = [r["label"] for r in smoke_cfg["runs"].values()]
    fig, ax = figure.draw(
        pd.read_csv(curves_path),
        C.from_mapping(smoke_cfg).runs,
        dataclasses.replace(FIG, x_max=100_000, y_min=5.0, y_max=10.0),
    )
    assert ax.get_title() == "Acoustic MLM Loss on Codebook-0 vs Training Steps"
    assert ax.get_xlabel() == "Training Step" and ax.get_ylabel() == "Acoustic MLM Loss on Codebook-0"
    assert ax.get_xscale() == "log" and ax.get_yscale() == "linear"
    assert ax.get_xlim()[1] == pytest.approx(100_000 * figure.X_PAD) and ax.get_ylim() == (5.0, 10.0)
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == labels
    assert legend._loc in (1, "upper right")  # matplotlib stores 'upper right' as code 1
    lines = ax.get_lines()[: len(labels)]
    assert [to_hex(ln.get_color()) for ln in lines] == ["#1f77b4", "#ff7f0e", "#2ca02c", "#e377c2"]
    assert [ln.get_marker() for ln in lines] == ["o", "^", "^", "^"]
    # codebook 0 only: the first arm's line ends at its codebook-0 value
    y = lines[0].get_ydata()
    assert y[-1] == pytest.approx(6.0 + 4.0 * np.exp(-40 / 20))
    matplotlib.pyplot.close(fig)


def test_save_formats_writes_png_pdf_and_svg_with_the_png_at_its_dpi(tmp_path):
    """The one save of every figure stage (figure, stability, the stability map's figure)."""
    from PIL import Image

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([1, 2], [1, 2])
    written = figure.save_formats(fig, tmp_path / "out", "x", png_dpi=100)
    plt.close(fig)
    assert written == [tmp_path / "out" / f"x.{e}" for e in ("png", "pdf", "svg")] and all(p.is_file() for p in written)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["x.pdf", "x.png", "x.svg"]  # no temporary left
    assert Image.open(written[0]).size == (200, 100)


def test_several_seeds_draw_a_mean_with_a_band(tmp_path, smoke_cfg):
    for name in smoke_cfg["runs"]:
        smoke_cfg["runs"][name]["seeds"] = [1, 2]
    runs = tmp_path / "runs"
    for _i, name in enumerate(smoke_cfg["runs"]):
        d = runs / name
        d.mkdir(parents=True)
        both = pd.concat([fake_metrics([1, 2, 4, 8, 16, 32], end=6.0 + 0.2 * s).assign(seed=s) for s in (1, 2)])
        both.to_csv(d / "metrics.csv", index=False)
    curves = aggregate.run(make_config(smoke_cfg), runs, tmp_path / "c.csv")
    assert sorted(curves["seed"].unique()) == [1, 2]
    cfg = C.from_mapping(smoke_cfg)
    fig, ax = figure.draw(curves, cfg.runs, cfg.figure)
    bands = [c for c in ax.collections if isinstance(c, matplotlib.collections.PolyCollection)]
    assert len(bands) == 4  # one 95 % band per arm
    y = ax.get_lines()[0].get_ydata()
    per_seed = [e + (10.0 - e) * np.exp(-32 / 20) for e in (6.2, 6.4)]
    assert y[-1] == pytest.approx(np.mean(per_seed))  # the line is the mean over seeds
    matplotlib.pyplot.close(fig)


def test_coinciding_arms_stay_visible_and_no_marker_is_cut(tmp_path, smoke_cfg):
    """Attn. Relax equals Clip=1 in fp32: it is drawn dashed with hollow markers, the legend names
    the pair; the axes reach past the first and last points."""
    runs = tmp_path / "runs"
    steps = [1, 2, 4, 8, 16, 32, 64, 100]
    for i, name in enumerate(smoke_cfg["runs"]):
        (runs / name).mkdir(parents=True)
        end = 6.0 + 0.3 * i if i < 3 else 6.3  # the fourth arm repeats the second exactly
        fake_metrics(steps, end=end).to_csv(runs / name / "metrics.csv", index=False)
    curves = aggregate.run(make_config(smoke_cfg), runs, tmp_path / "c.csv")
    cfg = C.from_mapping(smoke_cfg)
    fig, ax = figure.draw(curves, cfg.runs, cfg.figure)
    lines = ax.get_lines()[:4]
    assert [ln.get_linestyle() for ln in lines] == ["-", "-", "-", "--"]
    assert [ln.get_markerfacecolor() for ln in lines][3] == "none"  # hollow: the marker under it shows
    labels = [r["label"] for r in smoke_cfg["runs"].values()]
    assert ax.get_legend().get_title().get_text() == f"{labels[3]} coincides with\n{labels[1]} (within 0.02 bits)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == labels
    lo, hi = ax.get_xlim()
    assert lo < 1 and hi > 100  # the first and last markers are inside the axes
    matplotlib.pyplot.close(fig)


def test_arms_are_styled_by_role_not_position(smoke_cfg):
    runs = dict(reversed(list(C.from_mapping(smoke_cfg).runs.items())))  # the arms in the opposite order
    runs["extra"] = dataclasses.replace(runs["prenorm_clip10"], name="extra", label="extra arm", role=None)
    styles = figure.arm_styles(runs)
    assert to_hex(styles["Pre-Norm | Gradient Clip=10 | Run 1"].color) == "#1f77b4"
    assert styles["Pre-Norm | Gradient Clip=10 | Run 1"].marker == "o"
    assert to_hex(styles["Pre-Norm | Attn. Relax | Gradient Clip=1"].color) == "#e377c2"
    assert to_hex(styles["extra arm"].color) == "#d62728" and styles["extra arm"].marker == "s"


def test_a_run_that_skipped_non_finite_updates_says_so_in_the_figure(tmp_path, smoke_cfg):
    runs = tmp_path / "runs"
    for i, name in enumerate(smoke_cfg["runs"]):
        (runs / name).mkdir(parents=True)
        m = fake_metrics([1, 2, 4, 8, 16, 32], end=6.0 + 0.2 * i)
        m["nonfinite"] = [0, 0, 1, 1, 3, 3] if name == "prenorm_clip1" else 0
        m.to_csv(runs / name / "metrics.csv", index=False)
    curves = aggregate.run(make_config(smoke_cfg), runs, tmp_path / "c.csv")
    assert curves.loc[curves["run"] == "prenorm_clip1", "nonfinite"].max() == 3
    cfg = C.from_mapping(smoke_cfg)
    fig, ax = figure.draw(curves, cfg.runs, cfg.figure)
    assert [t.get_text() for t in ax.texts] == ["3 non-finite updates skipped (seed 1)"]
    matplotlib.pyplot.close(fig)


def test_no_curve_runs_under_the_legend(tmp_path, smoke_cfg):
    """Curves still near their start at the right end of the log axis (the default run's shape)
    passed under the top-right legend; now the y axis rises until they clear it."""
    steps = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    rows = []
    for i, (name, run) in enumerate(smoke_cfg["runs"].items()):
        for s in steps:
            loss = 10.3 - 0.1 * i if s < 300 else 10.3 - 0.8 * np.log2(s / 256) - 0.2 * i  # flat, then falling
            rows.append(
                {
                    "run": name,
                    "label": run["label"],
                    "seed": 1,
                    "step": s,
                    "split": "train",
                    "codebook": 0,
                    "loss_bits": loss,
                    "nonfinite": 0,
                }
            )
    curves = pd.DataFrame(rows)
    fig, ax = figure.draw(curves, C.from_mapping(smoke_cfg).runs, FIG)
    fig.canvas.draw()
    box = ax.get_legend().get_window_extent()
    lines = ax.get_lines()[: len(smoke_cfg["runs"])]
    for line in lines:
        xy = ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
        under = (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0)
        assert not under.any(), (line.get_label(), xy[under])
    assert ax.get_ylim()[1] > 10.3  # raised above the curves' start
    # a y_max in the config is kept as it is
    _, fixed = figure.draw(curves, C.from_mapping(smoke_cfg).runs, dataclasses.replace(FIG, y_max=10.5))
    assert fixed.get_ylim()[1] == 10.5
