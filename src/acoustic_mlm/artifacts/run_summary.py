"""A run's summary.json, written last by the train stage (it marks a seed, then the arm, complete):
its keys, its statuses, its writer and its checked readers. Training computes the summaries
(acoustic_mlm.train.summary: summarize, summarize_arm) and writes them through `write_summary`;
resuming, `amlm status`, `amlm verify`, the stability map and the decisive experiments read them here.

    <run>/seeds/seed<S>/summary.json   one seed: run, label, seed, steps, status (SEED_STATUSES),
                                       diverged_at_step, final_train_loss_cb0 and final_valid_loss_cb0
                                       (curves.final_loss), first_train_loss_cb0, max_grad_norm,
                                       clipped_frac, nonfinite_steps, overflow_skips, wall_time_s,
                                       stop_reason (a number the seed never had, as the final losses of
                                       one that diverged before any finite loss, is null), and
                                       `fingerprint` (the settings that shape its numbers and the process
                                       count: train.state.fingerprint); read_seed_summary, read_seed_status
    <run>/summary.json                 one arm: run, label, seeds, status (the worst of its seeds'),
                                       nonfinite_steps, the mean final losses and the spread of the final
                                       training loss, `per_seed` (each seed's summary without its
                                       fingerprint), `settings` (what the run was trained with, as
                                       {dotted key: value}: reports read it here, never from a
                                       configuration) and cpu_kernels; read_arm_summary, arm_settings
"""

from __future__ import annotations

import math
from pathlib import Path

from acoustic_mlm.artifacts.checked import ReadError, check_choice, read_json, rerun_advice, short_value
from acoustic_mlm.utils import write_json

SUMMARY = "summary.json"
COMPLETED, COMPLETED_WITH_NONFINITE, DIVERGED = SEED_STATUSES = ("completed", "completed_with_nonfinite", "diverged")
# completed_with_nonfinite: every step ran, some updates skipped as non-finite; the statuses go from best to worst
SEED_SUMMARY_KEYS = {
    "status": str,
    "nonfinite_steps": int,
    "fingerprint": dict,
}
# null only in a diverged seed's summary: one that diverged before any finite loss has no final loss
FINAL_LOSS_KEYS = ("final_train_loss_cb0", "final_valid_loss_cb0")
ARM_SUMMARY_KEYS = {"per_seed": dict, "run": str}


def write_summary(path: Path, summary: dict) -> None:
    """A seed's or an arm's summary.json, atomically (written last: it marks the run complete)."""
    write_json(path, summary)


def read_seed_summary(path: str | Path) -> dict:
    """results/runs/<run>/seeds/seed<S>/summary.json: one seed's completed run."""
    summary = read_json(path, "a seed's summary", "train", SEED_SUMMARY_KEYS)
    check_choice(Path(path), summary, "status", SEED_STATUSES, "train")
    for key in FINAL_LOSS_KEYS:
        if key not in summary:
            raise ReadError(f"{path}: lacks '{key}'; {rerun_advice('train')}")
        number(summary, key, path, missing_ok=summary["status"] == DIVERGED)
    return summary


def number(summary: dict, key: str, path: str | Path, missing_ok: bool = True) -> float:
    """summary[key] as a float: NaN where it is null or absent (a diverged seed's final loss, an
    older summary's key) when `missing_ok`; anything else not a finite number is one ReadError line."""
    value = summary.get(key)
    if value is None and missing_ok:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReadError(f"{path}: '{key}' is {short_value(value)}, not a finite number; {rerun_advice('train')}")
    return float(value)


def whole(summary: dict, key: str, path: str | Path, default: int = 0) -> int:
    """summary[key] as a count >= 0 (`default` when absent); anything else is one ReadError line."""
    value = summary.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ReadError(f"{path}: '{key}' is {short_value(value)}, not a count >= 0; {rerun_advice('train')}")
    return value


def read_seed_status(path: str | Path) -> dict:
    """A seed's summary.json as `amlm status` needs it: its status, the steps it ran and (when
    there) its wall time, each of its kind; a file cut short or holding a control character is refused."""
    path = Path(path)
    summary = read_json(path, "a seed's summary", "train", {"status": str, "steps": int})
    check_choice(path, summary, "status", SEED_STATUSES, "train")
    if summary["steps"] < 0:
        raise ReadError(f"{path}: 'steps' is {summary['steps']}, below 0; rerun the train stage")
    wall = summary.get("wall_time_s")
    if wall is not None and (isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall)):
        raise ReadError(f"{path}: 'wall_time_s' is {short_value(wall)}, not a finite number; rerun the train stage")
    return summary


def read_arm_summary(path: str | Path, required: dict = ARM_SUMMARY_KEYS) -> dict:
    """results/runs/<run>/summary.json: one arm's completed run, a JSON object with the `required`
    keys, each of its kind (by default its `per_seed` summaries and its `run` name)."""
    path = Path(path)
    return read_json(path, f"the summary of {path.parent.name}", "train", required)


def arm_settings(summary: dict, path: str | Path) -> dict:
    """An arm summary's `settings`: what the run was trained with ({dotted key: value}); a summary
    without them (written by an older version) is one UserError line naming the file."""
    settings = summary.get("settings")
    if not isinstance(settings, dict):
        name = Path(path).parent.name
        raise ReadError(f"{path}: no 'settings' (written by an older version); rerun the train stage for {name}")
    return settings
