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
