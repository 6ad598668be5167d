"""The README's table of the default preset's results equals the shipped reference runs it quotes
(data/reference/default_run/<vendor>/metrics.csv), vendor by vendor: a number cannot drift from its source."""

import numpy as np
import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm import curves

VENDORS = {"Intel": "GenuineIntel", "AMD": "AuthenticAMD"}


def _table(readme: str) -> dict[str, list[str]]:
    """The rows of the table under "What the default shows": {arm label: its cells}."""
    section = readme.split("## What the default shows", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    header, body = rows[0], rows[1:]
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    assert cells(header)[0] == "arm", header
    return {cells(line)[0]: cells(line)[1:] for line in body}


def _quoted(metrics: pd.DataFrame) -> list[str]:
    """The README's cells of one arm on one vendor: final train / valid loss (curves.final_loss), the share
    of updates clipped, the largest gradient norm, as train.summary computes them."""
    finite = metrics[np.isfinite(metrics["train_loss_cb0"])]
    last = metrics.iloc[-1]
    updates = int(last["step"]) - int(last["nonfinite"])
    train = curves.final_loss(finite["step"], finite["train_loss_cb0"])
    valid = curves.final_loss(finite["step"], finite["valid_loss_cb0"])
    clipped = 100 * curves.clipped_fraction(int(last["clipped_steps"]), updates)
    return [f"{train:.2f} / {valid:.2f}", f"{clipped:.2g} %", f"{metrics['grad_norm_max'].max():.0f}"]


def test_the_readme_quotes_the_default_reference_runs_of_both_vendors(root):
    table = _table((root / "README.md").read_text())
    cfg = C.load(root / "config" / "config.yaml")
    labels = {
        "clip10": "Pre-Norm, clip 10",
        "clip1": "Pre-Norm, clip 1",
        "deepnorm": "Post-Norm, DeepNorm, clip 1",
        "attn_relax": "Pre-Norm, Attn. Relax, clip 1",
    }
    assert list(table) == [labels[rc.role] for rc in cfg.runs.values()]
    for i, vendor in enumerate(VENDORS.values()):
        metrics = pd.read_csv(root / "data" / "reference" / "default_run" / vendor / "metrics.csv")
        for name, rc in cfg.runs.items():
            cells = table[labels[rc.role]][3 * i : 3 * i + 3]
            assert cells == _quoted(metrics[metrics["run"] == name]), (vendor, name)
