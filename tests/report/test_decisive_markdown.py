"""decisive.md is the published verdicts' page: the published decisive.json gives the published page."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from acoustic_mlm.report import decisive
from acoustic_mlm.report.decisive_markdown import to_markdown

REF = Path(__file__).resolve().parents[2] / "data" / "reference" / "decisive"


def test_the_published_verdicts_give_the_published_page():
    runs = decisive.read_run_table(REF / "runs.csv")
    numerics = pd.read_csv(REF / "attention_fp16.csv")
    result = decisive.judge(runs, numerics)
    assert json.loads(json.dumps(result, default=str))["promises"][0]["id"] == "deepnorm"
    assert to_markdown(result) == (REF / "decisive.md").read_text()


def test_an_undecided_cell_with_one_seed_says_no_spread():
    row = {"cell": "2 layers, lr 0.1, fp32", "steps": 100, "mean_a": 1.0, "mean_b": 2.0, "gap": -1.0, "se": None}
    row |= {"resolution": None, "aa": None, "loser_late_fall": None, "void": False, "trained_a": 1, "n_a": 1}
    row |= {"trained_b": 0, "n_b": 1, "p_a": 0.5, "p_b": 1.0, "verdict": "inconclusive", "too_few_seeds": True}
    promise = {"id": "clipping", "verdict": "inconclusive", "promise": "p", "favoured": "clip1", "against": "clip10"}
    page = to_markdown(
        {"plateau_bits": 4.0, "plateau_margin": 1.0, "promises": [promise | {"rows": [row], "cells": []}]}
    )
    assert "one seed in an arm, so no spread" in page and "train at least 2 seeds per arm" in page
