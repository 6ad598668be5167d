"""A round's sensitivity curves drawn from its tables: each sensitivity arm's final loss against the peak
rate (log x), capped at the run's first loss as the LR sensitivity caps it, with the plateau's lines
(U, and U - 1: trained). Legend labels are the default configuration's, where the arm is one of its runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from acoustic_mlm import config as C
from acoustic_mlm.experiments.declaration import Round
from acoustic_mlm.report.decisive import PLATEAU_MARGIN
from acoustic_mlm.utils import atomic_path


def sensitivity_figure(rnd: Round, runs: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from acoustic_mlm.report import stability_map

    sv = rnd.sensitivity
    labels = {arm: run.label for arm, run in C.load(Path("config") / "config.yaml").runs.items()}
    r = runs[(runs["size"] == sv["cell"]) & runs["arm"].isin(sv["arms"]) & (runs["seed"] == sv["seed"])]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    for arm, marker in zip(sv["arms"], "osD^v<>"):
        a = r[r["arm"] == arm].sort_values("lr")
        capped = [stability_map.capped_loss(f, i) for f, i in zip(a["final_loss"], a["first_loss"])]
        ax.plot(a["lr"], capped, marker=marker, label=labels.get(arm, arm))
    plateau = float(r["plateau"].median())
    ax.axhline(plateau, color="0.4", linestyle="--", linewidth=1, label=f"unigram plateau U = {plateau:.2f}")
    ax.axhline(plateau - PLATEAU_MARGIN, color="0.4", linestyle=":", linewidth=1, label="U - 1 (trained)")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final codebook-0 loss (bits)")
    ax.set_title(f"{sv['cell']}, seed {sv['seed']}: final loss against the peak rate", fontsize=10)
    ax.legend(fontsize=7)
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip("."), dpi=150)
    plt.close(fig)
    return path
