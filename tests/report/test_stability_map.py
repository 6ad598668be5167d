"""The stability map: the LR-sensitivity formula, per-arm statistics and the verdict rules
(docs/stability.md), on hand-made tables."""

import math

import numpy as np
import pandas as pd
import pytest
from helpers import make_config

from acoustic_mlm import config as C
from acoustic_mlm.report import stability_map as M


def test_lr_sensitivity_caps_diverged_and_risen_runs_at_their_initial_loss():
    # rates:          1e-3  3e-3  1e-2 (diverged)  3e-2 (above its initial loss)
    finals = [7.0, 6.0, math.nan, 11.0]
    initials = [10.0, 10.0, 10.2, 10.4]
    # capped: 7, 6, 10.2 (diverged: L0), 10.4 (min(L, L0)); L* = 6; mean of 1, 0, 4.2, 4.4 = 2.4
    assert M.lr_sensitivity(finals, initials) == pytest.approx(2.4)
    assert M.capped_loss(math.nan, 10.2) == 10.2 and M.capped_loss(11.0, 10.4) == 10.4
    assert M.lr_sensitivity([6.0], [10.0]) == 0.0
    assert math.isnan(M.lr_sensitivity([], []))


def test_spread_and_the_relax_reach():
    assert M.spread([1.0, 1.5, 1.2], "range") == pytest.approx(0.5)
    assert M.spread([1.0, 2.0], "2std") == pytest.approx(2 * np.std([1.0, 2.0], ddof=1))
    assert M.spread([1.0], "range") == 0.0
    assert M.relax_reach(32.0) == pytest.approx(2047.0)


def _rows(arm, role, losses, layers=16, precision="fp32", seed=1, diverged=(), flat=True, logit=100.0):
    rows = []
    for lr, loss in losses.items():
        bad = lr in diverged
        final = math.nan if bad else loss
        rows.append(
            {
                "run": f"{arm}__lr-{lr}__layers-{layers}",
                "arm": arm,
                "role": role,
                "lr": lr,
                "layers": layers,
                "precision": precision,
                "seed": seed,
                "status": "diverged" if bad else "completed",
                "diverged_at_step": 10 if bad else None,
                "steps": 100,
                "first_train_loss_cb0": 10.0,
                "final_train_loss_cb0": final,
                "final_valid_loss_cb0": final,
                "capped_loss": M.capped_loss(final, 10.0),
                "flattened": flat and not bad,
                "late_change_share": 0.01 if flat else 0.3,
                "max_grad_norm": 3.0,
                "attn_logit_max": logit,
                "attn_logit_fp16_frac": logit / M.FP16_MAX,
                "clipped_frac": 0.5,
                "overflow_skips": 0,
                "nonfinite_steps": 0,
                "wall_time_s": 1.0,
            }
        )
    return rows


RATES = (1e-3, 3e-3, 1e-2, 3e-2)


def _map(clip1, clip10, seeds=(1, 2), jitter=0.01, **kw) -> pd.DataFrame:
    rows = []
    for s in seeds:
        rows += _rows("prenorm_clip1", "clip1", {r: v + jitter * s for r, v in zip(RATES, clip1)}, seed=s, **kw)
        rows += _rows(
            "prenorm_clip10",
            "clip10",
            {r: v + jitter * s for r, v in zip(RATES, clip10)},
            seed=s,
            diverged=(3e-2,),
            **kw,
        )
    return pd.DataFrame(rows)


def test_arm_statistics_best_and_largest_stable_rate_and_sensitivity():
    stats = M.arm_stats(_map([7.0, 6.0, 6.5, 7.5], [6.8, 6.1, 8.0, 0.0]))
    c1 = stats[stats["role"] == "clip1"].iloc[0]
    assert c1["best_lr"] == 3e-3 and c1["largest_stable_lr"] == 3e-2 and c1["seeds"] == 2
    assert c1["sensitivity"] == pytest.approx(np.mean([1.0, 0.0, 0.5, 1.5]))
    c10 = stats[stats["role"] == "clip10"].iloc[0]
    assert c10["largest_stable_lr"] == 1e-2 and c10["diverged_runs"] == 2  # 3e-2 diverged with both seeds
    # diverged at L0 = 10 (no seed jitter there): seed 1 [0.7, 0, 1.9, 3.89], seed 2 [0.7, 0, 1.9, 3.88]
    assert c10["sensitivity"] == pytest.approx(np.mean([1.6225, 1.62]))
    assert c10["sensitivity_spread"] == pytest.approx(0.0025)


def test_a_second_seed_at_some_rates_gives_the_spread_of_one_point():
    rows = _rows("a", "clip1", dict(zip(RATES, [7.0, 6.0, 6.5, 7.5])), seed=1)
    rows += _rows("a", "clip1", {3e-3: 6.3, 1e-2: 6.6}, seed=2)  # seed 2 at the two middle rates only
    st = M.arm_stats(pd.DataFrame(rows)).iloc[0]
    assert st["sensitivity"] == pytest.approx(0.75)  # seed 1 alone ran every rate
    assert st["sensitivity_spread"] == pytest.approx(0.3)  # the larger seed range at one rate: 6.0 vs 6.3
    assert st["best_lr"] == 3e-3 and st["best_seeds"] == 2 and st["best_loss"] == pytest.approx(6.15)


def test_panels_separate_every_swept_setting_but_the_rate():
    a = pd.DataFrame(_rows("a", "clip1", {1e-3: 7.0, 3e-3: 6.0}, precision="fp16"))
    b = a.assign(capped_loss=a["capped_loss"] + 1)
    t = pd.concat([a.assign(**{"model.feature_grad_mult": 0.0}), b.assign(**{"model.feature_grad_mult": 1.0})])
    ps = M.panels(t)
    assert [p["label"] for p in ps] == ["16 layers, fp16, feature_grad_mult=0", "16 layers, fp16, feature_grad_mult=1"]
    assert list(M.arm_stats(t)["best_loss"]) == [6.0, 7.0]


def test_clipping_verdict_comes_out_each_way():
    supported = M.verdict_clipping(M.arm_stats(_map([7.0, 6.0, 6.5, 7.5], [6.8, 6.1, 8.0, 0.0])), 0.02)
    assert supported["verdict"] == M.SUPPORTED
    # clip 1 far more sensitive than clip 10 (which does not diverge at the top here)
    t = _map([9.0, 6.0, 9.5, 9.9], [6.2, 6.1, 6.3, 0.0])
    assert M.verdict_clipping(M.arm_stats(t), 0.02)["verdict"] == M.NOT_SUPPORTED
    # a difference within the seed spread is a tie
    t = _map([7.0, 6.0, 6.5, 7.5], [7.0, 6.0, 6.6, 0.0], jitter=0.0)
    t.loc[(t["seed"] == 2) & (t["arm"] == "prenorm_clip1"), "capped_loss"] += 0.0
    assert (
        M.verdict_clipping(M.arm_stats(_map([6.9, 6.0, 6.5, 7.4], [7.0, 6.0, 6.5, 0.0], jitter=0.0)), 2.0)["verdict"]
        == M.INCONCLUSIVE
    )
    # best-rate runs that have not flattened decide nothing
    unflat = M.verdict_clipping(M.arm_stats(_map([7.0, 6.0, 6.5, 7.5], [6.8, 6.1, 8.0, 0.0], flat=False)), 0.02)
    assert unflat["verdict"] == M.INCONCLUSIVE and "not flattened" in unflat["notes"][0]


def test_deepnorm_needs_a_control_and_depth():
    rows = _rows("deep", "deepnorm", {r: v for r, v in zip(RATES, [6.5, 6.0, 6.2, 6.4])})
    rows += _rows("post", None, {r: v for r, v in zip(RATES, [9.4, 9.4, 9.5, 0.0])}, diverged=(3e-2,))
    stats = M.arm_stats(pd.DataFrame(rows))
    # Post-Norm stuck on the plateau at every rate is *insensitive* (0.175 against DeepNorm's 0.275): the
    # sensitivity cannot say it failed; the mean capped loss over the rates, 6.275 against 9.575, does
    assert M.verdict_deepnorm(stats, 0.02, "post")["verdict"] == M.SUPPORTED
    assert M.verdict_deepnorm(stats, 0.02, None)["verdict"] == M.INCONCLUSIVE
    shallow = M.arm_stats(pd.DataFrame([dict(r, layers=4) for r in rows]))
    assert M.verdict_deepnorm(shallow, 0.02, "post")["verdict"] == M.INCONCLUSIVE
    # equal within the resolution: inconclusive
    tie = _rows("deep", "deepnorm", {r: v for r, v in zip(RATES, [6.1, 6.0, 6.1, 6.2])})
    tie += _rows("post", None, {r: v for r, v in zip(RATES, [6.1, 6.0, 6.1, 6.21])})
    assert M.verdict_deepnorm(M.arm_stats(pd.DataFrame(tie)), 0.02, "post")["verdict"] == M.INCONCLUSIVE
    # DeepNorm worse on both: not supported
    worse = _rows("deep", "deepnorm", {r: v for r, v in zip(RATES, [9.0, 6.0, 0.0, 0.0])}, diverged=(1e-2, 3e-2))
    worse += _rows("post", None, {r: v for r, v in zip(RATES, [6.1, 6.0, 6.1, 6.2])})
    assert M.verdict_deepnorm(M.arm_stats(pd.DataFrame(worse)), 0.02, "post")["verdict"] == M.NOT_SUPPORTED


def test_pb_relax_is_judged_only_where_logits_reach_the_limit():
    relax = _rows(
        "relax",
        "attn_relax",
        {r: v for r, v in zip(RATES, [7.0, 6.0, 6.1, 6.2])},
        precision="fp16_fairseq",
        logit=3000.0,
    )
    low = _rows(
        "c1",
        "clip1",
        {r: v for r, v in zip(RATES, [7.0, 6.0, 6.1, 0.0])},
        precision="fp16_fairseq",
        diverged=(3e-2,),
        logit=500.0,
    )
    v = M.verdict_pb_relax(M.arm_stats(pd.DataFrame(relax + low)), 0.02, 2047.0)
    assert v["verdict"] == M.INCONCLUSIVE and "below" in v["notes"][0]
    high = [dict(r, attn_logit_max=5000.0) for r in low]
    assert M.verdict_pb_relax(M.arm_stats(pd.DataFrame(relax + high)), 0.02, 2047.0)["verdict"] == M.SUPPORTED
    same = [dict(r, attn_logit_max=5000.0, arm="c1", role="clip1") for r in relax]
    assert M.verdict_pb_relax(M.arm_stats(pd.DataFrame(relax + same)), 0.02, 2047.0)["verdict"] == M.NOT_SUPPORTED


def test_read_map_refuses_a_damaged_table(tmp_path):
    path = tmp_path / "stability_map.csv"
    pd.DataFrame(_rows("a", "clip1", {1e-3: 7.0})).drop(columns=["capped_loss"]).to_csv(path, index=False)
    with pytest.raises(M.UserError, match="missing column.*capped_loss.*map stage"):
        M.read_map(path)
    with pytest.raises(M.UserError, match="none.csv"):
        M.read_map(tmp_path / "none.csv")
    good = pd.DataFrame(_rows("a", "clip1", {1e-3: 7.0, 3e-3: 6.0}) + _rows("b", None, {1e-3: 7.5}))
    good.to_csv(path, index=False)
    back = M.read_map(path)
    assert back["flattened"].dtype == bool and back["role"].isna().sum() == 1 and back["lr"].dtype == float
    path.write_text(path.read_text()[:-20])  # cut in the middle of the last row
    with pytest.raises(M.UserError, match="cut short"):
        M.read_map(path)


def _trained_points(cfg, runs_dir, edit=None):
    """Each point's seed summaries as training writes them (its fingerprint), `edit` applied to one."""
    import json

    from acoustic_mlm.train.state import fingerprint

    cfg = make_config(cfg)
    for name, p in cfg.points.items():
        for seed in p.seeds:
            fp = fingerprint(cfg.point(name), name, 1)
            if edit is not None:
                edit(name, seed, fp["settings"])
            path = runs_dir / name / "seeds" / f"seed{seed}" / "summary.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps(
                    {
                        "status": "completed",
                        "final_train_loss_cb0": 7.0,
                        "final_valid_loss_cb0": 7.0,
                        "nonfinite_steps": 0,
                        "fingerprint": fp,
                    }
                )
            )


@pytest.fixture()
def map_cfg(smoke_cfg):
    import copy

    cfg = copy.deepcopy(smoke_cfg)
    cfg["sweep"] = [
        {"grid": {"train.lr": [0.001, 0.003], "model.layers": [2]}, "arms": ["prenorm_clip1"]},
        {"grid": {"train.lr": [0.01], "seeds": [1, 2]}, "arms": ["prenorm_clip10"]},
    ]
    return cfg


def test_runs_trained_as_their_points_pass_the_check(map_cfg, tmp_path):
    cfg = C.from_mapping(map_cfg)
    _trained_points(cfg, tmp_path)
    for name, p in cfg.points.items():
        M.check_trained_as_point(cfg, tmp_path / name, name, p.seeds)


def _finished_runs(cfg, runs_dir):
    """Every point trained: its seeds' summaries (_trained_points), its metrics.csv and its summary.json
    as training writes them (the settings it was trained with under `settings`)."""
    import json

    from acoustic_mlm.train.state import fingerprint

    cfg = make_config(cfg)
    _trained_points(cfg, runs_dir)
    for name, p in cfg.points.items():
        seed_summary = {
            "status": "completed",
            "steps": 4,
            "diverged_at_step": None,
            "first_train_loss_cb0": 10.0,
            "final_train_loss_cb0": 7.0,
            "final_valid_loss_cb0": 7.5,
            "max_grad_norm": 3.0,
            "clipped_frac": 0.5,
            "overflow_skips": 0,
            "nonfinite_steps": 0,
            "wall_time_s": 1.0,
        }
        (runs_dir / name / "summary.json").write_text(
            json.dumps(
                {
                    "run": name,
                    "per_seed": {str(seed): seed_summary for seed in p.seeds},
                    "settings": fingerprint(cfg.point(name), name, 1)["settings"],
                }
            )
        )
        rows = [
            {"seed": seed, "step": step, "train_loss_cb0": 10.0 - step / 2} for seed in p.seeds for step in (1, 2, 4)
        ]
        pd.DataFrame(rows).to_csv(runs_dir / name / "metrics.csv", index=False)


def test_the_table_reads_what_each_run_was_from_its_summary(map_cfg, tmp_path):
    import json

    _finished_runs(map_cfg, tmp_path)
    t = M.table(make_config(map_cfg), tmp_path)
    assert t["run"].tolist() == [
        "prenorm_clip1__lr-1e-3__layers-2",
        "prenorm_clip1__lr-3e-3__layers-2",
        "prenorm_clip10__lr-1e-2",
        "prenorm_clip10__lr-1e-2",
    ]
    assert t["lr"].tolist() == [0.001, 0.003, 0.01, 0.01] and t["seed"].tolist() == [1, 1, 1, 2]
    assert t["layers"].tolist() == [2, 2, 2, 2] and (t["precision"] == "fp32").all()  # unswept: the preset's
    assert t["role"].tolist() == ["clip1", "clip1", "clip10", "clip10"]
    # the run's own record is read, not the configuration: a summary without it is refused by name
    summary = tmp_path / "prenorm_clip10__lr-1e-2" / "summary.json"
    old = json.loads(summary.read_text())
    summary.write_text(json.dumps({k: v for k, v in old.items() if k != "settings"}))
    with pytest.raises(M.UserError) as err:
        M.table(make_config(map_cfg), tmp_path)
    assert str(err.value) == (
        f"{summary}: no 'settings' (written by an older version); rerun the train stage for prenorm_clip10__lr-1e-2"
    )
    summary.write_text(json.dumps({**old, "settings": {k: v for k, v in old["settings"].items() if k != "train.lr"}}))
    with pytest.raises(M.UserError, match="'settings' lacks train.lr; rerun the train stage for prenorm_clip10"):
        M.table(make_config(map_cfg), tmp_path)


@pytest.mark.parametrize(
    "run, seed, key, value, words",
    [
        (
            "prenorm_clip1__lr-3e-3__layers-2",
            1,
            "train.lr",
            0.001,
            "was trained with train.lr 0.001, but its sweep point sets 0.003",
        ),
        (
            "prenorm_clip1__lr-1e-3__layers-2",
            1,
            "model.layers",
            4,
            "was trained with model.layers 4, but its sweep point sets 2",
        ),
        (
            "prenorm_clip10__lr-1e-2",
            2,
            "runs.prenorm_clip10__lr-1e-2.clip",
            1.0,
            "was trained with runs.prenorm_clip10__lr-1e-2.clip 1.0",
        ),
        (
            "prenorm_clip10__lr-1e-2",
            1,
            "train.precision",
            "fp16",
            "was trained with train.precision 'fp16', but its sweep point sets 'fp32'",
        ),
    ],
)
def test_amlm_map_refuses_a_run_trained_with_other_settings_than_its_point(
    map_cfg, tmp_path, capsys, run, seed, key, value, words
):
    import yaml

    from acoustic_mlm import cli

    def edit(name, s, settings):
        if (name, s) == (run, seed):
            assert key in settings, sorted(settings)
            settings[key] = value

    _trained_points(map_cfg, tmp_path / "runs", edit)
    with pytest.raises(M.UserError) as err:
        M.table(make_config(map_cfg), tmp_path / "runs")
    summary = tmp_path / "runs" / run / "seeds" / f"seed{seed}" / "summary.json"
    assert str(err.value).startswith(f"{summary}: run {run} {words}"), str(err.value)
    assert f"rerun the train stage for {run}" in str(err.value)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(map_cfg, sort_keys=False))
    capsys.readouterr()
    assert (
        cli.main(
            ["map", "--config", str(path), "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "map.csv")]
        )
        == 2
    )
    err_line = capsys.readouterr().err.strip()
    assert "\n" not in err_line and f"run {run} was trained with {key}" in err_line
    assert not (tmp_path / "map.csv").exists()


def _diverge_first_point(runs_dir, name="prenorm_clip1__lr-3e-3__layers-2"):
    """The point's seed diverged before any finite loss, as training records it: null numbers, NaN rows."""
    import json

    summary = runs_dir / name / "summary.json"
    s = json.loads(summary.read_text())
    s["per_seed"]["1"] = {
        **s["per_seed"]["1"],
        "status": "diverged",
        "steps": 1,
        "diverged_at_step": 1,
        "first_train_loss_cb0": None,
        "final_train_loss_cb0": None,
        "final_valid_loss_cb0": None,
        "max_grad_norm": None,
        "clipped_frac": None,
    }
    summary.write_text(json.dumps(s))
    seed = runs_dir / name / "seeds" / "seed1" / "summary.json"
    seed.write_text(json.dumps({**json.loads(seed.read_text()), "status": "diverged", "final_train_loss_cb0": None}))
    pd.DataFrame([{"seed": 1, "step": 1, "train_loss_cb0": float("nan")}]).to_csv(
        runs_dir / name / "metrics.csv", index=False
    )
    return name


def test_a_point_that_diverged_before_any_finite_loss_is_a_failed_row_of_the_map(map_cfg, tmp_path):
    _finished_runs(map_cfg, tmp_path)
    name = _diverge_first_point(tmp_path)
    t = M.table(make_config(map_cfg), tmp_path)
    row = t[t["run"] == name].iloc[0]
    assert row["status"] == "diverged" and row["capped_loss"] == M.NO_LOSS_BITS
    assert math.isnan(row["first_train_loss_cb0"]) and math.isnan(row["max_grad_norm"])
    out = tmp_path / "map.csv"
    M.run_table(make_config(map_cfg), tmp_path, out)
    back = M.read_map(out)  # the table reads back: its first loss is empty, its capped loss finite
    assert back[back["run"] == name]["capped_loss"].tolist() == [M.NO_LOSS_BITS]


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("max_grad_norm", "big", "'max_grad_norm' is 'big', not a finite number"),
        ("steps", -1, "'steps' is -1, not a count >= 0"),
        ("status", "gone", "'per_seed.1.status' is 'gone'"),
        ("overflow_skips", 2.5, "'overflow_skips' is 2.5"),
    ],
)
def test_a_damaged_field_of_a_points_summary_is_one_line(map_cfg, tmp_path, key, value, needle):
    import json

    _finished_runs(map_cfg, tmp_path)
    summary = tmp_path / "prenorm_clip1__lr-1e-3__layers-2" / "summary.json"
    s = json.loads(summary.read_text())
    s["per_seed"]["1"][key] = value
    summary.write_text(json.dumps(s))
    with pytest.raises(M.UserError) as err:
        M.table(make_config(map_cfg), tmp_path)
    assert str(err.value).startswith(f"{summary}: ") and needle in str(err.value)
