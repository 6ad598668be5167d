"""Configuration: every preset valid, every kind of mistake one line naming the key."""

import subprocess
import sys

import pytest
import yaml

from acoustic_mlm import config as C

PRESETS = ["config.yaml", "smoke.yaml", "paper.yaml", "paper-1node.yaml", "gpu-small.yaml"]


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_complete_and_valid(root, name):
    cfg = C.load(root / "config" / name)
    assert [r["role"] for r in cfg["runs"].values()] == list(C.ROLES)
    # a complete file: the same keys as the default, section by section
    default = yaml.safe_load((root / "config" / "config.yaml").read_text())
    for section in default:
        if section != "runs":
            assert set(cfg[section]) == set(default[section]), section


def test_arms_match_the_paper(root):
    cfg = C.load(root / "config" / "config.yaml")
    labels = [r["label"] for r in cfg["runs"].values()]
    assert labels == [
        "Pre-Norm | Gradient Clip=10 | Run 1",
        "Pre-Norm | Gradient Clip=1 | Run 2",
        "Post-Norm | DeepNorm | Gradient Clip=1",
        "Pre-Norm | Attn. Relax | Gradient Clip=1",
    ]
    r = cfg["runs"]
    assert (r["prenorm_clip10"]["clip"], r["prenorm_clip1"]["clip"]) == (10.0, 1.0)
    assert r["postnorm_deepnorm_clip1"]["norm"] == "deepnorm"
    assert [x["attention"] for x in r.values()] == ["softmax", "softmax", "softmax", "pb_relax"]
    assert [x["role"] for x in r.values()] == list(C.ROLES)


def _set(cfg, dotted, value):
    *parents, last = dotted.split(".")
    node = cfg
    for p in parents:
        node = node[p]
    node[last] = value


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("train.stepz", 5, "unknown key 'train.stepz'"),
        ("runs.prenorm_clip1.colour", "red", "unknown key 'runs.prenorm_clip1.colour'"),
        ("bogus", 1, "unknown key 'bogus'"),
        ("train.steps", "many", "'train.steps'"),
        ("train.lr", -1.0, "'train.lr'"),
        ("runs.prenorm_clip10.clip", -1.0, "'runs.prenorm_clip10.clip'"),
        ("runs.prenorm_clip1.deepnorm", True, "'runs.prenorm_clip1.deepnorm' was replaced by 'norm: deepnorm'"),
        ("runs.prenorm_clip1.attn_relax", False, "'runs.prenorm_clip1.attn_relax' was replaced by 'attention: pb_relax'"),
        ("tokenizer.level", "kweighted", "'tokenizer.level' was renamed to 'tokenizer.loudness'"),
        ("tokenizer.level_target", -23.0, "'tokenizer.level_target' was renamed to 'tokenizer.loudness_target'"),
        ("runs.prenorm_clip1.attention", "flash", "'runs.prenorm_clip1.attention'"),
        ("runs.prenorm_clip1.role", "clip10", "'runs.prenorm_clip1.role' is clip10, as is 'runs.prenorm_clip10.role'"),
        ("runs.prenorm_clip1.role", "baseline", "'runs.prenorm_clip1.role'"),
        ("runs.prenorm_clip1.norm", "sandwich", "'runs.prenorm_clip1.norm'"),
        ("model.conv_layers", [[32, 10, 5], [32, 3, 2]], "'model.conv_layers'"),
        ("model.heads", 3, "'model.dim'"),
        ("train.warmup_steps", 10_000, "'train.warmup_steps'"),
        ("train.device", "tpu", "'train.device'"),
        ("data.source", "napster", "'data.source'"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(smoke_cfg, key, value, needle):
    _set(smoke_cfg, key, value)
    with pytest.raises(C.ConfigError) as exc:
        C.validate(smoke_cfg, source="smoke.yaml")
    msg = str(exc.value)
    assert needle in msg
    assert "\n" not in msg and msg.startswith("smoke.yaml: ")


def test_a_missing_key_is_named_with_its_section(smoke_cfg):
    del smoke_cfg["train"]["lr"]
    with pytest.raises(C.ConfigError, match="missing key 'train.lr'"):
        C.validate(smoke_cfg)


def test_roles_find_arms_by_what_they_are_not_their_names(smoke_cfg):
    smoke_cfg["runs"] = {f"arm{i}": r for i, r in enumerate(smoke_cfg["runs"].values())}  # renamed arms
    smoke_cfg["runs"]["extra"] = {**smoke_cfg["runs"]["arm0"], "label": "an extra arm", "clip": 3.0}
    del smoke_cfg["runs"]["extra"]["role"]  # an arm without a role is drawn, not judged
    C.validate(smoke_cfg)
    assert C.runs_by_role(smoke_cfg) == {"clip10": "arm0", "clip1": "arm1", "deepnorm": "arm2", "attn_relax": "arm3"}
    assert C.run_config(smoke_cfg, "extra").role is None


def test_arm_settings_reach_model_and_train_configs(root):
    cfg = C.load(root / "config" / "smoke.yaml")
    m = C.model_config(cfg, "postnorm_deepnorm_clip1")
    assert (m.norm, m.attention, C.total_stride(m.conv_layers)) == ("deepnorm", "softmax", 320)
    assert C.model_config(cfg, "prenorm_attnrelax_clip1").attention == "pb_relax"
    assert C.train_config(cfg, "prenorm_clip10").clip == 10.0
    with pytest.raises(C.ConfigError, match="no run 'nope'"):
        C.run_config(cfg, "nope")


def test_cli_reports_bad_config_in_one_line(tmp_path, smoke_cfg):
    smoke_cfg["train"]["stepz"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(smoke_cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", "train", "--run", "prenorm_clip1", "--config", str(bad)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key 'train.stepz'" in lines[0] and str(bad) in lines[0]


def test_cli_missing_config_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", "validate", "--config", str(tmp_path / "nope.yaml")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2 and "nope.yaml: configuration file not found" in proc.stderr
