"""decisive.md: the decisive experiments' verdicts (report.decisive.judge's result) as a page: each
promise's comparisons per cell and budget, what an undecided cell would need, PB-Relax's parts."""

from __future__ import annotations

import math

from acoustic_mlm.report.verdicts import INCONCLUSIVE, MIN_SEEDS


def to_markdown(result: dict) -> str:
    lines = [
        "# Decisive experiments: verdicts",
        "",
        f"Rules: docs/stability.md (written before the runs). Plateau U = {result['plateau_bits']:.4f} bits "
        f"(codebook-0 unigram entropy of the training codes); trained: final loss <= U - {result['plateau_margin']:g}.",
        "",
    ]
    for p in result["promises"]:
        lines += [f"## {p['id']}: **{p['verdict']}**", ""]
        if "promise" in p:
            lines += [
                f"{p['promise']} ({p['favoured']} against {p['against']}).",
                "",
                "| cell | budget | mean A | mean B | gap | resolution (2 SE, A/A) | late fall of the loser "
                "| void | trained A / B | p (A more) | p (B more) | at this budget |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for r in p["rows"]:
                lines.append(
                    f"| {r['cell']} | {r['steps']} | {_f(r['mean_a'])} | {_f(r['mean_b'])} | {_f(r['gap'], '+.3f')} "
                    f"| {_f(r['resolution'])} ({_f(2 * r['se'] if r['se'] is not None else None)}, {_f(r['aa'])}) "
                    f"| {_f(r['loser_late_fall'])} | {'yes' if r['void'] else 'no'} | {r['trained_a']}/{r['n_a']} "
                    f"/ {r['trained_b']}/{r['n_b']} | {_f(r['p_a'])} | {_f(r['p_b'])} | {r['verdict']} |"
                )
            undecided = [r for r in p["rows"] if r["verdict"] == INCONCLUSIVE]
            for r in undecided:
                need = {
                    test: int(r[f"seeds_for_{test}"])
                    for test in ("survival", "loss")
                    if r.get(f"seeds_for_{test}") is not None and math.isfinite(r[f"seeds_for_{test}"])
                }
                if r.get("too_few_seeds"):
                    lines.append(
                        f"- {r['cell']} at {r['steps']} updates: one seed in an arm, so no spread to judge a gap "
                        f"by and no estimate of the seeds needed; train at least {MIN_SEEDS} seeds per arm"
                    )
                elif need:
                    test = min(need, key=need.get)
                    n = need[test]
                    extra = 2 * n  # fresh seeds for both arms
                    hours = extra * (r.get("run_seconds") or math.nan) / 3600
                    lines.append(
                        f"- {r['cell']} at {r['steps']} updates: a fresh comparison (new seeds, not pooled "
                        f"with these) needs {n} seeds per arm ({test}) for 80 % power if the observed numbers "
                        f"were the truth: {extra} runs, about {hours:.1f} core-hours at this cell's "
                        "measured run time"
                    )
                else:
                    lines.append(
                        f"- {r['cell']} at {r['steps']} updates: no number of seeds decides it (the gap is "
                        "within the A/A floor and the trained shares are equal)"
                    )
            lines += (
                [""]
                + [
                    f"- {c['cell']}: **{c['verdict']}** (budgets {', '.join(str(b) for b in c['budgets'])}: "
                    f"{', '.join(f'{k} {v}' for k, v in c['at_budget'].items())}"
                    f"{'' if c['two_budgets'] else '; one budget: an indication, not a verdict'})"
                    for c in p["cells"]
                ]
                + [""]
            )
        elif p["id"] == "pb_relax_training":
            lines += [
                "| qk_gain | arm | runs | failed | reached 65,504 | largest logit | final loss |",
                "| --- | --- | --- | --- | --- | --- | --- |",
            ]
            for gain, row in p["by_gain"].items():
                for arm in ("unfused", "fused", "pb_relax"):
                    x = row[arm]
                    lines.append(
                        f"| {gain} | {arm} | {x['runs']} | {x['failed']} | {x['reached']} "
                        f"| {_f(x['largest_logit'], '.4g')} | {_f(x['final_loss'])} |"
                    )
            lines.append("")
        elif "unfused_fails_at" in p:
            fails = ", ".join(f"{x:g}" for x in p["unfused_fails_at"]) or "none"
            good = ", ".join(f"{x:g}" for x in p["pb_relax_good_at"]) or "none"
            lines += [
                f"Largest logits where the unfused order returns a non-finite output or gradient: {fails}; "
                f"where PB-Relax is finite with a relative error below 1e-2 there: {good} "
                "(benchmarks/attention_fp16.py's table).",
                "",
            ]
        else:
            lines += [p.get("note", ""), ""]
    return "\n".join(lines) + "\n"


def _f(x, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)
