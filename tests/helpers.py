"""Shared test helpers (imported by the test modules of every folder: pyproject.toml puts tests/ on
sys.path)."""

import argparse
import copy
import hashlib
import importlib.util
import io
import os
import shutil
import signal
import stat
import sys
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

# Generated or local-only paths that a fresh clone does not have.
_PATTERNS = shutil.ignore_patterns(
    ".git", ".snakemake", "*.egg-info", "__pycache__", ".pytest_cache", ".venv", ".*.tmp-*"
)


def _ignore(folder: str, names: list[str]) -> set[str]:
    ignored = set(_PATTERNS(folder, names))
    if Path(folder).name == ".dvc":  # DVC's local state, never committed
        ignored |= {"cache", "tmp", "config.local"} & set(names)
    return ignored


_GENERATED = (
    "data/raw",
    "data/prepared",
    "data/codes",
    "data/downloads",
    "results/runs",
    "results/logs",
    "results/figures",
    "results/loss_curves.csv",
    "results/claims.json",
    "results/claims.md",
    "results/config_check.txt",
    "results/diagnostics.csv",
    "results/stability_map.csv",
    "results/map_claims.json",
    "results/map_claims.md",
    "results/final_losses.json",
    "results/metrics.json",
    "results/config.yaml",
    "results/preflight.json",
    "results/preflight.md",
    "results/report.html",
    "results/gpu_check",
)


def copy_repo(root: Path, dest: Path) -> Path:
    """The repository as a fresh clone would have it: tracked sources, no generated outputs."""
    shutil.copytree(root, dest, ignore=_ignore)
    for rel in _GENERATED:
        p = dest / rel
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    return dest


def copy_run(src: Path, dest: Path) -> Path:
    """A finished repository (a pipeline run in a `copy_repo`) copied whole: its outputs with their
    modification times and Snakemake's records (.snakemake/), so that the copy is as up to date as the
    original for Snakemake, and the original stays as it was for the other tests that read it."""
    shutil.copytree(src, dest, symlinks=True)
    return dest


def copy_run_data(src: Path, dest: Path) -> Path:
    """`copy_run`, then results/ as a fresh clone has it (the logs kept): the data stages' outputs and
    Snakemake's records of them, nothing trained. Snakemake given the same config file (its path is a
    param of every rule) with the same data settings finds the data up to date and trains only."""
    copy_run(src, dest)
    for rel in _GENERATED:
        p = dest / rel
        if not rel.startswith("results/") or rel == "results/logs":
            continue
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    return dest


_KEEP = object()
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def tool_env(pythonpath=_KEEP, git: bool = False) -> dict[str, str]:
    """The environment of a tool run as a subprocess (snakemake, dvc, amlm): os.environ with this interpreter's
    folder first on PATH, so that the jobs' `python`, `amlm` and `dvc` are the tests' environment's even when
    it is not activated. `pythonpath`: None removes PYTHONPATH (the jobs find the package in a copy's src/), a
    string sets it; left out, it is kept. `git`: a commit identity, for the tests in which DVC commits."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if pythonpath is None:
        env.pop("PYTHONPATH", None)
    elif pythonpath is not _KEEP:
        env["PYTHONPATH"] = str(pythonpath)
    return env | (GIT_IDENTITY if git else {})


# The xdist group (`pytest.mark.xdist_group`) of every test that uses the session's smoke run
# (tests/pipeline/conftest.py: smoke_run): under `pytest -n 2 --dist loadgroup` they run on one worker,
# so that the pipeline runs once.
SMOKE_GROUP = "smoke_run"


# The presets' run names (every preset names its four arms alike); tests find the arms by these.
RUN_NAMES = ("prenorm_clip10", "prenorm_clip1", "postnorm_deepnorm_clip1", "prenorm_attnrelax_clip1")
NARROW_CONV = ((8, 10, 5), (8, 8, 4), (8, 4, 4), (8, 2, 2), (8, 2, 2))  # stride 320, receptive field 345


def tiny_config(**overrides):
    """A tiny ModelConfig for unit tests of the model and the objective: every field given (the
    dataclass has no defaults but cqt_impl), norm "pre" and attention "softmax" unless overridden;
    the recipe switches off (no CQT loss, no noise mixing, no special symbols, the FFN hidden
    dropout equal to the residual dropout)."""
    from acoustic_mlm.model.config import ModelConfig

    base = dict(
        conv_layers=NARROW_CONV, dim=32, layers=2, heads=4, ffn_dim=64, dropout=0.0, attention_dropout=0.0,
        activation_dropout=overrides.get("dropout", 0.0), encoder_layerdrop=0.0, dropout_input=0.0,
        feature_grad_mult=1.0, pos_conv_kernel=4, pos_conv_groups=4, final_dim=16, logit_temp=0.1, fp16_logits=False,
        relax_alpha=32.0, qk_gain=1.0, feature_penalty=10.0, mask_prob=0.8, mask_length=5, mask_min_masks=2,
        codebooks=2, codebook_size=32, special_symbols=0, cqt_loss_weight=0.0, cqt_bins=336, cqt_bins_per_octave=48,
        cqt_fmin=32.7, mixture_prob=0.0, mixture_segments=(1, 3), mixture_samples=(12000, 36000), mixture_volume=1.0,
        norm="pre", attention="softmax",
    )  # fmt: skip
    base.update(overrides)
    return ModelConfig(**base)


def make_config(base=None, /, *, source: str = "smoke.yaml", **overrides):
    """A validated `Config` for a test: the smoke preset (or `base`: a mapping as a YAML file holds it, a
    `Config`, or a preset's file name under config/) with `overrides`, each a dotted key
    (`make_config(**{"train.steps": 10})`) or a section's nested dict merged into it
    (`make_config(train={"steps": 10})`). A `Config` given without overrides is returned as it is."""
    from acoustic_mlm import config as C

    if isinstance(base, C.Config):
        if not overrides:
            return base
        base = base.mapping
    if base is None or isinstance(base, str):
        source = base or source
        base = C.read_yaml(ROOT / "config" / source)
    mapping = copy.deepcopy(base)
    for key, value in overrides.items():
        *parents, last = key.split(".")
        node = mapping
        for part in parents:
            node = node[part]
        _merge(node, last, copy.deepcopy(value))
    return C.from_mapping(mapping, source)


def _merge(node: dict, key: str, value) -> None:
    if isinstance(value, dict) and isinstance(node.get(key), dict):
        for k, v in value.items():
            _merge(node[key], k, v)
    else:
        node[key] = value


# A local HTTP server (127.0.0.1) with Range support and scripted failures, and the archives it serves


class LocalServer:
    """Serves `files[path] = bytes`; can cut the first response short or ignore Range."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.truncate_once: set[str] = set()  # first GET: full Content-Length, half the bytes, then close
        self.ignore_range: set[str] = set()  # answer Range requests with the whole file (200)
        self.range_from_zero: set[str] = set()  # answer Range requests with 206 from byte 0 (a broken server)
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                path, rng = self.path, self.headers.get("Range")
                server.requests.append((path, rng))
                if path not in server.files:
                    self.send_error(404)
                    return
                data = server.files[path]
                start = 0
                if rng and path not in server.ignore_range:
                    start = 0 if path in server.range_from_zero else int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if path in server.truncate_once:
                    server.truncate_once.discard(path)
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def log_message(self, *args):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}{path}"

    def serve(self, path: str, data: bytes) -> str:
        self.files[path] = data
        return self.url(path)


def make_zip(members: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            zf.writestr(info, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def make_tar(
    members: dict[str, bytes], symlinks: dict[str, str] | None = None, hardlinks: dict[str, str] | None = None
) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for kind, links in ((tarfile.SYMTYPE, symlinks or {}), (tarfile.LNKTYPE, hardlinks or {})):
            for name, target in links.items():
                info = tarfile.TarInfo(name)
                info.type, info.linkname = kind, target
                tf.addfile(info)
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# Real recordings for tests: librosa's example recordings, beside the repository (never inside it)


def real_audio_dir() -> Path:
    """The folder of librosa's 14 example recordings: $AMLM_REAL_AUDIO, else shared/audio/librosa
    beside the repository (../shared/audio/librosa from its root) or beside any folder above it,
    the nearest first (a checkout one level deeper still finds them)."""
    import os

    env = os.environ.get("AMLM_REAL_AUDIO")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[1]
    for folder in root.parents:
        candidate = folder / "shared" / "audio" / "librosa"
        if candidate.is_dir():
            return candidate
    return root.parent / "shared" / "audio" / "librosa"


def real_audio_missing() -> str | None:
    """Why the real-recording tests cannot run (None: they can)."""
    folder = real_audio_dir()
    if not folder.is_dir() or not any(folder.glob("*.ogg")):
        return f"librosa's example recordings not found at {folder} (set AMLM_REAL_AUDIO to their folder)"
    return None


# A small sweep on the smoke preset: two learning rates for every arm (the arms' own seeds), and a
# depth for one arm with seeds set by its grid: 9 points.
SWEEP = [
    {"grid": {"train.lr": [0.002, 0.01]}},
    {"grid": {"model.layers": [3], "seeds": [1, 2]}, "arms": ["prenorm_clip1"]},
]


def write_sweep_config(root: Path, dest: Path) -> Path:
    """config/smoke.yaml with SWEEP, written to `dest`."""
    import yaml

    cfg = yaml.safe_load((root / "config" / "smoke.yaml").read_text())
    cfg["sweep"] = SWEEP
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dest


# metrics.csv of one run, as the train stage writes it: k codebooks falling from start to end
def fake_metrics(steps, start=10.0, end=6.0, k=2):
    s = np.asarray(steps, dtype=float)
    curve = end + (start - end) * np.exp(-s / 20)
    row = {"step": steps}
    for cb in range(k):
        row[f"train_loss_cb{cb}"] = curve + cb
        row[f"valid_loss_cb{cb}"] = curve + cb + 0.1
    row["lr"] = 1e-3
    return pd.DataFrame(row)


def read_refused(call, path, *needles) -> str:
    """`call()` raises one ReadError line (a UserError, no line break) that starts with `path` and
    names each needle: how every checked reader refuses a missing or damaged file. Returns the line."""
    import pytest

    from acoustic_mlm.artifacts.checked import ReadError
    from acoustic_mlm.errors import UserError

    with pytest.raises(ReadError) as err:
        call()
    msg = str(err.value)
    assert isinstance(err.value, UserError) and "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


def stoppable_by_sigint() -> None:
    """A subprocess's `preexec_fn`: SIGINT back to its default action in the child, so that the
    child's Python installs its KeyboardInterrupt handler. A shell starts a background job (`nohup
    pytest &`) with SIGINT ignored, every child inherits that, and a test that stops its child with
    SIGINT would otherwise find it running on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_command(command, cfg, *argv: str):
    """A stage's command parsed from argv and run with `cfg`, as `amlm` runs it once --config is validated."""
    args = command.add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(list(argv))
    return command(args, cfg)


def load_benchmark(name: str):
    """A script of benchmarks/ as a module (the scripts are not a package: their folder goes on sys.path
    for their sibling imports, and the module into sys.modules, where dataclasses look it up)."""
    folder = str(ROOT / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


AMLM = (sys.executable, "-m", "acoustic_mlm")


def train_argv(run: str, cfg_path, data_dirs, out, launcher=AMLM) -> list[str]:
    """`amlm train RUN` with a config, on a prepared corpus and its codes (`data_dirs`), one torch thread,
    out to `out`; `launcher` runs the package (a torch.distributed launcher, or () for the bare arguments)."""
    prepared, codes = data_dirs
    return [
        *launcher,
        *("train", run, "--config", str(cfg_path), "--threads", "1"),
        *("--prepared", str(prepared), "--codes", str(codes), "--out", str(out)),
    ]
