"""`amlm experiment plan|status|judge`: a round's runs and cost, its declaration against git, and its
verdicts from its tables alone.

judge reads the round's tables through experiments.record (the checked reader, then every row against
the plan), applies the round's rules (experiments.rules) and writes, under --out:

    <verdict>             the round's verdicts (the file name its declaration gives)
    family_<name>.json    for a round with promises in a family: every member's raw and Holm-adjusted p
                          at the family's alpha, with its estimate and 95 % Newcombe interval
    sensitivity.csv       with a sensitivity grid: each arm's final losses and LR sensitivity
    gradients.json        with a blocks.csv beside the runs: where each outcome's gradients vanish
                          (experiments.gradients)
    (decisive rules)      runs.csv, cells.csv, decisive.json, decisive.md as `amlm decide` writes them

A family's members may belong to other rounds: each is judged from its own declaration (beside this
one) and tables, and must declare the same family.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
from pathlib import Path

import pandas as pd

from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import declaration as D
from acoustic_mlm.experiments import gradients, rules
from acoustic_mlm.experiments import record as R
from acoustic_mlm.experiments.stats import holm
from acoustic_mlm.utils import atomic_path

log = logging.getLogger(__name__)


def write_verdict(path: Path, obj: dict) -> None:
    """A verdict file as the published ones are written: JSON, two-space indent, a final newline."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2) + "\n")


def plan(rnd: D.Round) -> list[tuple[str, str, float, int]]:
    """Every (cell, arm, rate, seed) the round declares (for the sizing procedure: every run it may train)."""
    by = {"pairs": rules.pairs_plan, "fp16_gains": rules.fp16_plan, "pilot": rules.pilot_plan}
    by["sizing"], by["dose_response"], by["equivalence"] = rules.sizing_plan, rules.dose_plan, rules.pairs_plan
    return by[rnd.rules](rnd) if rnd.rules in by else []


def read_round(rnd: D.Round, partial: bool) -> pd.DataFrame:
    """The round's checked runs: the record's checks, then this round's rows against its plan."""
    path = rnd.tables / "runs.csv"
    runs = R.read_runs(path, fp16=rnd.rules in ("fp16_gains", "pilot"))
    mine = runs[runs["round"] == rnd.number]
    # the sizing procedure is adaptive: its plan bounds what may run, a finished round holds a subset;
    # it reads the earlier sizing rounds' runs with its own (a later round's are not its)
    R.check_plan(path, mine, plan(rnd), partial=partial or rnd.rules == "sizing")
    return runs[runs["round"] <= rnd.number] if rnd.rules == "sizing" else mine


def counts(rnd: D.Round, runs: pd.DataFrame) -> dict[str, dict]:
    """Each confirmatory promise's raw p and trained counts (k_a, n_a, k_b, n_b), once finished."""
    if rnd.rules == "pairs":
        return {x["id"]: x for x in rules.judge_pairs(rnd, runs)["verdicts"]}
    if rnd.rules == "dose_response":
        out = {}
        for x in rules.judge_dose(rnd, runs)["verdicts"]:
            if x["role"] != "confirmatory":
                continue
            keys = ("shift_log_rate", "shift_interval_95", "interval_open", "difference", "interval_95")
            estimate = {k: x[k] for k in keys if k in x}
            out[x["id"]] = {"finished": x["finished"], "p_for": x.get("p_for"), "estimate": estimate}
        return out
    if rnd.rules == "fp16_gains":
        v = rules.judge_fp16(rnd, runs)
        (p,) = rnd.promises
        if not v["finished"]:
            return {p.id: {"finished": False}}
        n = len(rnd.seeds["high"])
        k = v["trained_high"]
        return {
            p.id: {
                "finished": True,
                "p_for": v["p_for"],
                "trained_a": k[p.favoured],
                "n_a": n,
                "trained_b": k[p.against],
                "n_b": n,
            }
        }
    return {}


def family_statement(rnd: D.Round, name: str, partial: bool = False) -> dict:
    """A family's members, each judged from its own round: raw p, Holm-adjusted p, kept at the family's
    alpha, estimate and 95 % interval. A member not finished leaves the family undecided."""
    fam = rnd.families[name]
    members, raw = [], {}
    for member in fam.members:
        round_name, pid = member.split("/")
        other = rnd if round_name == rnd.name else D.load(rnd.path.parent / f"{round_name}.yaml")
        theirs = other.families.get(name)
        if theirs is None or (theirs.alpha, theirs.members) != (fam.alpha, fam.members):
            raise UserError(
                f"{other.path}: 'families.{name}' differs from {rnd.path}'s; a family is declared alike in "
                "every round it spans"
            )
        c = counts(other, read_round(other, partial)).get(pid)
        if c is None:
            raise UserError(f"{rnd.path}: 'families.{name}.members' names {member}, not a promise of {other.path}")
        row = {"member": member, "finished": bool(c["finished"])}
        if c["finished"]:
            raw[member] = c["p_for"]
            estimate = c.get("estimate") or rules.interval(c["trained_a"], c["n_a"], c["trained_b"], c["n_b"])
            row |= {"p": c["p_for"], **estimate}
        members.append(row)
    finished = all(m["finished"] for m in members)
    adjusted = holm(raw) if finished else {}
    for m in members:
        if m["member"] in adjusted:
            m["p_holm"] = adjusted[m["member"]]
            m["kept"] = bool(adjusted[m["member"]] < fam.alpha)
    return {"family": name, "alpha": fam.alpha, "control": fam.control, "finished": finished, "members": members}


def judge(path: Path, out: Path | None = None, partial: bool = False, figure: Path | None = None) -> dict:
    """Judge the round declared at `path` from its tables; write its verdict files under `out`."""
    rnd = D.load(path)
    out = Path(out) if out is not None else Path("results") / "experiments" / rnd.name
    out.mkdir(parents=True, exist_ok=True)
    if rnd.rules == "decisive":
        from acoustic_mlm.report import decisive

        numerics = rnd.tables / "attention_fp16.csv"
        result = decisive.run(None, None, out, numerics if numerics.exists() else None, rnd.tables / "runs.csv")
        return {"verdict": result, "written": [str(out / f) for f in decisive.DECIDE_FILES]}
    if rnd.rules == "range":
        result = rules.judge_range(rnd)
        write_verdict(out / rnd.verdict, result)
        return {"verdict": result, "written": [str(out / rnd.verdict)]}
    runs = read_round(rnd, partial)
    by = {"pairs": rules.judge_pairs, "fp16_gains": rules.judge_fp16, "pilot": rules.judge_pilot}
    by["sizing"], by["dose_response"] = rules.judge_sizing, rules.judge_dose
    by["equivalence"] = rules.judge_equivalence
    result = by[rnd.rules](rnd, runs)
    write_verdict(out / rnd.verdict, result)
    written = [str(out / rnd.verdict)]
    for name in sorted({p.family for p in rnd.promises if p.family}):
        statement = family_statement(rnd, name, partial)
        write_verdict(out / f"family_{name}.json", statement)
        written.append(str(out / f"family_{name}.json"))
    if (rnd.tables / gradients.BLOCKS).exists():  # rounds from 6 on: where the gradients vanish
        summary = gradients.vanishing(gradients.read_blocks(rnd.tables / gradients.BLOCKS), runs)
        write_verdict(out / "gradients.json", summary)
        written.append(str(out / "gradients.json"))
    if rnd.sensitivity:
        with atomic_path(out / "sensitivity.csv") as tmp:
            rules.sensitivity(rnd, runs).to_csv(tmp, index=False)
        written.append(str(out / "sensitivity.csv"))
        if figure is not None:
            from acoustic_mlm.experiments.sensitivity_figure import sensitivity_figure

            written.append(str(sensitivity_figure(rnd, runs, figure)))
    return {"verdict": result, "written": written}


# ----------------------------------------------------------------------------- plan and status


def cost_rows(rnd: D.Round) -> list[dict]:
    """Each planned run with its counted training FLOPs (preflight's formula) and whether the round's
    tables already hold it."""
    from acoustic_mlm.preflight.flops import step_flops

    done = set()
    runs_csv = rnd.tables / "runs.csv"
    if runs_csv.exists():
        runs = R.read_runs(runs_csv, fp16=rnd.rules in ("fp16_gains", "pilot"))
        mine = runs[runs["round"] == rnd.number]
        done = {(r.size, r.arm, f"{r.lr:.12g}", int(r.seed)) for r in mine.itertuples()}
    rows, flops_of = [], {}
    for cell, arm, lr, seed in plan(rnd):
        key = (cell_of(rnd, cell), arm)
        if key not in flops_of and rnd.base is not None:
            cfg = D.settings(rnd, arm, key[0], seed)
            flops_of[key] = step_flops(cfg.model_for(arm), cfg.train.batch_size, cfg.crop_frames) * cfg.train.steps
        rows.append(
            {
                "cell": cell,
                "arm": arm,
                "lr": lr,
                "seed": seed,
                "tflop": flops_of.get(key, math.nan) / 1e12,
                "done": (cell, arm, f"{lr:.12g}", seed) in done,
            }
        )
    return rows


def cell_of(rnd: D.Round, size: str) -> str:
    """The cell a table's `size` stands for: the cell itself, or (the fp16 rounds name a size by its gain)
    the cell of that gain, else the cell whose gain its pilot gives."""
    if size in rnd.cells:
        return size
    for name, c in rnd.cells.items():
        if "gain" in c and rules.size_name(rnd, c["gain"]) == size:
            return name
    return next(name for name, c in rnd.cells.items() if "gain" not in c)


def git_status(path: Path) -> dict:
    """When the declaration was first committed, whether it has changed since, and the first commit of
    the round's runs.csv: pre-registered when the declaration's commit came first."""

    def git(*args) -> str:
        try:
            done = subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=path.parent)
        except (OSError, subprocess.CalledProcessError):
            return ""
        return done.stdout.strip()

    rnd = D.load(path)
    first = git("log", "--diff-filter=A", "--follow", "--format=%H %cI", "--", path.name).splitlines()
    declared = first[-1].split() if first else None
    tables = (rnd.tables / "runs.csv").resolve()
    runs_first = git("log", "--diff-filter=A", "--format=%H %cI", "--", str(tables)).splitlines()
    run_commit = runs_first[-1].split() if runs_first else None
    changed = bool(git("status", "--porcelain", "--", path.name))
    out = {
        "declaration": str(path),
        "committed": declared[1] if declared else None,
        "commit": declared[0][:12] if declared else None,
        "changed_since_commit": changed,
        "first_runs_committed": run_commit[1] if run_commit else None,
    }
    if declared is None:
        out["pre_registered"] = False
        out["reading"] = "not committed: commit the declaration before the round's first run"
    elif run_commit is None:
        out["pre_registered"] = not changed
        out["reading"] = "committed, no runs yet" + ("; changed since: commit it again" if changed else "")
    else:
        out["pre_registered"] = declared[1] <= run_commit[1] and not changed
        out["reading"] = (
            "committed before its first runs" if out["pre_registered"] else "committed after its first runs"
        )
    return out
