"""What a stability map cost: runs per hour, per panel and in all, from a finished map.

Reads `results/stability_map.csv` (each run's own training wall time, `wall_time_s`) and, with
`--wall-seconds`, the whole pipeline's wall time (e.g. from `/usr/bin/time -v snakemake ...`), and
prints per panel the runs, their mean training time and the runs per hour one core trains, then the
map's runs per hour on all its cores and the share of the wall time spent training.

    /usr/bin/time -v snakemake --cores 2 --configfile config/proxy.yaml
    python benchmarks/map_cost.py --map results/stability_map.csv --wall-seconds 5400 --cores 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from acoustic_mlm.report import stability_map as M


def summarise(t, wall_seconds: float | None, cores: int) -> dict:
    panels = []
    for p in M.panels(t):
        g = t[M._in_panel(t, p)]
        mean = float(g["wall_time_s"].mean())
        panels.append(
            {
                "panel": p["label"],
                "runs": len(g),
                "mean_train_s": round(mean, 1),
                "runs_per_core_hour": round(3600 / mean, 1),
            }
        )
    out = {
        "runs": len(t),
        "points": int(t["run"].nunique()),
        "train_seconds": round(float(t["wall_time_s"].sum()), 1),
        "panels": panels,
    }
    if wall_seconds:
        out.update(
            wall_seconds=wall_seconds,
            runs_per_hour=round(len(t) / wall_seconds * 3600, 1),
            cores=cores,
            training_share_of_core_time=round(out["train_seconds"] / (wall_seconds * cores), 3),
        )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--map", type=Path, default=Path("results/stability_map.csv"))
    p.add_argument("--wall-seconds", type=float, default=None, help="the whole map's wall time")
    p.add_argument("--cores", type=int, default=2, help="cores the map ran on (default 2)")
    a = p.parse_args(argv)
    out = summarise(M.read_map(a.map), a.wall_seconds, a.cores)
    for row in out["panels"]:
        print(
            f"{row['panel']:>45}: {row['runs']:3d} runs, {row['mean_train_s']:7.1f} s each, "
            f"{row['runs_per_core_hour']:5.1f} runs per core-hour"
        )
    print(json.dumps({k: v for k, v in out.items() if k != "panels"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
