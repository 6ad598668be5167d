"""The decisive experiments' PB-Relax parts, from the published tables, equal the published verdicts;
and each way a part can come out."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from acoustic_mlm.report import decisive
from acoustic_mlm.report.decisive_pb_relax import forced_logit_verdict, numerics_verdict

REF = Path(__file__).resolve().parents[2] / "data" / "reference" / "decisive"


def test_the_published_parts_recompute_from_the_published_tables():
    published = {p["id"]: p for p in json.loads((REF / "decisive.json").read_text())["promises"]}
    runs = decisive.read_run_table(REF / "runs.csv")
    numerics = pd.read_csv(REF / "attention_fp16.csv")
    assert json.loads(json.dumps(forced_logit_verdict(runs))) == published["pb_relax_training"]
    assert json.loads(json.dumps(numerics_verdict(numerics))) == published["pb_relax_arithmetic"]


def test_the_arithmetic_part_each_way():
    assert numerics_verdict(None)["verdict"] == "inconclusive"
    rows = [("unfused", 1e5, False, 1.0), ("pb_relax", 1e5, True, 1e-3), ("unfused", 1e2, True, 1e-3)]
    table = pd.DataFrame(rows, columns=["path", "logit_max", "finite", "rel_error"])
    assert numerics_verdict(table) | {} == {
        "id": "pb_relax_arithmetic",
        "verdict": "supported",
        "unfused_fails_at": [1e5],
        "pb_relax_good_at": [1e5],
    }
    table.loc[1, "rel_error"] = 0.5
    assert numerics_verdict(table)["verdict"] == "not supported"
    assert numerics_verdict(table[table["path"] == "pb_relax"])["verdict"] == "inconclusive"
