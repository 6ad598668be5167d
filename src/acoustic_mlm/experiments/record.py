"""A round's run table: one record per run (`runs.csv`), its columns declared once, read only through
the package's checked reader and checked against the round's plan before anything is judged.

The three words every round's rules use have one definition each, here:

    trained     the run's final codebook-0 loss is at least PLATEAU_MARGIN bits below the plateau U
                (the codes' unigram entropy): it learned what the visible frames say
    collapsed   not trained, though its lowest loss reached that line: it learned, then fell back
    unstable    a spike after warm-up (SPIKE_THRESHOLD bits above the running minimum, on the averaged
                rows), a failed run (not completed, or a non-finite update), a collapse, or attention-
                logit growth (its last logit at least LOGIT_GROWTH times a reference run's and its final
                loss LOGIT_LOSS_COST bits above that run's)

A table whose `trained` or `collapsed` column disagrees with these definitions is refused: the column
is what the rules count, and a row edited by hand would otherwise decide a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.artifacts.checked import ReadError, read_csv_table
from acoustic_mlm.report.decisive import PLATEAU_MARGIN, SPIKE_THRESHOLD

LOGIT_GROWTH, LOGIT_LOSS_COST = 10.0, 0.5  # instability (iv): logit growth at a cost in loss
STAGE = "amlm experiment"  # what a refusal tells the user to rerun
STATUSES = ("completed", "completed_with_nonfinite", "diverged")  # the package's words (run_summary)
BOOLS = ("True", "False")


@dataclass(frozen=True)
class Column:
    """One column of a round's runs.csv: its name, its kind (text, int, number, bool, choice) and,
    for a choice, the values it may hold."""

    name: str
    kind: str
    allowed: tuple[str, ...] = ()


# The run record: every round's runs.csv has these columns (the fp16 rounds add FP16_COLUMNS).
RUN_RECORD: tuple[Column, ...] = (
    Column("round", "int"),
    Column("size", "text"),
    Column("arm", "text"),
    Column("lr", "finite"),
    Column("seed", "int"),
    Column("dim", "int"),
    Column("layers", "int"),
    Column("ffn_dim", "int"),
    Column("steps", "int"),
    Column("batch_size", "int"),
    Column("norm", "choice", ("pre", "post", "deepnorm")),
    Column("attention", "choice", ("softmax", "pb_relax", "unfused", "qk_norm")),
    Column("clip", "finite"),
    Column("warmup_steps", "int"),
    Column("status", "choice", STATUSES),
    Column("plateau", "finite"),
    Column("first_loss", "number"),
    Column("final_loss", "number"),
    Column("lowest_loss", "number"),
    Column("lowest_step", "number"),
    Column("cross_step", "number"),
    Column("left_plateau", "bool"),
    Column("trained", "bool"),
    Column("collapsed", "bool"),
    Column("spikes", "int"),
    Column("largest_spike_bits", "finite"),
    Column("late_spikes", "int"),
    Column("largest_late_spike_bits", "finite"),
    Column("nonfinite_steps", "int"),
    Column("max_grad_norm", "number"),
    Column("attn_logit_max", "number"),
    Column("attn_logit_final", "number"),
    Column("wall_time_s", "finite"),
)
FP16_COLUMNS: tuple[Column, ...] = (
    Column("qk_gain", "finite"),
    Column("updates", "int"),
    Column("lowest_loss_scale", "number"),
    Column("overflow_skips", "int"),
    Column("stop_reason", "text"),
)
KEY = ("size", "arm", "lr", "seed")  # one run of a round


def columns(fp16: bool = False) -> list[Column]:
    return list(RUN_RECORD) + (list(FP16_COLUMNS) if fp16 else [])


def read_runs(path: Path, fp16: bool = False) -> pd.DataFrame:
    """A round's runs.csv through the checked reader: every column of the record, whole numbers whole,
    numbers finite where the record says so, the package's words in its word columns, True/False in
    its flags, no repeated run, and `trained`/`collapsed` as defined above. Any fault: one ReadError line."""
    cols = columns(fp16)
    table = read_csv_table(
        Path(path),
        "table of a round's runs",
        STAGE,
        [c.name for c in cols],
        ints=[c.name for c in cols if c.kind == "int"],
        numbers=[c.name for c in cols if c.kind == "number"],
        finite=[c.name for c in cols if c.kind == "finite"],
        choices={c.name: c.allowed or BOOLS for c in cols if c.kind in ("choice", "bool")},
    )
    for c in cols:
        if c.kind == "bool":
            table[c.name] = table[c.name] == "True"
    _check_unique(Path(path), table)
    _check_words(Path(path), table)
    return table


def _check_unique(path: Path, table: pd.DataFrame) -> None:
    """No run twice: a (size, arm, rate, seed) of one round in two rows would count one seed twice."""
    key = table[["round", *KEY]].assign(lr=table["lr"].map(lambda x: f"{x:.12g}"))
    dup = key.duplicated(keep="first").to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        r = table.iloc[i]
        raise ReadError(
            f"{path}: row {i + 2} repeats round {r['round']} {r['size']} {r['arm']} lr {r['lr']:g} seed "
            f"{r['seed']}; a run is counted once: remove the repeated row"
        )


def _check_words(path: Path, table: pd.DataFrame) -> None:
    """`trained` and `collapsed` as this module defines them, from the row's own losses."""
    line = table["plateau"] - PLATEAU_MARGIN
    final = table["final_loss"].to_numpy(dtype=float)
    lowest = table["lowest_loss"].to_numpy(dtype=float)
    trained = np.isfinite(final) & (final <= line.to_numpy())
    collapsed = ~trained & np.isfinite(lowest) & (lowest <= line.to_numpy())
    for name, want in (("trained", trained), ("collapsed", collapsed)):
        bad = table[name].to_numpy() != want
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ReadError(
                f"{path}: row {i + 2}: '{name}' is {table[name].iloc[i]} but its losses (final "
                f"{final[i]:.4g}, lowest {lowest[i]:.4g}, plateau {table['plateau'].iloc[i]:.4g}) say "
                f"{bool(want[i])}; {STAGE} reads the table as written by its rules: restore the row"
            )


# ----------------------------------------------------------------------------- the words


def trained(runs: pd.DataFrame) -> pd.Series:
    """The primary outcome of the pairs rounds: the run ended at least PLATEAU_MARGIN below U."""
    return runs["trained"].astype(bool)


def trained_through(runs: pd.DataFrame, steps: int) -> pd.Series:
    """The fp16 rounds' outcome: the run went through all its `steps` updates (not stopped by the loss
    scaler's floor or by a streak of non-finite losses) and was trained. A run stopped early is not
    trained, whatever its last finite loss was."""
    completed = runs["status"].isin(["completed", "completed_with_nonfinite"]) & (runs["updates"] == steps)
    return completed & trained(runs)


def collapsed(runs: pd.DataFrame) -> pd.Series:
    """Left the plateau (crossed U - 1 at some logged step) and did not end trained."""
    return runs["left_plateau"].astype(bool) & ~trained(runs)


def unstable(
    runs: pd.DataFrame, ref_logit: pd.Series | float, ref_loss: pd.Series | float, late_only: bool = True
) -> pd.Series:
    """Each run's instability, (i)-(iv) of docs/stability.md: a spike (after warm-up, on the averaged
    rows, with `late_only`; any spike without), a failure, a collapse, or logit growth against the
    reference run(s) (a number, or a value per row)."""
    spike = runs["largest_late_spike_bits" if late_only else "largest_spike_bits"] >= SPIKE_THRESHOLD
    failed = (runs["status"] != "completed") | (runs["nonfinite_steps"] > 0)
    growth = (runs["attn_logit_final"] >= LOGIT_GROWTH * ref_logit) & (runs["final_loss"] >= ref_loss + LOGIT_LOSS_COST)
    return spike | failed | collapsed(runs) | growth.fillna(False)


# ----------------------------------------------------------------------------- against the plan


def check_plan(path: Path, runs: pd.DataFrame, planned: list[tuple[str, str, float, int]], partial: bool) -> None:
    """Every row of the round is a planned run, and (unless `partial`) every planned run is in: a row
    outside the plan, or a planned run lost from the table, is one ReadError line naming it."""
    have = {(r.size, r.arm, _rate(r.lr), int(r.seed)): i for i, r in enumerate(runs.itertuples())}
    plan = {(s, a, _rate(lr), int(seed)) for s, a, lr, seed in planned}
    for key, i in have.items():
        if key not in plan:
            raise ReadError(
                f"{path}: row {i + 2} ({key[0]} {key[1]} lr {key[2]} seed {key[3]}) is not in the round's "
                "plan; a round judges only the runs it declared: remove the row or declare the run"
            )
    lost = sorted(plan - set(have))
    if lost and not partial:
        s, a, lr, seed = lost[0]
        raise ReadError(
            f"{path}: {len(lost)} planned run(s) missing, the first {s} {a} lr {lr} seed {seed}; train them "
            "(the round is not finished) or judge with --partial"
        )


def _rate(lr: float) -> str:
    return f"{float(lr):.12g}"
