"""kernels.py: `cpu_kernels: avx2` pins torch's, MKL's, oneDNN's and numpy's kernels before they load;
`native` leaves them; the summary records what a process really ran with."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from acoustic_mlm import config as C
from acoustic_mlm import kernels


def test_config_argument_forms():
    assert kernels.config_argument(["train", "x", "--config", "a.yaml"]) == "a.yaml"
    assert kernels.config_argument(["train", "--config=b.yaml"]) == "b.yaml"
    assert kernels.config_argument(["status"]) == kernels.DEFAULT_CONFIG


def test_requested_mode_reads_the_file_and_ignores_what_it_cannot_read(tmp_path):
    good = tmp_path / "c.yaml"
    good.write_text(yaml.safe_dump({"cpu_kernels": "avx2", "data": {}}))
    assert kernels.requested_mode(str(good)) == "avx2"
    good.write_text(yaml.safe_dump({"cpu_kernels": "native"}))
    assert kernels.requested_mode(str(good)) == "native"
    good.write_text("cpu_kernels: [")  # the command reports a broken file itself
    assert kernels.requested_mode(str(good)) is None
    assert kernels.requested_mode(str(tmp_path / "missing.yaml")) is None
    good.write_text(yaml.safe_dump({"cpu_kernels": "sse9"}))  # not a mode: the schema refuses it later
    assert kernels.requested_mode(str(good)) is None
    fifo = tmp_path / "fifo.yaml"  # never opened: a FIFO without a writer would block
    os.mkfifo(fifo)
    assert kernels.requested_mode(str(fifo)) is None and kernels.requested_mode(str(tmp_path)) is None


def test_pin_sets_every_library_switch():
    env = {}
    problems = kernels.pin(env)
    if not kernels.cpu_has_avx2():
        assert env == {} and "no AVX2" in problems[0]
        return
    assert env == kernels.AVX2_ENV
    # torch and numpy are loaded in this test process: pinning now cannot take effect, and it says so
    assert any("already chosen" in p for p in problems)


def _run(args, config, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k not in kernels.AVX2_ENV}
    env.update(env_extra or {})
    code = (
        "import sys, json, os; from acoustic_mlm.__main__ import main; import acoustic_mlm.kernels as k; "
        "k.pin_for_command(sys.argv[1:]); import torch, numpy; "
        "print(json.dumps({'cap': torch.backends.cpu.get_cpu_capability(), "
        "'env': {n: os.environ.get(n) for n in k.AVX2_ENV}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *args, "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not kernels.cpu_has_avx2(), reason="pinning to AVX2 needs an x86-64 CPU with AVX2")
def test_a_fresh_process_runs_avx2_kernels_when_the_config_asks(root, tmp_path):
    settings = yaml.safe_load((root / "config" / "smoke.yaml").read_text())  # the file's mapping, edited below
    assert C.load(root / "config" / "smoke.yaml").cpu_kernels == "avx2"  # the CPU presets pin by default
    pinned = _run(["train"], root / "config" / "smoke.yaml")
    assert pinned["cap"] == "AVX2" and pinned["env"] == kernels.AVX2_ENV
    native_cfg = tmp_path / "native.yaml"
    native_cfg.write_text(yaml.safe_dump({**settings, "cpu_kernels": "native"}))
    native = _run(["train"], native_cfg)
    assert all(v is None for v in native["env"].values())  # nothing set: the libraries choose


def test_report_names_the_capability_and_whether_pinned():
    r = kernels.report()
    assert r["torch_cpu_capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "NEON", "SVE256")
    assert set(kernels.AVX2_ENV) <= set(r) and isinstance(r["pinned"], bool)


@pytest.mark.parametrize(
    "argv, read",
    [
        (["train", "x", "--conf", "a.yaml"], kernels.DEFAULT_CONFIG),  # no abbreviations: argparse refuses them too
        (["train", "--con=b.yaml"], kernels.DEFAULT_CONFIG),
        (["train", "--config", "a.yaml", "--config", "b.yaml"], "b.yaml"),  # repeated: the last wins, as argparse
        (["train", "--config=a.yaml", "--config", "c.yaml"], "c.yaml"),
        (["train", "--", "--config", "a.yaml"], kernels.DEFAULT_CONFIG),  # after --, not an option
        (["train", "--config"], kernels.DEFAULT_CONFIG),  # no value: argparse refuses the line itself
        (["train", "--codes", "x", "--configure", "y"], kernels.DEFAULT_CONFIG),  # other options
    ],
)
def test_config_argument_reads_the_command_line_as_argparse(argv, read):
    assert kernels.config_argument(argv) == read


def test_the_pinned_config_is_the_one_argparse_reads(root):
    """For every form the pin reads, argparse's --config (what the stage runs with) is the same file; an
    abbreviation is no form of it: argparse refuses it and the pin does not read it."""
    from acoustic_mlm import cli

    parser = cli.build_parser()
    for argv in (
        ["status", "--config", "a.yaml", "--config", "b.yaml"],
        ["status", "--config=a.yaml", "--config", "c.yaml"],
        ["status", "--stale-after", "5"],
    ):
        assert parser.parse_args(argv).config == kernels.config_argument(argv[1:]), argv
    assert kernels.config_argument(["--conf", "a.yaml"]) == kernels.DEFAULT_CONFIG
    with pytest.raises(SystemExit):
        parser.parse_args(["status", "--conf", "a.yaml"])


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in kernels.AVX2_ENV and k not in kernels.UNPINNING_ENV}
    env.pop("NPY_ENABLE_CPU_FEATURES", None)
    return {**env, **extra}


@pytest.mark.skipif(not kernels.cpu_has_avx2(), reason="pinning to AVX2 needs an x86-64 CPU with AVX2")
@pytest.mark.parametrize("value", ["AVX2", "AVX2 FMA3", "SSE42"])
def test_numpys_enable_variable_is_refused_in_one_line_not_an_import_traceback(root, tmp_path, value):
    proc = subprocess.run(
        [sys.executable, "-m", "acoustic_mlm", "status", "--config", str(root / "config" / "smoke.yaml")],
        capture_output=True,
        text=True,
        env=_clean_env(NPY_ENABLE_CPU_FEATURES=value),
        cwd=tmp_path,
        timeout=120,
    )
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("amlm status: error: NPY_ENABLE_CPU_FEATURES is set") and "cpu_kernels: native" in err


@pytest.mark.skipif(not kernels.cpu_has_avx2(), reason="pinning to AVX2 needs an x86-64 CPU with AVX2")
def test_an_abbreviated_config_is_pinned_for_the_file_argparse_reads(root, tmp_path):
    settings = yaml.safe_load((root / "config" / "smoke.yaml").read_text())
    native = tmp_path / "native.yaml"
    native.write_text(yaml.safe_dump({**settings, "cpu_kernels": "native"}))
    smoke = str(root / "config" / "smoke.yaml")
    for args, pinned in ((["--conf", smoke], True), (["--config", smoke, "--config", str(native)], False)):
        code = (
            "import sys, os; from acoustic_mlm import kernels as k; k.pin_for_command(sys.argv[1:]); "
            "print(os.environ.get('ATEN_CPU_CAPABILITY'))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, "status", *args], capture_output=True, text=True, env=_clean_env(), timeout=60
        )
        assert out.stdout.strip() == ("avx2" if pinned else "None"), (args, out.stderr)


@pytest.mark.parametrize(
    "env, pinned_env",
    [
        ({"MKL_CBWR": "COMPATIBLE"}, False),
        ({"MKL_CBWR": "AVX2"}, False),
        ({"MKL_DEBUG_CPU_TYPE": "5"}, False),
        ({"NPY_DISABLE_CPU_FEATURES": "AVX2"}, False),  # more than the pin's exclusions: kept, not pinned
        ({"NPY_DISABLE_CPU_FEATURES": "X86_V4"}, True),  # already among the pin's: nothing changes
        ({"ATEN_CPU_CAPABILITY": "avx512"}, True),  # one of the pin's own switches: the pin sets it
    ],
)
def test_variables_that_change_the_pinned_kernels_are_named_and_recorded(monkeypatch, env, pinned_env):
    if not kernels.cpu_has_avx2():
        pytest.skip("pinning to AVX2 needs an x86-64 CPU with AVX2")
    user = dict(env)
    problems = kernels.pin(user)
    named = [p for p in problems if "recorded as not pinned" in p]
    assert bool(named) != pinned_env, problems
    assert all(user[k] == v for k, v in kernels.AVX2_ENV.items() if k != kernels.NPY)
    assert set(kernels.AVX2_ENV[kernels.NPY].split()) <= set(user[kernels.NPY].split())
    for k in kernels.UNPINNING_ENV + tuple(kernels.AVX2_ENV):
        monkeypatch.delenv(k, raising=False)
    for k, v in user.items():
        monkeypatch.setenv(k, v)
    r = kernels.report()
    if not pinned_env:
        assert r["pinned"] is False
    for k in kernels.UNPINNING_ENV:
        assert r.get(k) == env.get(k)


def test_pin_refuses_numpys_enable_variable():
    if not kernels.cpu_has_avx2():
        pytest.skip("pinning to AVX2 needs an x86-64 CPU with AVX2")
    env = {"NPY_ENABLE_CPU_FEATURES": "AVX2"}
    with pytest.raises(kernels.PinError, match="numpy cannot load with both"):
        kernels.pin(env)
    assert "ATEN_CPU_CAPABILITY" not in env  # nothing set
