"""The check that the prepared corpus's train split can calibrate the tokenizer
(`check_calibration_data`), made by the prepare stage's merge and by the tokenizer's fit.

The prepared corpus's files, their columns, writers and readers (`load_prepared` -> `Corpus`,
`read_plan`, `shard_name`) are acoustic_mlm.artifacts.prepared's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from acoustic_mlm import encodec
from acoustic_mlm.errors import UserError

if TYPE_CHECKING:
    from acoustic_mlm.config import Config


def check_calibration_data(cfg: Config, manifest: pd.DataFrame, where: str = "prepare") -> None:
    """Refuse, before tokenize, a corpus whose train split cannot fit the calibrated tokenizer.

    k-means needs at least one frame per code (1024 per level); `tokenizer.calibration_frames`
    (a multiple of 1024) is what the fit uses when the train split has it, else all of it (the
    fit warns). Below the minimum: a UserError saying how many minutes of audio are needed.
    Prepare's merge calls it; so does the tokenizer's fit (`where`), for a corpus prepared while
    tokenizer.mode was pretrained (prepare does not rerun when only the mode changes).
    """
    if cfg.tokenizer.mode != "calibrated":
        return
    CODEBOOK_SIZE, FRAME_RATE = encodec.CODEBOOK_SIZE, encodec.FRAME_RATE  # noqa: N806
    have = int(manifest.loc[manifest["split"] == "train", "num_frames"].sum())
    if have < CODEBOOK_SIZE:
        share = 1 - float(cfg.data.valid_fraction)
        raise UserError(
            f"{where}: the train split holds {have} EnCodec frames ({have / FRAME_RATE / 60:.2f} min); the calibrated "
            f"tokenizer needs at least {CODEBOOK_SIZE} ({CODEBOOK_SIZE / FRAME_RATE / 60:.2f} min of train audio, "
            f"about {CODEBOOK_SIZE / FRAME_RATE / 60 / share:.2f} min in all with data.valid_fraction "
            f"{cfg.data.valid_fraction}): add at least {(CODEBOOK_SIZE - have) / FRAME_RATE / 60 / share:.2f} "
            "min of audio, or set tokenizer.mode: pretrained"
        )
