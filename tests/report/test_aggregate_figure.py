"""Aggregation to tidy curves and the figure, on metrics made up in the test."""

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from acoustic_mlm.report import aggregate
from acoustic_mlm.report import figure
from acoustic_mlm.errors import UserError


def fake_metrics(steps, start=10.0, end=6.0, k=2):
    s = np.asarray(steps, dtype=float)
    curve = end + (start - end) * np.exp(-s / 20)
    row = {"step": steps}
    for cb in range(k):
        row[f"train_loss_cb{cb}"] = curve + cb
        row[f"valid_loss_cb{cb}"] = curve + cb + 0.1
    row["lr"] = 1e-3
    return pd.DataFrame(row)


@pytest.fixture()
def runs_dir(tmp_path, smoke_cfg):
    for i, name in enumerate(smoke_cfg["runs"]):
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        fake_metrics([1, 2, 4, 8, 16, 20, 32, 40], end=6.0 - 0.1 * i).to_csv(d / "metrics.csv", index=False)
    return tmp_path / "runs"


def test_aggregate_writes_one_row_per_run_step_split_and_codebook(runs_dir, tmp_path, smoke_cfg):
    out = tmp_path / "curves.csv"
    curves = aggregate.run(smoke_cfg, runs_dir, out)
    on_disk = pd.read_csv(out)
    assert list(on_disk.columns) == ["run", "label", "seed", "step", "split", "codebook", "loss_bits", "nonfinite"]
    assert len(on_disk) == 4 * 8 * 2 * 2  # runs x steps x splits x codebooks
    assert list(dict.fromkeys(on_disk["run"])) == list(smoke_cfg["runs"])  # config order
    row = on_disk[(on_disk.run == "prenorm_clip1") & (on_disk.step == 1) & (on_disk.split == "valid") & (on_disk.codebook == 1)]
    expected = 6.0 - 0.1 + (10.0 - 5.9) * np.exp(-1 / 20) + 1 + 0.1
    assert row["loss_bits"].item() == pytest.approx(expected)
    assert row["label"].item() == "Pre-Norm | Gradient Clip=1 | Run 2"
    assert len(curves) == len(on_disk)


def test_final_losses_by_role_for_dvc_exp_show(runs_dir, tmp_path, smoke_cfg):
    import json

    from acoustic_mlm import curves

    smoke_cfg["runs"]["prenorm_attnrelax_clip1"].pop("role")  # no role: keyed by its run name
    aggregate.run(smoke_cfg, runs_dir, tmp_path / "c.csv", finals_path=tmp_path / "finals.json")
    finals = json.loads((tmp_path / "finals.json").read_text())
    assert set(finals) == {"clip10", "clip1", "deepnorm", "prenorm_attnrelax_clip1"}
    steps = [1, 2, 4, 8, 16, 20, 32, 40]
    want = curves.final_loss(steps, fake_metrics(steps, end=6.0 - 0.1)["train_loss_cb0"])  # prenorm_clip1
    assert finals["clip1"] == pytest.approx(want, abs=1e-4)
    assert finals["clip10"] > finals["clip1"] > finals["deepnorm"]


def test_aggregate_missing_run_names_the_file(runs_dir, tmp_path, smoke_cfg):
    (runs_dir / "prenorm_clip1" / "metrics.csv").unlink()
    with pytest.raises(UserError, match=r"prenorm_clip1/metrics.csv"):
        aggregate.run(smoke_cfg, runs_dir, tmp_path / "c.csv")
    assert not (tmp_path / "c.csv").exists()


def test_step_labels_write_thousands_as_k():
    assert [figure.step_label(x) for x in (1, 10, 100, 1000, 10_000, 100_000, 2500)] == [
        "1", "10", "100", "1K", "10K", "100K", "2.5K"]


def test_figure_files_and_axes(runs_dir, tmp_path, smoke_cfg):
    curves_path = tmp_path / "curves.csv"
    aggregate.run(smoke_cfg, runs_dir, curves_path)
    written = figure.run(smoke_cfg, curves_path, tmp_path / "fig")
    assert [p.name for p in written] == [f"acoustic_mlm_loss_codebook0.{e}" for e in ("png", "pdf", "svg")]
    assert all(p.stat().st_size > 1000 for p in written)
    assert written[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    labels = [r["label"] for r in smoke_cfg["runs"].values()]
    fig, ax = figure.draw(pd.read_csv(curves_path), smoke_cfg["runs"], {"x_max": 100_000, "y_min": 5.0, "y_max": 10.0, "split": "train"})
    assert ax.get_title() == "Acoustic MLM Loss on Codebook-0 vs Training Steps"
    assert ax.get_xlabel() == "Training Step" and ax.get_ylabel() == "Acoustic MLM Loss on Codebook-0"
    assert ax.get_xscale() == "log" and ax.get_yscale() == "linear"
    assert ax.get_xlim()[1] == pytest.approx(100_000 * figure.X_PAD) and ax.get_ylim() == (5.0, 10.0)
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == labels
    assert legend._loc in (1, "upper right")  # matplotlib stores 'upper right' as code 1
    lines = ax.get_lines()[: len(labels)]
    assert [to_hex(l.get_color()) for l in lines] == ["#1f77b4", "#ff7f0e", "#2ca02c", "#e377c2"]
    assert [l.get_marker() for l in lines] == ["o", "^", "^", "^"]
    # codebook 0 only: the first arm's line ends at its codebook-0 value
    y = lines[0].get_ydata()
    assert y[-1] == pytest.approx(6.0 + 4.0 * np.exp(-40 / 20))
    matplotlib.pyplot.close(fig)


def test_several_seeds_draw_a_mean_with_a_band(tmp_path, smoke_cfg):
    for name in smoke_cfg["runs"]:
        smoke_cfg["runs"][name]["seeds"] = [1, 2]
    runs = tmp_path / "runs"
    for i, name in enumerate(smoke_cfg["runs"]):
        d = runs / name
        d.mkdir(parents=True)
        both = pd.concat([fake_metrics([1, 2, 4, 8, 16, 32], end=6.0 + 0.2 * s).assign(seed=s) for s in (1, 2)])
        both.to_csv(d / "metrics.csv", index=False)
    curves = aggregate.run(smoke_cfg, runs, tmp_path / "c.csv")
    assert sorted(curves["seed"].unique()) == [1, 2]
    fig, ax = figure.draw(curves, smoke_cfg["runs"], smoke_cfg["figure"])
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
    curves = aggregate.run(smoke_cfg, runs, tmp_path / "c.csv")
    fig, ax = figure.draw(curves, smoke_cfg["runs"], smoke_cfg["figure"])
    lines = ax.get_lines()[:4]
    assert [l.get_linestyle() for l in lines] == ["-", "-", "-", "--"]
    assert [l.get_markerfacecolor() for l in lines][3] == "none"  # hollow: the marker under it shows
    labels = [r["label"] for r in smoke_cfg["runs"].values()]
    assert ax.get_legend().get_title().get_text() == f"{labels[3]} coincides with\n{labels[1]} (within 0.02 bits)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == labels
    lo, hi = ax.get_xlim()
    assert lo < 1 and hi > 100  # the first and last markers are inside the axes
    matplotlib.pyplot.close(fig)


def test_arms_are_styled_by_role_not_position(smoke_cfg):
    runs = dict(reversed(list(smoke_cfg["runs"].items())))  # the arms in the opposite order
    runs["extra"] = {**runs["prenorm_clip10"], "label": "extra arm", "role": None}
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
    curves = aggregate.run(smoke_cfg, runs, tmp_path / "c.csv")
    assert curves.loc[curves["run"] == "prenorm_clip1", "nonfinite"].max() == 3
    fig, ax = figure.draw(curves, smoke_cfg["runs"], smoke_cfg["figure"])
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
            rows.append({"run": name, "label": run["label"], "seed": 1, "step": s, "split": "train",
                         "codebook": 0, "loss_bits": loss, "nonfinite": 0})
    curves = pd.DataFrame(rows)
    fig, ax = figure.draw(curves, smoke_cfg["runs"], {"split": "train"})
    fig.canvas.draw()
    box = ax.get_legend().get_window_extent()
    lines = ax.get_lines()[: len(smoke_cfg["runs"])]
    for line in lines:
        xy = ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
        under = (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0)
        assert not under.any(), (line.get_label(), xy[under])
    assert ax.get_ylim()[1] > 10.3  # raised above the curves' start
    # a y_max in the config is kept as it is
    _, fixed = figure.draw(curves, smoke_cfg["runs"], {"split": "train", "y_max": 10.5})
    assert fixed.get_ylim()[1] == 10.5
