"""config/checks.py: validate refuses every kind of mistake in one line naming the key, also through the CLI."""

import subprocess
import sys

import pytest
import yaml

from acoustic_mlm import config as C


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
        (
            "runs.prenorm_clip1.attn_relax",
            False,
            "'runs.prenorm_clip1.attn_relax' was replaced by 'attention: pb_relax'",
        ),
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


def test_cli_reports_bad_config_in_one_line(tmp_path, smoke_cfg):
    smoke_cfg["train"]["stepz"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(smoke_cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", "train", "--run", "prenorm_clip1", "--config", str(bad)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key 'train.stepz'" in lines[0] and str(bad) in lines[0]
