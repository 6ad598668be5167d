"""Live curves: a run's metrics rows sent to the trackers researchers watch (`train.loggers`).

    csv          always: metrics.partial.csv while a seed trains, metrics.csv at the end (train/loop.py);
                 the source of every figure and of `amlm status`
    tensorboard  event files in <run>/seeds/seed<S>/tensorboard/ (`tensorboard --logdir results/runs`),
                 one scalar per metrics column, tagged with the column's name, at the row's step
    wandb        Weights & Biases (`pip install -e ".[wandb]"`): project train.wandb_project, run
                 "<arm>-seed<S>" grouped by arm, files under <run>/seeds/seed<S>/wandb/; WANDB_MODE=offline
                 keeps it on disk (`wandb sync` uploads it later)

Only the first process (rank 0) opens trackers, and they see a row only when train/loop.py writes one
(every train.log_interval steps): never a training step. A tracker that raises (a full disk, no
network) is dropped with one warning and the run goes on; the CSV holds every row regardless.
A tracker named in the config that cannot be imported, its package missing or installed but failing
to import (a broken install, a version clash), stops the run before it trains, in every process,
with one line naming the logger and the import error (check_available).
"""

from __future__ import annotations

import numbers
from pathlib import Path

from acoustic_mlm import config as C
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.errors import UserError, one_line
from acoustic_mlm.utils import log

TENSORBOARD_DIR = "tensorboard"  # in the seed's folder


class _TensorBoard:
    """torch.utils.tensorboard's SummaryWriter (needs the `tensorboard` package, a dependency)."""

    name = "tensorboard"

    def __init__(self, seed_dir: Path, run_name: str, seed: int, cfg: C.Config):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(seed_dir) / TENSORBOARD_DIR))

    def log(self, row: dict) -> None:
        step = int(row[M.STEP])
        for key, value in row.items():
            if key != M.STEP and isinstance(value, numbers.Real):
                self.writer.add_scalar(key, float(value), step)
        self.writer.flush()  # visible to a running TensorBoard at once; rows are seconds to minutes apart

    def close(self) -> None:
        self.writer.close()


class _WandB:
    """wandb.init / log / finish; the mode (online, offline, disabled) comes from WANDB_MODE as usual."""

    name = "wandb"

    def __init__(self, seed_dir: Path, run_name: str, seed: int, cfg: C.Config):
        import wandb

        Path(seed_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=cfg.train.wandb_project,
            name=f"{run_name}-seed{seed}",
            group=run_name,
            job_type="train",
            dir=str(seed_dir),
            config=cfg.settings_dict(),
            reinit="create_new",
        )

    def log(self, row: dict) -> None:
        values = {k: float(v) for k, v in row.items() if k != M.STEP and isinstance(v, numbers.Real)}
        self.run.log(values, step=int(row[M.STEP]))

    def close(self) -> None:
        self.run.finish()


_BACKENDS = {"tensorboard": _TensorBoard, "wandb": _WandB}
# logger -> (the module its backend imports, the package that provides it, how to install it)
_PACKAGES = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", "wandb", 'pip install -e ".[wandb]"'),
}


def check_available(loggers) -> None:
    """Stop before training when a named tracker cannot be imported: its package missing, or installed
    but failing to import (any error while importing it). One UserError line naming the logger, the
    package and the import error; the same for both, so a run never trains without a tracker it asked for."""
    import importlib

    for name in loggers:
        if name not in _PACKAGES:
            continue
        module, package, install = _PACKAGES[name]
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - whatever importing it raises, the tracker cannot start
            missing = isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == package
            if missing:
                raise UserError(
                    f"'train.loggers' names {name}, whose package {package!r} is not installed "
                    f"({type(exc).__name__}: {one_line(exc)}): {install} (or remove {name} from "
                    "train.loggers)"
                ) from None
            raise UserError(
                f"'train.loggers' names {name}, whose package {package!r} is installed but fails to "
                f"import ({type(exc).__name__}: {one_line(exc)}); repair or reinstall it ({install}), "
                f"or remove {name} from train.loggers"
            ) from None


class Trackers:
    """The trackers of one seed beside the CSV; a context manager that closes them.

    `Trackers(cfg, run_name, seed, seed_dir, enabled=rank == 0)`; `log(row)` at each metrics row.
    """

    def __init__(self, cfg: C.Config, run_name: str, seed: int, seed_dir: Path, enabled: bool = True, backends=None):
        names = [n for n in cfg.train.loggers if n != "csv"] if enabled else []
        if names:
            check_available(names)
        backends = backends if backends is not None else _BACKENDS
        self.active = []
        for name in names:
            try:
                self.active.append(backends[name](Path(seed_dir), run_name, seed, cfg))
            except Exception as exc:  # noqa: BLE001 - a tracker must never stop training
                self._warn(name, "could not start", exc)

    @staticmethod
    def _warn(name: str, what: str, exc: BaseException) -> None:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning("tracker %s %s (%s); training goes on without it, metrics.csv keeps every row", name, what, first)

    def log(self, row: dict) -> None:
        """One metrics row to every tracker still running; one that raises is dropped with a warning."""
        for tracker in list(self.active):
            try:
                tracker.log(row)
            except Exception as exc:  # noqa: BLE001
                self._warn(tracker.name, "failed", exc)
                self.active.remove(tracker)
                self._close(tracker)

    def _close(self, tracker) -> None:
        try:
            tracker.close()
        except Exception:  # noqa: BLE001 - already warned, or closing at the end: nothing to save
            pass

    def close(self) -> None:
        for tracker in self.active:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001
                self._warn(tracker.name, "could not close", exc)
        self.active = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
