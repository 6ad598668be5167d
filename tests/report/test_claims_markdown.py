"""claims.md from hand-made claims: the table with each claim's verdict, the notes, the paper's
column, and the section on what the diagnostics show at each spike."""

from __future__ import annotations

from acoustic_mlm.report.claims_markdown import measured_text, spikes_markdown, to_markdown

HEADER = {
    "curves": "results/loss_curves.csv",
    "split": "train",
    "n_seeds": {"arm_a": 2, "arm_b": 1},
    "thresholds": {"spike_threshold": 0.5, "min_final_gap": 0.02},
}
CLAIMS = [
    {
        "id": "a",
        "claim": "every arm starts near 10 bits",
        "paper": "9.3-9.5",
        "verdict": "reproduced",
        "measured": {"first_bits": {"arm_a": 9.81234, "arm_b": 9.7}, "seeds": {"arm_a": 2}},
        "note": "",
    },
    {
        "id": "b",
        "claim": "clip 10 | ends lowest",
        "paper": "5.7",
        "verdict": "inconclusive",
        "measured": {
            "final_bits": {"arm_a": 5.71, "arm_b": None},
            "final_bits_per_seed": {"arm_a": {"1": 5.6, "2": 5.8}},
        },
        "note": "a tie",
    },
    {
        "id": "d",
        "claim": "Post-Norm spikes once",
        "paper": "one spike",
        "verdict": "not reproduced",
        "measured": {
            "spike": {"1": {"height_bits": 1.234, "peak_step": 250, "recovery_step": None}, "2": None},
            "steps": [100, 250.0],
        },
        "note": None,
    },
]


def test_the_table_holds_each_claims_verdict_and_the_notes_follow():
    md = to_markdown(CLAIMS, HEADER)
    assert md.startswith("# Findings: the figure's claims on the reproduced curves\n")
    assert "Source: `results/loss_curves.csv`, codebook 0, split `train`; seeds per run: `arm_a` 2, `arm_b` 1." in md
    assert "Thresholds: `spike_threshold` 0.5, `min_final_gap` 0.02." in md
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0] == "|  | claim | paper | measured | verdict |" and len(table) == 2 + len(CLAIMS)  # and a rule
    for line, claim in zip(table[2:], CLAIMS):
        assert line.startswith(f"| {claim['id']} | ") and line.endswith(f"| **{claim['verdict']}** |")
    assert "clip 10 \\| ends lowest" in md  # a pipe inside a cell is escaped
    assert "- **a** (reproduced): -" in md and "- **b** (inconclusive): a tie" in md
    assert "- **d** (not reproduced): -" in md and "paper's curves" not in md


def test_the_paper_column_when_there_are_paper_verdicts():
    md = to_markdown(CLAIMS, HEADER, {"a": "reproduced", "b": "not reproduced"})
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0].endswith("| verdict | on the paper's curves |")
    assert table[2].endswith("| **reproduced** | reproduced |") and table[4].endswith("| n/a |")
    assert "`data/reference/paper_curves.csv`" in md


def test_measured_text_rounds_ranges_seeds_and_spikes():
    assert measured_text(CLAIMS[0]["measured"]) == "first_bits: arm_a 9.81, arm_b 9.7"  # seeds: in the header
    assert measured_text(CLAIMS[1]["measured"]) == "final_bits: arm_a 5.71 (5.6-5.8), arm_b n/a"
    assert measured_text(CLAIMS[2]["measured"]) == (
        "spike: seed 1 +1.23 bits at step 250, not recovered, seed 2 none<br>steps: 100, 250"
    )
    assert measured_text({"converged_step": {}}) == "converged_step: none"


def test_the_spikes_section():
    assert "No arm spikes, so there is nothing to explain." in spikes_markdown([])
    seen = {
        "run": "arm_b",
        "seed": 1,
        "onset_step": 240,
        "peak_step": 250,
        "height_bits": 1.234,
        "grad_norm": {"max": 5.5, "median_before": 1.1, "ratio": 5.0},
        "attn_logit": None,
        "overflow_skips": 2,
        "nonfinite": None,
        "unusual": ["gradient norm 5.0x its median"],
    }
    md = spikes_markdown([seen, {**seen, "seed": 2, "grad_norm": None, "overflow_skips": 0, "unusual": []}])
    assert "## What the diagnostics show at each spike" in md
    assert '"unusual" is 3 times the median of the last 3' in md
    assert (
        "- `arm_b` seed 1, spike +1.23 bits, onset step 240, peak step 250: gradient norm up to 5.5 (5.00x its "
        "median 1.1 just before); attention logit not measured; skipped updates: 2 for fp16 overflow, non-finite "
        "loss not counted. **unusual**: gradient norm 5.0x its median."
    ) in md
    assert "- `arm_b` seed 2," in md and "gradient norm not measured" in md
    assert "**nothing unusual** in the diagnostics." in md
