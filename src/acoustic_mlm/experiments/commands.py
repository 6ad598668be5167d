"""`amlm experiment`: a round's plan, its standing against git, and its verdicts (experiments.judge)."""

from __future__ import annotations

import json
from pathlib import Path

from acoustic_mlm.config.cli_options import command, opt
from acoustic_mlm.errors import UserError


@command(
    "experiment",
    opt(
        "verb",
        type=None,
        choices=("plan", "run", "status", "judge"),
        help="plan: runs and cost; run: train the planned runs its tables lack; status: the declaration against "
        "git; judge: verdicts from the round's tables",
    ),
    opt("round", metavar="ROUND_YAML", help="the round's declaration (config/experiments/<round>.yaml)"),
    opt("--out", help="judge: output folder (default: results/experiments/<round>)"),
    opt(
        "--partial",
        action="store_true",
        help="judge: a round not finished yet (parts without all runs: 'not finished')",
    ),
    opt("--figure", help="judge: also draw the round's sensitivity curves to this image"),
    opt("--work", default=Path("results/experiments/work"), help="run: corpus and run folders (default: %(default)s)"),
    opt("--limit", type=int, help="run: train at most this many runs, then stop (default: every planned run)"),
    opt(
        "--shard",
        type=None,
        metavar="K/N",
        help="run: only the planned runs whose place in the plan is K modulo N (N runners side by side, K = 0..N-1)",
    ),
    opt(
        "--only",
        type=None,
        metavar="CELL/ARM/LR/SEED",
        help="run: only this planned run (nothing if its tables hold it): the Snakemake route's one job a run",
    ),
    opt(
        "--done",
        needs="--only",
        help="run: with --only, write this empty file once the run is in the tables (a job's marker)",
    ),
    folders=("out",),
    files=("figure", "done"),
    reads_config=False,  # the round's declaration names its base preset
)
def experiment_command(args, _cfg) -> None:
    """plan, run, check and judge a round of experiments

    A round is a declaration (config/experiments/<round>.yaml): base preset and size, arms, cells, seeds, promises
    with their test, alpha and family. plan lists its runs with their counted cost and which are done; run trains
    the planned runs its tables lack, one at a time, appending each run's record (a sizing round: its adaptive
    procedure, experiments.sizing); status says whether the declaration was committed before the round's first
    runs; judge reads the round's tables through the checked reader, checks every row against the plan and writes
    the verdicts (docs/stability.md).
    """
    from acoustic_mlm.experiments import declaration, judge

    if args.verb == "judge":
        result = judge.judge(args.round, args.out, partial=args.partial, figure=args.figure)
        print(json.dumps(result["verdict"], indent=2))
        for path in result["written"]:
            print(f"wrote {path}")
        return
    if args.verb == "run":
        from acoustic_mlm.experiments import runner

        if args.limit is not None and args.limit < 1:
            raise UserError(f"--limit must be a positive number of runs, not {args.limit}")
        shard = None
        if args.shard is not None:
            k, _, n = args.shard.partition("/")
            if not (k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
                raise UserError(f"--shard is {args.shard!r}, not K/N with 0 <= K < N (for example 0/2)")
            shard = (int(k), int(n))
        written = runner.run_round(Path(args.round), args.work, limit=args.limit, shard=shard, only=args.only)
        print(f"{len(written)} run(s) trained and recorded")
        if args.done is not None:
            from acoustic_mlm.utils import atomic_path

            with atomic_path(Path(args.done)) as tmp:
                tmp.write_text("")
        return
    if args.verb == "status":
        print(json.dumps(judge.git_status(Path(args.round)), indent=2))
        return
    rnd = declaration.load(args.round)
    rows = judge.cost_rows(rnd)
    for r in rows:
        state = "done" if r["done"] else "to run"
        print(f"{r['cell']:>14} {r['arm']:<26} lr {r['lr']:<7g} seed {r['seed']:<5} {r['tflop']:9.2f} TFLOP  {state}")
    left = [r for r in rows if not r["done"]]
    total = sum(r["tflop"] for r in left)
    print(f"{rnd.name}: {len(rows)} runs planned, {len(rows) - len(left)} done, {len(left)} to run ({total:.1f} TFLOP)")
