"""config/params.py: which keys of the file each DVC stage lists as params."""

import pytest

from acoustic_mlm import config as C
from acoustic_mlm.config import params as P
from acoustic_mlm.errors import UserError


def test_a_wholly_listed_section_is_named_once_and_order_is_kept(root):
    cfg = C.load(root / "config" / "smoke.yaml")
    model_keys = [f"model.{k}" for k in cfg.mapping["model"]]
    assert P.compact(cfg, ["train.lr"] + model_keys + ["train.lr"]) == ["train.lr", "model"]
    assert P.compact(cfg, model_keys[:2]) == model_keys[:2]  # a part of a section stays key by key


def test_the_train_stage_is_templated_on_the_arm_and_leaves_out_what_cannot_change_results(root):
    cfg = C.load(root / "config" / "config.yaml")
    keys = P.arm_params(cfg)
    assert {"model", "cpu_kernels", "runs.${key}.clip", "runs.${key}.norm", "runs.${key}.seeds"} <= set(keys)
    assert not [k for k in keys if k in ("train.threads", "train.workers", "runs.${key}.label")]
    assert keys == P.arm_params(cfg.mapping)  # a Config and its mapping give the same keys


def test_arms_with_different_training_keys_are_refused(root):
    mapping = C.read_yaml(root / "config" / "smoke.yaml")
    del mapping["runs"]["prenorm_clip1"]["role"]  # role is not a training key: still the same keys
    assert P.arm_params(C.from_mapping(mapping))
    cfg = C.from_mapping(mapping)
    cfg.mapping["runs"]["prenorm_clip1"]["extra"] = 1  # a key only one arm has (past validation)
    with pytest.raises(UserError, match="training keys differ"):
        P.arm_params(cfg)


def test_a_sweep_points_params_leave_out_its_swept_keys(root):
    cfg = C.load(root / "config" / "proxy.yaml")
    grids = P.grid_of_points(cfg)
    assert set(grids) == set(cfg.points)
    name, point = next(iter(cfg.points.items()))
    keys = P.point_params(cfg, point, grids[name])
    swept = {k for k, _ in point.values}
    assert swept and not swept & set(keys)
    assert not [k for k in keys if k.startswith(f"runs.{name}.")]  # the point's own keys are its arm's
    assert any(k.startswith(f"runs.{point.arm}.") for k in keys)
