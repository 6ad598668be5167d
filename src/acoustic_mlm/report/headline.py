"""results/metrics.json: a run's headline numbers in one small flat file, the columns `dvc exp show` shows.

DVC's convention (iterative/example-get-started) is one flat metrics file per project, so that `dvc exp show`
compares experiments in a few columns. This file holds each arm's final codebook-0 loss in bits under its
role (`clip10`, ...), as `results/final_losses.json` (written by `amlm aggregate --finals`) names it; the
definition of "final" is curves.final_loss. Then each claim's verdict (`claim_<id>`, from
`results/claims.json`). Everything
else a run measured stays in its own files (summary.json, claims.json, the curves), outputs but not metrics.
"""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm.artifacts.checked import ReadError, read_json
from acoustic_mlm.utils import log, write_json


def headline(finals: dict[str, float | None], verdicts: dict[str, str]) -> dict[str, float | str | None]:
    """The flat mapping: each arm's final loss under final_losses.json's key (its role: short columns for
    `dvc exp show`), then `claim_<id>` per claim (claims.json's verdicts)."""
    return {**finals, **{f"claim_{k}": v for k, v in verdicts.items()}}


def run(finals_path: str | Path, claims_path: str | Path, out_path: str | Path) -> dict:
    """Read the two files (each refused in one line if missing, cut short or edited) and write `out_path`."""
    finals = read_json(finals_path, "the arms' final losses", "aggregate")
    for key, value in finals.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ReadError(f"{finals_path}: '{key}' is {value!r}, not a loss in bits; rerun the aggregate stage")
    verdicts = read_json(claims_path, "the claims' verdicts", "claims", {"verdicts": dict})["verdicts"]
    for key, value in verdicts.items():
        if not isinstance(value, str):
            raise ReadError(f"{claims_path}: verdict '{key}' is {value!r}, not a verdict; rerun the claims stage")
    out = headline(finals, verdicts)
    write_json(out_path, out)
    log.info("metrics: %d arms, %d claims -> %s", len(finals), len(verdicts), out_path)
    return out
