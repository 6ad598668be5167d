"""config/sections.py: the arms and their roles, one arm's settings in the model and training
configs, and the claims' thresholds."""

import pytest

from acoustic_mlm import config as C
from acoustic_mlm.config.sections import ClaimThresholds


def test_arms_match_the_paper(root):
    cfg = C.load(root / "config" / "config.yaml")
    labels = [r.label for r in cfg.runs.values()]
    assert labels == [
        "Pre-Norm | Gradient Clip=10 | Run 1",
        "Pre-Norm | Gradient Clip=1 | Run 2",
        "Post-Norm | DeepNorm | Gradient Clip=1",
        "Pre-Norm | Attn. Relax | Gradient Clip=1",
    ]
    r = cfg.runs
    assert (r["prenorm_clip10"].clip, r["prenorm_clip1"].clip) == (10.0, 1.0)
    assert r["postnorm_deepnorm_clip1"].norm == "deepnorm"
    assert [x.attention for x in r.values()] == ["softmax", "softmax", "softmax", "pb_relax"]
    assert [x.role for x in r.values()] == list(C.ROLES)
    assert [x.name for x in r.values()] == list(r)


def test_roles_find_arms_by_what_they_are_not_their_names(smoke_cfg):
    smoke_cfg["runs"] = {f"arm{i}": r for i, r in enumerate(smoke_cfg["runs"].values())}  # renamed arms
    smoke_cfg["runs"]["extra"] = {**smoke_cfg["runs"]["arm0"], "label": "an extra arm", "clip": 3.0}
    del smoke_cfg["runs"]["extra"]["role"]  # an arm without a role is drawn, not judged
    cfg = C.from_mapping(smoke_cfg)
    assert cfg.runs_by_role() == {"clip10": "arm0", "clip1": "arm1", "deepnorm": "arm2", "attn_relax": "arm3"}
    assert cfg.run("extra").role is None and cfg.run("extra").clip == 3.0


def test_arm_settings_reach_model_and_train_configs(root):
    cfg = C.load(root / "config" / "smoke.yaml")
    m = cfg.model_for("postnorm_deepnorm_clip1")
    assert (m.norm, m.attention, m.stride) == ("deepnorm", "softmax", 320)
    assert cfg.model_for("prenorm_attnrelax_clip1").attention == "pb_relax"
    assert cfg.train_for("prenorm_clip10").clip == 10.0
    with pytest.raises(C.ConfigError, match="no run 'nope'"):
        cfg.run("nope")


def test_thresholds_reject_bad_values():
    with pytest.raises(ValueError, match="start_min"):
        ClaimThresholds(start_min=11.0)
    with pytest.raises(ValueError, match="recovery_margin"):
        ClaimThresholds(spike_threshold=0.1, recovery_margin=0.2)
    with pytest.raises(ValueError, match="unknown key 'spike_treshold'"):
        ClaimThresholds.from_dict({"spike_treshold": 1.0})
    assert ClaimThresholds.from_dict(None) == ClaimThresholds()
