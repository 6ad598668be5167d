"""The `sweep:` section: points, names, each point's configuration, and one-line refusals."""

import copy
import math
import re
import subprocess
import sys

import pytest
import yaml
from helpers import RUN_NAMES

from acoustic_mlm import config as C
from acoustic_mlm.config import sweep as S


@pytest.fixture()
def swept(smoke_cfg) -> dict:
    cfg = copy.deepcopy(smoke_cfg)
    cfg["sweep"] = [
        {"grid": {"train.lr": [0.001, 0.0015, 0.01], "model.layers": [2, 16], "seeds": [1, 2]}},
        {"grid": {"train.lr": [0.001], "train.precision": ["fp16_fairseq"]}, "arms": [RUN_NAMES[1], RUN_NAMES[3]]},
    ]
    return C.validate(cfg)


@pytest.mark.parametrize(
    "value, text",
    [
        (0.002, "2e-3"),
        (1.5e-3, "1p5e-3"),
        (0.01, "1e-2"),
        (3e-05, "3e-5"),
        (16, "16"),
        (2.0, "2"),
        (True, "true"),
        ("fp16_fairseq", "fp16_fairseq"),
        (0.3, "3e-1"),
        (1e-10, "1e-10"),
    ],
)
def test_values_are_written_without_dots(value, text):
    assert S.format_value(value) == text


def test_points_cross_every_grid_with_its_arms(swept):
    pts = S.points(swept)
    assert len(pts) == 4 * 3 * 2 + 2  # four arms x three rates x two depths, then two arms in fp16
    first = next(iter(pts.values()))
    assert first.name == "prenorm_clip10__lr-1e-3__layers-2" and first.seeds == (1, 2)
    fp16 = pts["prenorm_attnrelax_clip1__lr-1e-3__precision-fp16_fairseq"]
    assert fp16.arm == RUN_NAMES[3] and fp16.seeds == (1,)  # the arm's own seeds without a seeds key
    assert S.run_names(swept) == list(pts)


def test_a_point_is_the_file_with_its_values_in_place(swept):
    name = "postnorm_deepnorm_clip1__lr-1p5e-3__layers-16"
    pc = S.point_config(swept, name)
    assert pc["train"]["lr"] == 0.0015 and pc["model"]["layers"] == 16
    assert list(pc["runs"]) == [name] and "sweep" not in pc
    run = pc["runs"][name]
    assert run["norm"] == "deepnorm" and run["clip"] == 1.0 and run["role"] == "deepnorm" and run["seeds"] == [1, 2]
    assert run["label"] == swept["runs"]["postnorm_deepnorm_clip1"]["label"]
    assert swept["train"]["lr"] == 0.006 and swept["model"]["layers"] == 2  # the file's values are untouched
    keys = C.settings(pc, C.result_keys("train", pc, name))
    assert keys["train.lr"] == 0.0015 and keys["model.layers"] == 16 and keys[f"runs.{name}.norm"] == "deepnorm"
    # the model and training settings a point trains with, typed
    typed = C.from_mapping(swept).point(name)
    assert typed.model_for(name).layers == 16 and typed.train_for(name, 2).lr == 0.0015
    assert typed.model_for(name).norm == "deepnorm" and typed.train_for(name, 2).clip == 1.0


def test_without_a_sweep_the_runs_are_the_arms(smoke_cfg):
    assert S.points(smoke_cfg) == {}
    assert S.run_names(smoke_cfg) == list(RUN_NAMES)
    assert S.point_config(smoke_cfg, RUN_NAMES[0]) is smoke_cfg


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(path)


@pytest.mark.parametrize(
    "grid, words",
    [
        ({"grid": {"train.threads": [1, 2]}}, "'sweep[0].grid.train.threads' is not a setting of a training run"),
        ({"grid": {"runs.prenorm_clip1.clip": [1.0]}}, "is not a setting of a training run"),
        ({"grid": {"figure.y_max": [9.0]}}, "is not a setting of a training run"),
        ({"grid": {"train.lr": []}}, "grid.train.lr': [] should be non-empty"),
        ({"grid": {"train.lr": [0.001, 0.001]}}, "'sweep[0].grid.train.lr' lists 0.001 twice; list each value once"),
        ({"grid": {"train.lr": [-1.0]}}, "'sweep[0].grid.train.lr': -1.0 is less than or equal to the minimum of 0"),
        ({"grid": {"model.heads": [3]}}, "'model.dim' (64) must be divisible by 'model.heads' (3)"),
        ({"grid": {"train.lr": [0.001]}, "arms": ["nope"]}, "'sweep[0].arms' names 'nope'"),
        ({"grid": {"seeds": [1.5]}}, "seeds are whole numbers"),
        ({"grid": {"train.precision": ["FP16"]}}, "string values in a sweep use a-z, 0-9 and _"),
    ],
)
def test_a_refused_sweep_is_one_line_and_exit_2(tmp_path, smoke_cfg, grid, words):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["sweep"] = [grid]
    path = _write(tmp_path, cfg)
    r = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", "validate", "--config", path], capture_output=True, text=True
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert path in r.stderr and words in r.stderr, r.stderr


def test_colliding_points_are_refused(tmp_path, smoke_cfg):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["sweep"] = [{"grid": {"train.lr": [0.001, 0.002]}}, {"grid": {"train.lr": [0.002]}, "arms": [RUN_NAMES[0]]}]
    path = _write(tmp_path, cfg)
    r = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", "validate", "--config", path], capture_output=True, text=True
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "'sweep[1]' gives point 'prenorm_clip10__lr-2e-3', which 'sweep[0]' gives too" in r.stderr
    # values that differ only below the name's precision would also collide: refused naming both values
    cfg["sweep"] = [{"grid": {"train.lr": [0.0010000001, 0.001]}}]
    with pytest.raises(
        C.ConfigError,
        match=re.escape("'sweep[0].grid.train.lr' holds 0.0010000001 and 0.001, which name one point ('lr-1e-3'"),
    ):
        C.validate(cfg, "mine.yaml")


def test_an_overlong_point_name_is_refused(smoke_cfg):
    cfg = copy.deepcopy(smoke_cfg)
    arm = cfg["runs"].pop(RUN_NAMES[0])
    cfg["runs"]["a" * 150] = arm
    cfg["sweep"] = [
        {
            "grid": {
                "train.lr": [0.001],
                "train.warmup_steps": [5],
                "model.mask_prob": [0.5],
                "train.weight_decay": [0.1],
                "model.dropout": [0.1],
            }
        }
    ]
    with pytest.raises(C.ConfigError, match="byte name"):
        C.validate(cfg, "mine.yaml")


@pytest.mark.slow
def test_the_cli_trains_a_point_under_its_values(swept, tmp_path):
    """`amlm train <point>` resolves the point before anything is loaded (an unknown point: one line)."""
    path = _write(tmp_path, swept)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "acoustic_mlm",
            "train",
            "prenorm_clip1__lr-9",
            "--config",
            path,
            "--prepared",
            str(tmp_path / "none"),
            "--codes",
            str(tmp_path / "none"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "no sweep point 'prenorm_clip1__lr-9'" in r.stderr and r.stderr.count("\n") == 1
    assert not math.isnan(swept["train"]["lr"])


@pytest.mark.slow
def test_the_gpu_map_projects_to_at_most_two_gpu_hours(root, tmp_path):
    """`amlm preflight` on config/proxy-gpu.yaml (on CPU: one small micro-batch measured) projects the whole
    map from counted FLOPs, every point at its own precision: at most 2 GPU-hours on one H100/H200."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "acoustic_mlm",
            "preflight",
            "--config",
            str(root / "config/proxy-gpu.yaml"),
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    sweep = json.loads((tmp_path / "preflight.json").read_text())["sweep_projection"]
    cfg = C.load(root / "config/proxy-gpu.yaml")
    assert sweep["points"] == len(cfg.points) and sweep["runs"] == sum(len(p.seeds) for p in cfg.points.values())
    h200 = sweep["gpus"][0]
    assert h200["gpu"].startswith("H100 / H200") and 0.2 < h200["gpu_hours"] <= 2.0
    assert set(h200["panels"]) == {
        "4 layers, bf16",
        "16 layers, bf16",
        "4 layers, fp16_fairseq",
        "16 layers, fp16_fairseq",
    }
    assert "The sweep" in (tmp_path / "preflight.md").read_text()


@pytest.mark.parametrize(
    "grid, words",
    [
        (
            {"grid": {"train.lr": [0.001]}, "arms": [RUN_NAMES[1], RUN_NAMES[0], RUN_NAMES[1]]},
            f"'sweep[0].arms' lists '{RUN_NAMES[1]}' twice; list each arm once",
        ),
        (
            {"grid": {"seeds": [1, 2]}},
            "'sweep[0].grid' sets only 'seeds'; a grid sweeps at least one model./train. setting",
        ),
        ({"grid": {"seeds": [3]}, "arms": [RUN_NAMES[0]]}, "'sweep[0].grid' sets only 'seeds'"),
        (
            {"grid": {"model.dropout": [0.1, 0.10000001]}},
            "'sweep[0].grid.model.dropout' holds 0.1 and 0.10000001, which name one point ('dropout-1e-1'",
        ),
        ({"grid": {"train.lr": [3e-4, 0.0003]}}, "'sweep[0].grid.train.lr' lists 0.0003 twice"),
        ({"grid": {"train.lr": [0.001], "seeds": [1, 2, 1]}}, "'sweep[0].grid.seeds' lists 1 twice"),
        (
            {"grid": {"train.lr": [0.001]}, "arms": RUN_NAMES[0]},
            f"'sweep.0.arms': '{RUN_NAMES[0]}' is not of type 'array'",
        ),
        ({"grid": {"train.lr": [0.001]}, "arms": []}, "'sweep.0.arms': [] should be non-empty"),  # the schema's words
        ({"grid": {"model.layers": [2, 4.0]}}, "'sweep[0].grid.model.layers': holds 4.0; it must be a whole number"),
        ({"grid": {"train.lr": [True]}}, "'sweep[0].grid.train.lr': True is not of type 'number'"),
        ({"grid": {"train.precision": ["fp8"]}}, "'sweep[0].grid.train.precision': 'fp8' is not one of"),
    ],
)
def test_a_refusal_names_what_the_grid_says_not_a_consequence(smoke_cfg, grid, words):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["sweep"] = [grid]
    with pytest.raises(C.ConfigError) as err:
        C.validate(cfg, "mine.yaml")
    msg = str(err.value)
    assert msg.startswith("mine.yaml: ") and words in msg and "\n" not in msg, msg
    assert "listed twice" not in msg and "has the name of an arm" not in msg  # the old consequences


def test_a_point_given_by_two_grids_names_both_grids_and_the_values(smoke_cfg):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["sweep"] = [
        {"grid": {"train.lr": [0.001]}, "arms": [RUN_NAMES[0]]},
        {"grid": {"train.lr": [0.0010000002]}, "arms": [RUN_NAMES[0]]},
    ]
    with pytest.raises(
        C.ConfigError,
        match=re.escape(
            f"'sweep[1]' gives point '{RUN_NAMES[0]}__lr-1e-3', which 'sweep[0]' gives too (train.lr 0.001 there, "
            "0.0010000002 here); each point is one run: take it out of one grid"
        ),
    ):
        C.validate(cfg, "mine.yaml")


@pytest.mark.parametrize(
    "grid",
    [
        {"model.heads": [2, 3]},  # the rules across keys
        {"train.warmup_steps": [1, 100000]},
        {"model.codebooks": [2, 16]},
        {"train.lr": [0.001], "train.batch_size": [3], "train.processes": [2]},
        {"train.steps": [0]},  # the schema of one value
    ],
)
def test_the_linear_check_refuses_a_point_exactly_when_its_configuration_would_be_refused(smoke_cfg, grid):
    cfg = copy.deepcopy(smoke_cfg)
    cfg["sweep"] = [{"grid": grid, "arms": [RUN_NAMES[0]]}]
    with pytest.raises(C.ConfigError) as err:
        C.validate(cfg, "mine.yaml")
    bad = []
    for name in S.points(cfg):
        try:
            C.validate(S.point_config(cfg, name), "mine.yaml")
        except C.ConfigError as exc:
            bad.append(str(exc).split(": ", 1)[1])
    assert bad and str(err.value).split(": ", 2)[-1] in {b.split(": ", 1)[-1] for b in bad}, (str(err.value), bad)


def test_every_point_of_the_shipped_sweep_is_valid_as_a_file(root):
    cfg = C.read_yaml(root / "config" / "proxy.yaml")
    for name in S.points(cfg):
        C.validate(S.point_config(cfg, name), f"proxy.yaml ({name})")


def _sweep_of(smoke_cfg, n):
    cfg = copy.deepcopy(smoke_cfg)
    layers = [2, 4, 6, 8, 12]
    rates = [round(1e-4 * (1 + i / 10), 8) for i in range(n // (len(cfg["runs"]) * len(layers)))]
    cfg["sweep"] = [{"grid": {"train.lr": rates, "model.layers": layers}}]
    return cfg


def test_validating_a_sweep_is_linear_in_its_points(smoke_cfg):
    """Was quadratic: 1,000 points 7 s, 10,000 more than a minute (issue 32); now about 35 us a point."""
    import time

    seconds = {}
    for n in (1000, 10000):
        cfg = _sweep_of(smoke_cfg, n)
        t0 = time.perf_counter()
        C.validate(cfg, "big.yaml")
        seconds[n] = time.perf_counter() - t0
        assert len(S.points(cfg)) == n
    assert seconds[10000] < 10.0, seconds
    assert seconds[10000] < 30 * max(seconds[1000], 0.01), seconds  # quadratic would be 100x
    t0 = time.perf_counter()
    names = S.run_names(cfg)
    configs = [S.point_config(cfg, name) for name in names[:2000]]  # every stage asks for its point's config
    assert time.perf_counter() - t0 < 10.0 and configs[-1]["runs"].keys() == {names[1999]}
