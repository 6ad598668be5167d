"""Does `amlm preflight` predict what `amlm train` takes? Both on the same preset, arm and micro-batch, in one
invocation.

Preflight's ms per update (the preset's micro-batch, measured on synthetic inputs with
`train.update.build_trainer` / `train.update.update`) against the ms per update that `amlm train` logs
(metrics.csv's wall_time between its first and last rows, divided by the updates between them: it
includes data loading and the validation passes at the rows in between, which preflight leaves
out). The data are a prepared corpus and its codes (the smoke pipeline's, for example).

    python benchmarks/preflight_vs_train.py --config config/smoke.yaml --prepared data/prepared --codes data/codes
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm.preflight import run as preflight
from acoustic_mlm.train import loop as train
from acoustic_mlm.utils import benchmark_header, write_result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="config/smoke.yaml")
    p.add_argument("--run", default="prenorm_clip1", help="the arm (default: %(default)s)")
    p.add_argument("--prepared", type=Path, default=Path("data/prepared"))
    p.add_argument("--codes", type=Path, default=Path("data/codes"))
    p.add_argument("--steps", type=int, default=60, help="updates amlm train runs (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    settings = C.read_yaml(args.config)  # the file's mapping, edited to one arm and seed as a user edits the file
    C.load(args.config).run(args.run)  # the preset itself is valid and has the arm (one line if not)
    one = copy.deepcopy(settings)
    one["runs"] = {args.run: settings["runs"][args.run]}
    one["runs"][args.run]["seeds"] = one["runs"][args.run]["seeds"][:1]
    one["train"].update(steps=args.steps, checkpoint_interval=0, log_interval=max(1, args.steps // 4))
    one = C.from_mapping(one, source=f"{args.config} with one arm, {args.steps} steps")
    with tempfile.TemporaryDirectory() as tmp:
        pf = preflight.run(one, args.config, Path(tmp) / "preflight", preflight.Options(threads=args.threads))
        train.run(one, args.run, args.prepared, args.codes, Path(tmp) / "run", threads=args.threads)
        rows = pd.read_csv(Path(tmp) / "run" / "metrics.csv")
    first, last = rows.iloc[0], rows.iloc[-1]
    train_ms = 1000 * (last["wall_time"] - first["wall_time"]) / (last["step"] - first["step"])
    arm = pf["arms"][0]
    result = {
        **benchmark_header(__file__, argv),
        "config": args.config,
        "run": args.run,
        "precision": pf["precision"],
        "micro_batch": pf["micro_batch"],
        "accum_steps": pf["accum_steps"],
        "preflight_ms_per_update": arm["ms_per_update"],
        "preflight_source": arm["update_source"],
        "train_ms_per_update": train_ms,
        "train_updates_timed": int(last["step"] - first["step"]),
        "ratio_train_to_preflight": train_ms / arm["ms_per_update"],
    }
    print(
        f"{args.config} {args.run} ({pf['precision']}, micro-batch {pf['micro_batch']} x {pf['accum_steps']}): "
        f"preflight {arm['ms_per_update']:.1f} ms/update ({arm['update_source']}), amlm train "
        f"{train_ms:.1f} ms/update over {result['train_updates_timed']} updates: "
        f"ratio {result['ratio_train_to_preflight']:.2f}"
    )
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
