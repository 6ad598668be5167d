"""The verdict words are the ones every published decisive verdict uses, and no two are alike."""

from __future__ import annotations

import json
from pathlib import Path

from acoustic_mlm.report import verdicts

REF = Path(__file__).resolve().parents[2] / "data" / "reference" / "decisive" / "decisive.json"


def test_the_published_verdicts_use_only_these_words():
    words = {verdicts.SUPPORTED, verdicts.NOT_SUPPORTED, verdicts.INCONCLUSIVE, verdicts.MIXED}
    assert len(words) == 4 and verdicts.MIN_SEEDS == 2
    used = {p["verdict"] for p in json.loads(REF.read_text())["promises"]}
    assert used and used <= words
