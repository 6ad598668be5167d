"""What a run reports: the metrics rows' training means (accumulated on the device between rows)
and the summaries of a seed and of an arm (status, final losses as curves.py defines them,
clipping). The files they go to, their columns and keys are acoustic_mlm.artifacts.metrics's and
acoustic_mlm.artifacts.run_summary's."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from acoustic_mlm import config as C
from acoustic_mlm import curves, kernels
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.run_summary import COMPLETED, COMPLETED_WITH_NONFINITE, DIVERGED, SEED_STATUSES


class Accumulator:
    """Means since the last metrics row, summed on the training device so that a step adds no
    device-to-host copy; the sums reach the host only when a row is written."""

    def __init__(self, codebooks: int):
        self.k = codebooks
        self.reset()

    def reset(self):
        self.n, self.sums, self.clipped, self.gmax = 0, None, 0, 0.0  # sums: K bits, loss, feature penalty

    def add(self, means: torch.Tensor, grad_norm: float, clipped: bool):
        # `update`'s means: K bits, the loss, the feature penalty; averaged over micro-batches and processes
        v = means.double()
        self.sums = v if self.sums is None else self.sums + v
        self.n += 1
        self.clipped += int(clipped)
        self.gmax = max(self.gmax, grad_norm) if math.isfinite(grad_norm) else self.gmax

    def state(self) -> dict:
        return {
            "n": self.n,
            "sums": None if self.sums is None else self.sums.cpu(),
            "clipped": self.clipped,
            "gmax": self.gmax,
        }

    def load(self, st: dict, device: torch.device) -> None:
        self.n, self.clipped, self.gmax = st["n"], st["clipped"], st["gmax"]
        self.sums = None if st["sums"] is None else st["sums"].to(device)

    def flush(self) -> dict:
        nan = float("nan")
        means = (self.sums / self.n).cpu().numpy() if self.n else np.full(self.k + 2, nan)
        row = {M.loss_column("train", k): float(means[k]) for k in range(self.k)}
        row.update(
            {
                M.TRAIN_LOSS: float(means[self.k]),
                M.FEATURE_PENALTY: float(means[self.k + 1]),
                M.GRAD_NORM_MAX: self.gmax if self.n else nan,
                M.CLIP_FRAC: self.clipped / self.n if self.n else nan,
            }
        )
        self.reset()
        return row


def run_status(statuses: list[str]) -> str:
    """An arm's status from its seeds': the worst of completed < completed_with_nonfinite < diverged."""
    return max(statuses, key=SEED_STATUSES.index)


def summarize(metrics: pd.DataFrame, rc: C.RunConfig, t: C.TrainConfig) -> dict:
    """Scalars for `dvc metrics show`: final losses (curves.final_loss), clipping, status."""
    finite = metrics[np.isfinite(metrics[M.FIGURE_LOSS])]  # a diverged run: its finite rows
    last = metrics.iloc[-1]
    diverged = bool(metrics[M.DIVERGED].any())
    updates = int(last[M.STEP]) - int(last[M.NONFINITE])  # updates taken: skipped steps are not updates
    nonfinite = int(last[M.NONFINITE])
    return _finite_or_none(
        {
            "run": rc.name,
            "label": rc.label,
            "seed": t.seed,
            "steps": int(last[M.STEP]),
            # a skipped non-finite update is not a clean run: say so rather than "completed"
            "status": DIVERGED if diverged else (COMPLETED_WITH_NONFINITE if nonfinite else COMPLETED),
            "diverged_at_step": int(last[M.STEP]) if diverged else None,
            # a run with no finite row (diverged at its first update, every loss NaN) has no final loss: None
            "final_train_loss_cb0": _final(finite, M.FIGURE_LOSS),
            "final_valid_loss_cb0": _final(finite, M.loss_column("valid", 0)),
            "first_train_loss_cb0": float(metrics[M.FIGURE_LOSS].iloc[0]),
            "max_grad_norm": float(metrics[M.GRAD_NORM_MAX].max()),
            "clipped_frac": curves.clipped_fraction(int(last[M.CLIPPED_STEPS]), updates),
            "nonfinite_steps": nonfinite,
            "overflow_skips": int(last[M.OVERFLOW_SKIPS]),
            "wall_time_s": float(last[M.WALL_TIME]),
        }
    )


def summarize_arm(rc: C.RunConfig, summaries: list[dict]) -> dict:
    """An arm's summary from its seeds' (`summarize`): status, non-finite steps, the mean final
    losses and the spread of the final training loss across seeds, and each seed's own summary."""
    # the seeds that have a final loss (a seed that diverged before any finite row has none)
    finals = [s["final_train_loss_cb0"] for s in summaries if s["final_train_loss_cb0"] is not None]
    valids = [s["final_valid_loss_cb0"] for s in summaries if s["final_valid_loss_cb0"] is not None]
    return {
        "run": rc.name,
        "label": rc.label,
        "seeds": list(rc.seeds),
        "status": run_status([s["status"] for s in summaries]),
        "nonfinite_steps": int(sum(s["nonfinite_steps"] for s in summaries)),
        "final_train_loss_cb0": float(np.mean(finals)) if finals else None,
        "final_valid_loss_cb0": float(np.mean(valids)) if valids else None,
        "final_train_loss_cb0_spread": float(np.max(finals) - np.min(finals)) if finals else None,
        "per_seed": {str(s["seed"]): {k: v for k, v in s.items() if k != "fingerprint"} for s in summaries},
        # what the run was trained with, so that reports read it here rather than from a configuration
        "settings": summaries[0].get("fingerprint", {}).get("settings"),
        "cpu_kernels": kernels.report(),
        # the torch threads it trained with (train.threads or --threads): a reduction split over another
        # count rounds otherwise, so `amlm verify` names it rather than blaming the installation
        "torch_threads": torch.get_num_threads(),
    }


def _final(rows: pd.DataFrame, column: str) -> float | None:
    """curves.final_loss of `column` over `rows`; None without a row."""
    return curves.final_loss(rows[M.STEP], rows[column]) if len(rows) else None


def _finite_or_none(summary: dict) -> dict:
    """A summary with every non-finite number as None: JSON has no NaN, and a diverged run's
    missing numbers (no finite loss, no gradient norm) are absent, not zero."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in summary.items()}
