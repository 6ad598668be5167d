"""claims.md: the claims as a table with their notes (`to_markdown`) and what the diagnostics show at
each spike (`spikes_markdown`). It only writes out the numbers the claims stage measured (the dicts of
claims.json).
"""

from __future__ import annotations

from acoustic_mlm.report.spike_diagnostics import BASELINE_ROWS, SKIP_NAMES, UNUSUAL_FACTOR


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return str(v)


def measured_text(measured: dict) -> str:
    """One line per measured quantity, for the markdown table (per-seed detail is in the JSON)."""
    parts = []
    for key, val in measured.items():
        if key.endswith("_per_seed") or key == "seeds":  # seeds: in the header; per seed: in the JSON
            continue
        if key == "spike":
            val = {f"seed {k}": _spike_text(v) for k, v in val.items()}
        if isinstance(val, dict):
            per_seed = measured.get(f"{key}_per_seed", {})
            inner = ", ".join(f"{k} {_fmt(v)}{_range_text(per_seed.get(k))}" for k, v in val.items()) or "none"
            parts.append(f"{key}: {inner}")
        elif isinstance(val, list):
            parts.append(f"{key}: {', '.join(_fmt(v) for v in val)}")
        else:
            parts.append(f"{key}: {_fmt(val)}")
    return "<br>".join(parts)


def _range_text(per_seed: dict | None) -> str:
    """ " (min-max)" over seeds when there are several, else ""."""
    v = [x for x in (per_seed or {}).values() if x is not None]
    return f" ({_fmt(min(v))}-{_fmt(max(v))})" if len(v) > 1 else ""


def _spike_text(k: dict | None) -> str:
    if k is None:
        return "none"
    back = f"recovered at {k['recovery_step']}" if k["recovery_step"] is not None else "not recovered"
    return f"+{k['height_bits']:.2f} bits at step {k['peak_step']}, {back}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(claims: list[dict], header: dict, paper_verdicts: dict[str, str] | None = None) -> str:
    lines = [
        "# Findings: the figure's claims on the reproduced curves",
        "",
        f"Source: `{header['curves']}`, codebook 0, split `{header['split']}`; seeds per run: "
        + ", ".join(f"`{r}` {n}" for r, n in header["n_seeds"].items())
        + ".",
        "Thresholds: " + ", ".join(f"`{k}` {v}" for k, v in header["thresholds"].items()) + ".",
        "",
    ]
    cols = ["", "claim", "paper", "measured", "verdict"] + (["on the paper's curves"] if paper_verdicts else [])
    lines += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for c in claims:
        row = [c["id"], c["claim"], c["paper"], measured_text(c["measured"]), f"**{c['verdict']}**"]
        if paper_verdicts:
            row.append(paper_verdicts.get(c["id"], "n/a"))
        lines.append("| " + " | ".join(_cell(x) for x in row) + " |")
    lines += ["", "## Notes", ""]
    lines += [f"- **{c['id']}** ({c['verdict']}): {c['note'] or '-'}" for c in claims]
    if paper_verdicts:
        lines += [
            "",
            "The last column applies the same checks to the paper's curves as digitised from a "
            "textual description of the figure (`data/reference/paper_curves.csv`, about "
            '0.1 bits and 20 % in steps): where it is not "reproduced", the paper\'s own numbers '
            "do not support the claim at these thresholds.",
        ]
    return "\n".join(lines) + "\n"


def _seen_text(name: str, v: dict | None) -> str:
    if v is None:
        return f"{name} not measured"
    ratio = f"{v['ratio']:.2f}x" if v["ratio"] is not None else "n/a"
    return f"{name} up to {_fmt(v['max'])} ({ratio} its median {_fmt(v['median_before'])} just before)"


def spikes_markdown(explained: list[dict], factor: float = UNUSUAL_FACTOR) -> str:
    """The claims.md section: one line per spike with the diagnostics' numbers and a plain reading."""
    lines = ["", "## What the diagnostics show at each spike", ""]
    if not explained:
        return "\n".join(lines + ["No arm spikes, so there is nothing to explain.", ""])
    lines.append(
        f'From the onset row to the peak row of each spike (`diagnostics.csv`); "unusual" is {factor:g} '
        f"times the median of the last {BASELINE_ROWS} rows before the onset or more, any skipped update, "
        "or an attention logit beyond float16's largest value (65504). Gradient norm: the largest before "
        "clipping since the previous row; attention logit: the largest |q.k|/sqrt(d) over layers."
    )
    lines.append("")
    for e in explained:
        skipped = ", ".join(
            f"{e[n]} for {SKIP_NAMES[n]}" if e[n] is not None else f"{SKIP_NAMES[n]} not counted" for n in SKIP_NAMES
        )
        reading = (
            "**unusual**: " + "; ".join(e["unusual"]) if e["unusual"] else "**nothing unusual** in the diagnostics"
        )
        lines.append(
            f"- `{e['run']}` seed {e['seed']}, spike +{e['height_bits']:.2f} bits, onset step "
            f"{e['onset_step']}, peak step {e['peak_step']}: {_seen_text('gradient norm', e['grad_norm'])}; "
            f"{_seen_text('attention logit', e['attn_logit'])}; skipped updates: {skipped}. {reading}."
        )
    return "\n".join(lines) + "\n"
