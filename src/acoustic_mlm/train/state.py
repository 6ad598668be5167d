"""What lets a seed resume and be recognised as done: its fingerprint (the settings that shape its
numbers), the resumable states (checksummed, the newest KEEP_STATES kept) with the RNG state they
hold, and the completed seed's summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from acoustic_mlm import config as C
from acoustic_mlm.artifacts.checked import ReadError
from acoustic_mlm.artifacts.checkpoint import CHECKPOINT
from acoustic_mlm.artifacts.metrics import METRICS, read_metrics
from acoustic_mlm.artifacts.run_summary import SUMMARY, read_seed_summary
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import atomic_path, file_sha256, log

STATE_DIR = "state"  # <run>/state/seed<S>/: not a pipeline output, so no engine deletes it
KEEP_STATES = 2  # the latest and the one before it, in case the latest is damaged


def fingerprint(cfg: C.Config, run_name: str, world: int) -> dict:
    """Everything that shapes one arm's numbers: the settings the train stage and every stage before
    it depend on (config.result_keys), and the process count. A resumable state or a completed
    seed (its folder names the seed) made under another fingerprint is not reused."""
    keys = C.result_keys("train", cfg, run_name, upstream=True)
    keys.remove(f"runs.{run_name}.seeds")  # one seed's numbers do not depend on which other seeds the arm has
    return json.loads(json.dumps({"settings": C.settings(cfg, keys), "processes": world}))


def completed_summary(out_dir: Path, fp: dict) -> dict | None:
    """The summary of a seed already completed under the same fingerprint, else None."""
    done = out_dir / SUMMARY
    if done.is_file() and (out_dir / METRICS).is_file() and (out_dir / CHECKPOINT).is_file():
        try:
            previous = read_seed_summary(done)
            read_metrics(out_dir / METRICS)
        except ReadError as exc:  # the stage's own output, damaged: train the seed again
            log.warning("train: %s; training this seed again", exc)
            return None
        if previous.get("fingerprint") == fp:
            return previous
    return None


def save_state(state_dir: Path, step: int, state: dict) -> None:
    """Write the resumable state atomically with its sha256 beside it (step-N.pt.sha256, in place
    before the state appears), then drop all but the newest KEEP_STATES."""
    path = Path(state_dir) / f"step-{step:09d}.pt"
    tensors, stack = [], [state]
    while stack:  # the bytes its tensors hold: what a full disk or a size limit is told it needs
        node = stack.pop()
        if isinstance(node, torch.Tensor):
            tensors.append(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    with atomic_path(path, needed=sum(t.numel() * t.element_size() for t in tensors)) as tmp:
        torch.save(state, tmp)
        with atomic_path(path.with_name(path.name + ".sha256")) as side:
            side.write_text(f"{file_sha256(tmp)}  {path.name}\n")  # sha256sum's format: `sha256sum -c` checks it
    for old in sorted(path.parent.glob("step-*.pt"))[:-KEEP_STATES]:
        old.unlink()
        old.with_name(old.name + ".sha256").unlink(missing_ok=True)


# What a resumable state holds (train.loop.checkpoint), each of its kind: a state lacking one, or
# holding another kind (a file that is not a state at all), is damaged and skipped like a bad checksum.
STATE_KEYS: dict[str, type | tuple] = {
    "fingerprint": dict,
    "step": int,
    "rows": list,
    "elapsed": (int, float),
    "nonfinite": int,
    "streak": int,
    "overflow": int,
    "clipped": int,
    "accumulator": dict,
    "model": dict,
    "optimizer": dict,
    "scaler": dict,
    "fp16": (dict, type(None)),
    "rng": dict,
}


def state_problem(state, required: dict[str, type | tuple] | None = None) -> str | None:
    """Why `state` (what torch.load returned) is not a resumable state, or None: it must be a dict
    with a `fingerprint` and every `required` key, each of its type (bool is never an int here)."""
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a resumable state"
    for key, kind in {"fingerprint": dict, **(required or {})}.items():
        if key not in state:
            return f"lacks '{key}'"
        kinds = kind if isinstance(kind, tuple) else (kind,)
        value = state[key]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            return f"'{key}' holds a {type(value).__name__}, not {' or '.join(k.__name__ for k in kinds)}"
    return None


def load_latest_state(
    state_dir: Path, fingerprint: dict, required: dict[str, type | tuple] | None = None, check=None
) -> dict | None:
    """The newest intact state in state_dir, or None. A state whose content does not match the
    sha256 written beside it (a bad copy, a flipped bit), that has none, that cannot be read, or
    whose content is not a state (another type, a missing key of `required`, or a reason from
    `check(state)`, e.g. tensors of other shapes than the model's) is skipped with a warning and the
    previous one is used. A state of other settings is refused: deleting it is the user's call."""
    for path in sorted(Path(state_dir).glob("step-*.pt"), reverse=True):
        side = path.with_name(path.name + ".sha256")
        try:
            expected, actual = side.read_text().split()[0], file_sha256(path)
        except (OSError, IndexError, UnicodeDecodeError) as exc:
            log.warning(
                "resume: %s has no readable checksum (%s); trying the previous state",
                path,
                str(exc).splitlines()[0] if str(exc) else "empty",
            )
            continue
        if actual != expected:
            log.warning(
                "resume: %s does not match its checksum %s (damaged); trying the previous state", path, side.name
            )
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file means: try the previous one
            log.warning("resume: %s is unreadable (%s); trying the previous state", path, str(exc).splitlines()[0])
            continue
        problem = state_problem(state)
        if problem is None and state["fingerprint"] != fingerprint:
            raise UserError(
                f"{path}: resumable state of a run with other settings; delete {path.parent} to start afresh"
            )
        problem = problem or state_problem(state, required) or (check(state) if check is not None else None)
        if problem:
            log.warning(
                "resume: %s %s (not a state this run can resume from); trying the previous state",
                path,
                " ".join(str(problem).split()),
            )
            continue
        return state
    return None


def rng_state(device: torch.device) -> dict:
    """The random number generators' state a resumable state holds: the CPU's and the CUDA device's."""
    st = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def set_rng_state(st: dict, device: torch.device) -> None:
    """Put back the state `rng_state` took."""
    torch.set_rng_state(st["cpu"])
    if device.type == "cuda" and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)
