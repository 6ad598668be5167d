"""Where a run's gradients vanish (experiments.gradients), on hand-made blocks tables, and the published
round 6 tables read through the checked reader."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from acoustic_mlm.artifacts.checked import ReadError
from acoustic_mlm.experiments import gradients

STEPS = [1, 2, 4, 8, 25, 50, 75, 100, 125, 150, 175, 200]


def _run(seed: int, dead: str | None) -> list[dict]:
    """Five blocks whose gradients halve from 1 over the run; `dead`'s falls to exactly 0 from step 75."""
    rows = []
    for block in ("conv", "embed", "block0", "block1", "heads"):
        for i, step in enumerate(STEPS):
            norm = 0.0 if block == dead and step >= 75 else 0.8**i
            rows.append(
                {
                    "size": "S1",
                    "arm": "a",
                    "lr": 0.05,
                    "seed": seed,
                    "step": step,
                    "block": block,
                    "grad_norm": norm,
                    "update_ratio": 0.01,
                }
            )
    return rows


def test_the_block_whose_gradient_dies_is_named_per_outcome():
    blocks = pd.DataFrame(_run(1, "conv") + _run(2, "conv") + _run(3, None))
    runs = pd.DataFrame({"size": "S1", "arm": "a", "lr": 0.05, "seed": [1, 2, 3], "trained": [False, False, True]})
    out = gradients.vanishing(blocks, runs)
    dead = out["not_trained"]
    assert dead["runs"] == 2 and dead["blocks"]["conv"]["smallest_in_runs"] == 2
    assert dead["blocks"]["conv"]["ends_at_zero_in_runs"] == 2 and dead["blocks"]["conv"]["median_zero_from_step"] == 75
    assert dead["blocks"]["conv"]["median_ratio"] == 0.0
    late = float(np.median([0.8**i for i, s in enumerate(STEPS) if s > 100]))
    assert dead["blocks"]["heads"]["median_ratio"] == pytest.approx(late)
    alive = out["trained"]
    assert alive["runs"] == 1 and all(b["ends_at_zero_in_runs"] == 0 for b in alive["blocks"].values())


def test_a_damaged_blocks_table_is_one_line(tmp_path):
    path = tmp_path / gradients.BLOCKS
    pd.DataFrame(_run(1, None)).to_csv(path, index=False)
    assert len(gradients.read_blocks(path)) == 5 * len(STEPS)
    path.write_text(path.read_text().replace("block0,", "block0,oops", 1))
    with pytest.raises(ReadError, match="blocks.csv"):
        gradients.read_blocks(path)
