"""The aggregate stage: every arm's metrics.csv into one tidy `loss_curves.csv`, and the rest of
each row (gradient norms, clipping, learning rate, the stability diagnostics) into a tidy
`diagnostics.csv` beside it (their columns, writer and readers: acoustic_mlm.artifacts.curve_tables).
Arms appear in the order of the config's `runs:` mapping (the legend order).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm import curves as curves_mod
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.curve_tables import COLUMNS, DIAGNOSTIC_COLUMNS, DIAGNOSTICS, write_table
from acoustic_mlm.artifacts.metrics import LOSS_COLUMN, METRICS, loss_columns, read_metrics
from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import log, write_json

NOT_DIAGNOSTICS = {M.SEED, M.STEP, M.TRAIN_LOSS, M.WALL_TIME}  # and every per-codebook loss column


def tidy(metrics: pd.DataFrame, run: C.RunConfig) -> pd.DataFrame:
    """One arm's wide metrics table as tidy rows, one per (step, split, codebook)."""
    loss_cols = loss_columns(metrics)
    if M.STEP not in metrics.columns or not loss_cols:
        raise UserError(f"metrics of run '{run.name}' lack '{M.STEP}' or per-codebook loss columns")
    if M.SEED not in metrics.columns:  # a single seed's own metrics file
        metrics = metrics.assign(**{M.SEED: run.seeds[0]})
    if M.NONFINITE not in metrics.columns:
        metrics = metrics.assign(**{M.NONFINITE: 0})
    long = metrics.melt(
        id_vars=[M.SEED, M.STEP, M.NONFINITE], value_vars=loss_cols, var_name="column", value_name="loss_bits"
    )
    parts = long["column"].str.extract(LOSS_COLUMN)
    long["split"], long["codebook"] = parts[0], parts[1].astype(int)
    long["run"], long["label"] = run.name, run.label
    return long[COLUMNS + [M.NONFINITE]]


def tidy_diagnostics(metrics: pd.DataFrame, run: C.RunConfig) -> pd.DataFrame:
    """One arm's non-loss metrics columns as tidy rows, one per (seed, step, diagnostic)."""
    if M.STEP not in metrics.columns:
        raise UserError(f"metrics of run '{run.name}' lack '{M.STEP}'")
    if M.SEED not in metrics.columns:
        metrics = metrics.assign(**{M.SEED: run.seeds[0]})
    cols = [c for c in metrics.columns if c not in NOT_DIAGNOSTICS and not LOSS_COLUMN.match(c)]
    long = metrics.melt(id_vars=[M.SEED, M.STEP], value_vars=cols, var_name="diagnostic", value_name="value")
    long["run"], long["label"] = run.name, run.label
    return long[DIAGNOSTIC_COLUMNS]


def run(
    cfg: C.Config,
    runs_dir: Path,
    out_path: Path,
    diagnostics_path: Path | None = None,
    finals_path: Path | None = None,
) -> pd.DataFrame:
    """Write loss_curves.csv to out_path and diagnostics.csv beside it (or to diagnostics_path);
    with finals_path, also each arm's final codebook-0 loss under a short name (final_losses)."""
    check_runs_dir(Path(runs_dir))
    frames, diag = [], []
    for name in cfg.runs:
        path = Path(runs_dir) / name / METRICS
        if not path.is_file():
            raise UserError(f"{path}: metrics of run '{name}' not found; train it first")
        metrics, rc = read_metrics(path), cfg.run(name)
        frames.append(tidy(metrics, rc))
        diag.append(tidy_diagnostics(metrics, rc))
    curves = pd.concat(frames, ignore_index=True)
    curves = curves.sort_values(["run", "seed", "split", "codebook", "step"], key=_run_order(cfg), kind="stable")
    diagnostics = pd.concat(diag, ignore_index=True)
    diagnostics = diagnostics.sort_values(["run", "seed", "diagnostic", "step"], key=_run_order(cfg), kind="stable")
    diagnostics_path = Path(diagnostics_path) if diagnostics_path else Path(out_path).with_name(DIAGNOSTICS)
    write_table(diagnostics, diagnostics_path)
    if finals_path is not None:
        write_json(finals_path, final_losses(cfg.runs, curves))
    write_table(curves, out_path)  # last: the stage's declared first output
    log.info(
        "aggregate: %d rows from %d runs -> %s, %d diagnostics rows -> %s",
        len(curves),
        len(frames),
        out_path,
        len(diagnostics),
        diagnostics_path,
    )
    return curves


def check_runs_dir(runs_dir: Path) -> None:
    """The runs folder exists and is a folder: a mistyped --runs-dir is named as such, not as runs to train."""
    if runs_dir.is_dir():
        return
    what = "is not a folder" if runs_dir.exists() else "is a broken link" if runs_dir.is_symlink() else "does not exist"
    raise UserError(
        f"{runs_dir}: the runs folder (--runs-dir) {what}; name the folder training wrote its runs into "
        "(default results/runs)"
    )


def final_losses(runs: dict[str, C.RunConfig], curves: pd.DataFrame) -> dict[str, float]:
    """Each arm's final codebook-0 training loss in bits (curves.final_loss of its finite rows, mean
    over seeds, as summary.json), keyed by its role (a short name: clip10, clip1, deepnorm, ...), or
    by its run name where it has no role or shares it: `dvc exp show`'s columns. `runs`: the config's arms."""
    roles = [r.role for r in runs.values()]
    out = {}
    for name, role in zip(runs, roles):
        g = curves[(curves["run"] == name) & (curves["split"] == "train") & (curves["codebook"] == 0)]
        g = g[g["loss_bits"].notna() & (g["loss_bits"].abs() != float("inf"))]
        finals = [curves_mod.final_loss(s["step"], s["loss_bits"]) for _, s in g.groupby("seed") if len(s)]
        key = role if role and roles.count(role) == 1 else name
        out[key] = round(sum(finals) / len(finals), 4) if finals else None
    return out


def _run_order(cfg: C.Config):
    order = {name: i for i, name in enumerate(cfg.runs)}

    def key(col: pd.Series) -> pd.Series:
        return col.map(order) if col.name == "run" else col

    return key
