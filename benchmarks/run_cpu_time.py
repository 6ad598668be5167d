"""A round's published run trained again, alone: its CPU seconds and whether its curve is the published one.

The sizing rules' criterion (c) is about core time, which a run's wall time on shared cores only bounds
(docs/stability.md, "Sizing a proxy, round 2: what came out"). This trains one planned run of a round
again with the package (experiments.runner.train_one: the round's declaration's settings, the tone
corpus made first, so that its making is not counted), and measures the process's CPU seconds (user and
system) and wall seconds around the training, and whether its codebook-0 training loss is the published
curve's to the bit. One row is appended to --out per run:

    size, arm, lr, seed, cpu_s, wall_s, same_curve, final_loss

    python benchmarks/run_cpu_time.py config/experiments/proxy_sizing.yaml S1/prenorm_clip1/0.05/1 \
        --work /tmp/amlm_retime --out data/reference/proxy_sizing/retime.csv
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import pandas as pd

from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import corpora, runner
from acoustic_mlm.experiments import declaration as D


def cpu_seconds() -> float:
    """This process's user and system CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def retime(rnd: D.Round, key: str, work: Path) -> dict:
    """Train the planned run named by `key` (CELL/ARM/LR/SEED) again in `work`: its time and its curve
    against the one the round's tables publish."""
    run = runner.planned_run(rnd, key)
    size, arm, lr, seed = run
    published = pd.read_csv(rnd.tables / "curves.csv")
    mine = published[
        (published["size"] == size)
        & (published["arm"] == arm)
        & np.isclose(published["lr"], lr)
        & (published["seed"] == seed)
    ]
    if mine.empty:
        raise UserError(f"{rnd.tables / 'curves.csv'}: no published curve of {key}: nothing to compare with")
    corpora.data_for(rnd.corpus, work)  # made before the clock starts
    cpu, t0 = cpu_seconds(), time.perf_counter()
    (row, curve, _), _ = runner.train_one(rnd, run, work)
    return {
        "size": size,
        "arm": arm,
        "lr": lr,
        "seed": seed,
        "cpu_s": round(cpu_seconds() - cpu, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "same_curve": bool(np.array_equal(mine["train_loss_cb0"].to_numpy(), curve["train_loss_cb0"].to_numpy())),
        "final_loss": row["final_loss"],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("round", type=Path, help="the round's declaration (config/experiments/<round>.yaml)")
    ap.add_argument("runs", nargs="+", metavar="CELL/ARM/LR/SEED", help="planned runs, as amlm experiment plan")
    ap.add_argument("--work", type=Path, default=Path("/tmp/amlm_retime"), help="corpus and run folders")
    ap.add_argument("--out", type=Path, required=True, help="the CSV the rows are appended to")
    args = ap.parse_args(argv)
    rnd = D.load(args.round)
    rows = []
    for key in args.runs:
        row = retime(rnd, key, args.work)
        with runner.locked(args.out.parent):
            runner.append(args.out, pd.DataFrame([row]), list(row))
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
