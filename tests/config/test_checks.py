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


# ----------------------------------------------------------------------------- keys YAML reads as other things


@pytest.mark.parametrize(
    "written, shown", [("true", "true"), ("no", "false"), ("1", "1"), ("null", "null"), ("1.5", "1.5"), ("~", "null")]
)
@pytest.mark.parametrize("where", ["runs", "train", "<top level>"])
def test_a_key_yaml_reads_as_a_boolean_number_or_null_is_one_line(smoke_cfg, tmp_path, written, shown, where):
    text = yaml.safe_dump(smoke_cfg, sort_keys=False)
    if where == "runs":  # an arm named `true:` (or 1:, null:) instead of a run name
        text = text.replace("runs:\n  prenorm_clip10:", f"runs:\n  {written}:", 1)
    elif where == "train":
        text = text.replace("train:\n", f"train:\n  {written}: 3\n", 1)
    else:
        text = f"{written}: 3\n" + text
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(C.ConfigError) as refused:
        C.load(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: the key {shown} under '{where}' is read by YAML as ") and "quote it" in message


@pytest.mark.parametrize("key", ["train.lr", "train.eps", "train.crop_seconds", "model.feature_penalty"])
@pytest.mark.parametrize("written", ["1e-3", "5E-4", "2e1"])
def test_a_number_yaml_reads_as_text_is_named_as_such(smoke_cfg, key, written):
    _set(smoke_cfg, key, written)
    with pytest.raises(C.ConfigError, match=rf"'{key}' holds '{written}', which YAML reads as text, not a number"):
        C.validate(smoke_cfg, "c.yaml")


@pytest.mark.parametrize("values", [["1e-3"], [0.001, "3e-3"], ["1E-2"]])
def test_a_swept_number_yaml_reads_as_text_is_named_as_such_not_for_its_characters(root, values):
    cfg = yaml.safe_load((root / "config" / "proxy.yaml").read_text())
    cfg["sweep"] = [{"grid": {"train.lr": values}, "arms": ["prenorm_clip1"]}]
    with pytest.raises(C.ConfigError) as refused:
        C.validate(cfg, "c.yaml")
    message = str(refused.value)
    assert "which YAML reads as text, not a number (an exponent needs a decimal point there); write" in message
    assert "a-z, 0-9" not in message


# ----------------------------------------------------------------------------- what a machine can hold


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("train.threads", 10**6, "'train.threads' is 1000000; at most 1,024"),
        ("train.processes", 1000, "'train.processes' is 1000; at most 64"),
        ("train.workers", 10**5, "'train.workers' is 100000; at most 256"),
        ("train.steps", 10**15, "'train.steps' is 1000000000000000; at most 100,000,000"),
        ("model.layers", 10**7, "'model.layers' is 10000000; at most 4,096"),
        ("model.dim", 10**8, "'model.dim' is 100000000; at most 65,536"),
        ("model.cqt_bins", 10**8, "'model.cqt_bins'"),
        ("train.crop_seconds", 1e7, "'train.crop_seconds' is 10000000.0; at most 3600"),
        ("train.batch_size", 10**9, "one training process needs at least"),
        ("train.batch_size", 10**6, "one training process needs at least"),
        ("train.valid_crops", 10**8, "GiB of validation audio"),
        ("model.dim", 60_000, "M parameters x 16 bytes"),
    ],
)
def test_sizes_beyond_what_a_machine_holds_are_refused_before_any_allocation(smoke_cfg, key, value, needle):
    import resource

    _set(smoke_cfg, key, value)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, hard))  # an allocation of the size would fail loudly
    try:
        with pytest.raises(C.ConfigError) as refused:
            C.validate(smoke_cfg, "c.yaml")
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    message = str(refused.value)
    assert needle in message and "\n" not in message and message.startswith("c.yaml: "), message
    assert "(" in message  # the reason is given


def test_the_memory_estimate_of_the_presets_is_within_every_machine(root):
    from acoustic_mlm.config.checks import GiB, memory_floor_bytes

    paper = yaml.safe_load((root / "config" / "paper.yaml").read_text())
    need, parts = memory_floor_bytes(paper)
    assert 300 < float(parts.split("M parameters")[0]) < 340  # MERT-330M's own count
    assert 4 * GiB < need < 8 * GiB
    cpu = yaml.safe_load((root / "config" / "smoke.yaml").read_text())
    assert memory_floor_bytes(cpu)[0] < 0.1 * GiB


def test_a_cpu_run_is_held_to_this_machines_memory_and_a_gpu_run_to_an_accelerators(smoke_cfg, monkeypatch):
    from acoustic_mlm.config import checks

    monkeypatch.setattr(checks.os, "sysconf", lambda name: 4096 if name == "SC_PAGE_SIZE" else 1 << 20)  # 4 GiB
    smoke_cfg["train"].update(batch_size=16384, device="cpu")  # about 5 GiB of activations
    with pytest.raises(C.ConfigError, match=r"more than this machine's memory holds \(4 GiB\)"):
        C.validate(smoke_cfg, "c.yaml")
    smoke_cfg["train"]["device"] = "cuda"
    C.validate(smoke_cfg, "c.yaml")  # fits an accelerator of 192 GB


def test_a_swept_size_is_bounded_as_the_files_value_is(smoke_cfg):
    with pytest.raises(C.ConfigError, match="one training process needs at least"):
        C.validate({**smoke_cfg, "train": {**smoke_cfg["train"], "batch_size": 10**12}}, "c.yaml")
    smoke_cfg["sweep"] = [{"grid": {"train.batch_size": [4, 10**12]}, "arms": ["prenorm_clip1"]}]
    with pytest.raises(C.ConfigError, match=r"sweep point prenorm_clip1__.*one training process needs at least"):
        C.validate(smoke_cfg, "c.yaml")
    smoke_cfg["sweep"] = [{"grid": {"train.threads": [2000]}, "arms": ["prenorm_clip1"]}]
    with pytest.raises(C.ConfigError):  # not a swept key, and beyond its ceiling in any case
        C.validate(smoke_cfg, "c.yaml")


def test_logit_temp_is_bounded_so_the_logits_stay_within_float16(smoke_cfg):
    from acoustic_mlm.model.config import LOGIT_TEMP_MIN

    assert 1.0 / LOGIT_TEMP_MIN <= 65504.0  # cosine logits <= 1 / logit_temp: float16's largest finite value
    for value in (1e-30, LOGIT_TEMP_MIN / 2):
        smoke_cfg["model"]["logit_temp"] = value
        with pytest.raises(C.ConfigError, match=r"'model.logit_temp': .* is less than the minimum of 1.52"):
            C.validate(copy_of(smoke_cfg), "c.yaml")
    smoke_cfg["model"]["logit_temp"] = LOGIT_TEMP_MIN
    C.validate(smoke_cfg, "c.yaml")


def copy_of(cfg: dict) -> dict:
    return yaml.safe_load(yaml.safe_dump(cfg))
