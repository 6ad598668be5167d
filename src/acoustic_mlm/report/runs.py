"""One reader of run folders: what the stability map, the decisive experiments, `amlm status` and
`amlm verify` read of the runs training wrote, through the artifact modules (artifacts.metrics,
artifacts.run_summary), with one line naming the file and key for anything damaged.

    <runs>/<run>/summary.json, metrics.csv    a finished arm or sweep point: read_run_folder gives
                                              its summary, the settings it was trained with and its
                                              metrics; RunFolder.seed_run one seed of it
    <runs>/<run>/seeds/seed<S>/               one seed's own files (seed_dir): summary.json and
                                              metrics.csv once it ends, metrics.partial.csv while it trains
    <runs>/<run>/<STATE_DIR>/seed<S>/         a training seed's resumable states (seed_state_dir)

Which runs and seeds a configuration trains is `config_runs`; the finished folders a results folder
holds, whatever trained them, `finished_run_folders`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.checked import ReadError, short_value
from acoustic_mlm.artifacts.run_summary import (
    ARM_SUMMARY_KEYS,
    SEED_STATUSES,
    SUMMARY,
    arm_settings,
    number,
    read_arm_summary,
    whole,
)
from acoustic_mlm.errors import UserError
from acoustic_mlm.folder_lock import folder_busy
from acoustic_mlm.train.state import STATE_DIR

SEEDS_DIR = "seeds"  # a run folder's per-seed folders


def seed_dir(run_dir: Path, seed: int) -> Path:
    """A seed's own folder in a run folder: <run>/seeds/seed<S>."""
    return Path(run_dir) / SEEDS_DIR / f"seed{seed}"


def seed_state_dir(run_dir: Path, seed: int) -> Path:
    """A seed's resumable states in a run folder: <run>/<STATE_DIR>/seed<S>."""
    return Path(run_dir) / STATE_DIR / f"seed{seed}"


def config_runs(cfg: C.Config) -> list[tuple[str, tuple[int, ...], int]]:
    """(run, its seeds, its train.steps) for every run the configuration trains, in order: the sweep's
    points (each with its own seeds and, when swept, its own train.steps), else the arms."""
    pts = cfg.points
    if not pts:
        total = int(cfg.train.steps)
        return [(run, tuple(r.seeds), total) for run, r in cfg.runs.items()]
    return [(name, p.seeds, int(p.settings.get("train.steps", cfg.train.steps))) for name, p in pts.items()]


def finished_run_folders(runs_dir: Path, command: str) -> list[Path]:
    """The run folders under runs_dir that hold a summary.json, for `command` (which judges finished
    runs only); a folder training has begun but not finished (seeds or resumable states, no
    summary.json), or one a train is writing now, is refused, not left out."""
    if not runs_dir.is_dir():
        what = "is not a folder" if runs_dir.exists() else "does not exist"
        raise UserError(f"{runs_dir}: --runs-dir {what}; name the folder the sweep's runs were trained into")
    done, unfinished = [], []
    for child in sorted(runs_dir.iterdir()):
        if child.name.startswith(".") or not child.is_dir():  # temporary names of atomic outputs
            continue
        busy = folder_busy(child)  # a train writing it now, even over an earlier summary.json
        if busy:
            raise UserError(
                f"{child}: {busy} is writing this run folder now; {command} judges finished runs only: let it finish"
            )
        if (child / SUMMARY).is_file():
            done.append(child)
        elif (child / SEEDS_DIR).is_dir() or (child / STATE_DIR).is_dir():
            unfinished.append(child)
    if unfinished:
        more = f" (and {len(unfinished) - 1} more)" if len(unfinished) > 1 else ""
        raise UserError(
            f"{unfinished[0]}: no summary.json yet: still training, or stopped before its end{more}; "
            f"{command} judges finished runs only: let it finish (or resume it), or move it out of {runs_dir}"
        )
    if not done:
        raise UserError(f"{runs_dir}: no run folder with a summary.json; train the experiment's points first")
    return done


@dataclass(frozen=True)
class SeedRun:
    """One seed of a finished run folder: its entry of the arm's summary.json (its status checked) and
    its rows of the arm's metrics.csv."""

    run: str  # the run folder's name
    seed: int
    summary: dict  # the arm summary's per_seed entry
    rows: pd.DataFrame  # its metrics rows, in step order
    where: Path  # the arm's summary.json: a damaged field is one line naming it

    @property
    def status(self) -> str:
        return self.summary["status"]

    def number(self, key: str) -> float:
        """A number of the seed's summary (NaN where null or absent); anything else one ReadError line."""
        return number(self.summary, key, self.where)

    def whole(self, key: str) -> int:
        """A count of the seed's summary (0 where absent); anything else one ReadError line."""
        return whole(self.summary, key, self.where)

    def attn_logit_max(self) -> float:
        """The largest attention logit of its rows (train.diagnostics), NaN where none was measured."""
        rows = self.rows
        if M.ATTN_LOGIT_MAX in rows and rows[M.ATTN_LOGIT_MAX].notna().any():
            return float(rows[M.ATTN_LOGIT_MAX].max())
        return math.nan


@dataclass(frozen=True)
class RunFolder:
    """A finished run folder: its summary.json, the settings it records and its metrics.csv."""

    path: Path
    summary: dict
    settings: dict  # {dotted key: value}, what the run was trained with
    metrics: pd.DataFrame  # every seed's rows, a seed column first

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY

    def _not_a_seed(self, key) -> ReadError:
        return ReadError(
            f"{self.summary_path}: 'per_seed.{key}' is not a seed's summary; rerun the train stage for {self.name}"
        )

    def _entry(self, key, one) -> SeedRun:
        where = self.summary_path
        if not isinstance(one, dict):
            raise self._not_a_seed(key)
        if one.get("status") not in SEED_STATUSES:
            raise ReadError(
                f"{where}: 'per_seed.{key}.status' is {short_value(one.get('status'))}, not one of "
                f"{', '.join(SEED_STATUSES)}; rerun the train stage for {self.name}"
            )
        seed = int(key)
        return SeedRun(self.name, seed, one, self.metrics[self.metrics[M.SEED] == seed], where)

    def seed_run(self, seed: int) -> SeedRun:
        """One seed the summary must hold; else one UserError line."""
        one = self.summary["per_seed"].get(str(seed))
        if one is None:
            raise UserError(f"{self.summary_path}: no seed {seed}; rerun the train stage for {self.name}")
        return self._entry(seed, one)

    def seed_runs(self) -> list[SeedRun]:
        """Every seed the summary holds, by seed; a damaged or empty `per_seed` is one ReadError line."""
        keys = []
        for key in self.summary["per_seed"]:
            if not (isinstance(key, str) and key.isdigit()):
                raise self._not_a_seed(key)
            keys.append(key)
        if not keys:
            raise ReadError(f"{self.summary_path}: 'per_seed' is empty; rerun the train stage for {self.name}")
        return [self._entry(k, self.summary["per_seed"][k]) for k in sorted(keys, key=int)]


def read_run_folder(run_dir: Path, renamed: bool = False, required: dict = ARM_SUMMARY_KEYS) -> RunFolder:
    """A finished run folder's summary.json (with the `required` keys) and metrics.csv, through their
    artifact modules; its settings under today's key names when `renamed` (config.renamed_settings).
    A metrics.csv without a seed column is one UserError line."""
    run_dir = Path(run_dir)
    summary = read_arm_summary(run_dir / SUMMARY, required)
    settings = arm_settings(summary, run_dir / SUMMARY)
    metrics = M.read_metrics(run_dir / M.METRICS)
    if M.SEED not in metrics.columns:
        raise UserError(f"{run_dir / M.METRICS}: no column '{M.SEED}'; rerun the train stage for {run_dir.name}")
    return RunFolder(run_dir, summary, C.renamed_settings(settings) if renamed else settings, metrics)


def recorded_summary(run_dir: Path) -> dict | None:
    """A run's summary.json as it is (any keys; still a checked JSON object), or None where it has none."""
    path = Path(run_dir) / SUMMARY
    return read_arm_summary(path, required={}) if path.is_file() else None


def recorded_settings(run_dir: Path) -> dict | None:
    """The settings a run recorded in its summary.json (what it was trained with), or None where it has
    no summary.json or no settings."""
    settings = (recorded_summary(run_dir) or {}).get("settings")
    return settings if isinstance(settings, dict) else None


def arm_metrics(run_dir: Path, train_advice: str) -> pd.DataFrame:
    """A run's metrics.csv (every seed's rows); one missing is one UserError line ending in
    `train_advice` (how to train it)."""
    path = Path(run_dir) / M.METRICS
    if not path.is_file():
        raise UserError(f"{path}: not found; {train_advice}")
    return M.read_metrics(path)
