"""The training data: crops of the prepared audio with their codes, span masks and noise mixing,
one batch per micro-batch number, and the check that the codes suit the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.artifacts.codes import SUMMARY, codes_path, open_codes, read_codes, read_tokenizer_summary
from acoustic_mlm.artifacts.prepared import as_float, unstored
from acoustic_mlm.errors import UserError
from acoustic_mlm.model.objective import compute_group_masks, mask_groups
from acoustic_mlm.train.augment import apply_mixture, draw_mixture
from acoustic_mlm.utils import recover_replaced


class CropData(torch.utils.data.Dataset):
    """Training batches indexed by micro-batch number: item i is (wav, codes, mask) for micro-batch i,
    plus the clean crops (wav before noise mixing) as a fourth item when model.mixture_prob > 0.

    Item i depends only on (seed, i), never on which worker made it or what came before, so a
    run is identical with any number of loader workers and can restart at any step. Audio and
    codes are memory-mapped lazily in each worker (a memmap must not be pickled to workers).
    wav (B, T*320), codes (B, K, T), mask (B, T). crop_unit "frame": crops start on EnCodec
    frame boundaries; "sample": at any sample, as MERT's random_crop, with the codes starting at
    the rounded frame (label_offset). Masks are equalised per group of mask_group crops
    (objective.compute_group_masks) and noise is mixed within those groups (augment.py).
    """

    def __init__(
        self,
        corpus,
        codes_dir: Path,
        split: str,
        crop_frames: int,
        batch: int,
        m: C.ModelConfig,
        seed: int,
        rank: int = 0,
        world: int = 1,
        crop_unit: str = "frame",
        mask_group: int = 0,
        mixture: bool = False,
    ):
        manifest = corpus.manifest
        rows = manifest[(manifest["split"] == split) & (manifest["num_frames"] >= crop_frames)]
        if rows.empty:
            raise UserError(
                f"no {split} clip holds {crop_frames} frames ({crop_frames / encodec.FRAME_RATE:.2f} s): "
                "lower 'train.crop_seconds' or use longer clips"
            )
        self.corpus, self.codes_dir = corpus, Path(codes_dir)
        self.shard = rows["shard"].to_numpy().astype(np.int64)  # shard per clip
        self.offsets = rows["offset"].to_numpy().astype(np.int64)  # first sample in its shard
        self.starts = (self.offsets // encodec.HOP).astype(np.int64)  # first frame in its shard
        self.frames = rows["num_frames"].to_numpy().astype(np.int64)
        self.gains = rows["gain"].to_numpy(np.float64) if "gain" in rows else np.ones(len(rows))  # storage gain
        # Clips are drawn in proportion to the crops they hold, so every frame is equally likely.
        weights = (self.frames - crop_frames + 1).astype(np.float64)
        self.p = weights / weights.sum()
        self.crop_frames, self.batch, self.m, self.seed = crop_frames, batch, m, seed
        self.rank, self.world = rank, world  # DDP: each process keeps rows rank, rank+world, ... of a batch
        self.crop_unit, self.mask_group = crop_unit, mask_group
        self.mixture = mixture and m.mixture_prob > 0  # noise mixing: training crops only
        self._codes: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return 2**62  # indexed by micro-batch number; the sampler decides how many

    def __getstate__(self):  # memory maps are reopened in each worker, never pickled
        return {**self.__dict__, "_codes": {}}

    def __getitem__(self, i: int):
        rng = np.random.default_rng([self.seed, int(i)])
        clips = rng.choice(len(self.starts), size=self.batch, p=self.p)
        T, hop = self.crop_frames, encodec.HOP
        if self.crop_unit == "sample":  # any sample whose rounded frame leaves T codes
            offset = rng.integers(0, (self.frames[clips] - T) * hop + 1)  # samples into the clip
            samples = self.offsets[clips] + offset
            first = self.starts[clips] + np.array([label_offset(int(o)) for o in offset], dtype=np.int64)
        else:
            first = self.starts[clips] + rng.integers(0, self.frames[clips] - T + 1)
            samples = first * hop
        m = self.m
        mask = compute_group_masks(self.batch, T, m.mask_prob, m.mask_length, m.mask_min_masks, rng, self.mask_group)
        rows = slice(self.rank, None, self.world)  # the global batch is drawn whole, then split
        wav, codes = self.gather(self.shard[clips][rows], samples[rows], first[rows], self.gains[clips][rows])
        if not self.mixture:
            return wav, codes, torch.from_numpy(mask[rows])
        groups = mask_groups(self.batch, self.mask_group)
        plan = draw_mixture(rng, groups, T * hop, m.mixture_prob, m.mixture_segments, m.mixture_samples)
        mixed = apply_mixture(wav.numpy(), np.arange(self.batch)[rows], groups, plan, m.mixture_volume)
        return torch.from_numpy(mixed), codes, torch.from_numpy(mask[rows]), wav

    def codes(self, shard: int) -> np.ndarray:
        if shard not in self._codes:
            self._codes[shard] = open_codes(self.codes_dir, shard)
        return self._codes[shard]

    def gather(
        self, shards: np.ndarray, first_samples: np.ndarray, first_frames: np.ndarray, gains: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        T, hop, K = self.crop_frames, encodec.HOP, self.m.codebooks
        wav = np.stack([self.corpus.audio(s)[a : a + T * hop] for s, a in zip(shards, first_samples)])
        codes = np.stack([self.codes(s)[:K, f : f + T] for s, f in zip(shards, first_frames)])  # (B, K, T)
        # the stored samples, scaled to float32 here (int16 PCM: / 32768; float32: the same values), each
        # crop divided by its clip's storage gain (1 unless the clip peaked above full scale)
        wav = as_float(wav) if gains is None else unstored(as_float(wav), gains)
        return torch.from_numpy(wav), torch.from_numpy(codes.astype(np.int64))


def label_offset(sample: int, sample_rate: int = encodec.SAMPLE_RATE, label_rate: float = encodec.FRAME_RATE) -> int:
    """The first code frame of a crop starting at `sample`: int(round(sample * label_rate / sample_rate)),
    as MERT's collater_frm_label (mert_fairseq/data/mert_dataset.py; Python's round: halves to even)."""
    return int(round(sample * (label_rate / sample_rate)))


def batches(data: CropData, first: int, last: int, workers: int, pin: bool):
    """Micro-batches first..last-1 in order, made by `workers` processes (0: in this process)."""
    return torch.utils.data.DataLoader(
        data,
        batch_size=None,  # items are whole batches
        sampler=range(first, last),
        num_workers=workers,
        pin_memory=pin,
        prefetch_factor=4 if workers else None,
        persistent_workers=False,
    )


def check_codes(codes_dir: Path, corpus, m: C.ModelConfig) -> None:
    """The codes suit the model and cover every shard of the corpus (headers only: no scan of the codes)."""
    recover_replaced(Path(codes_dir))  # a tokenize killed while it replaced the folder: the previous one back
    summary = Path(codes_dir) / SUMMARY
    meta = read_tokenizer_summary(summary)
    if meta.get("n_codebooks", 0) < m.codebooks:
        raise UserError(f"{summary}: {meta.get('n_codebooks')} codebooks, 'model.codebooks' asks for {m.codebooks}")
    if max(meta["max_code"][: m.codebooks]) >= m.codebook_size:
        raise UserError(
            f"{summary}: codes up to {max(meta['max_code'][: m.codebooks])} exceed "
            f"'model.codebook_size' ({m.codebook_size})"
        )
    for k in corpus.shards:  # every code in range: an edited or damaged shard is refused, not trained on
        read_codes(codes_path(codes_dir, k), len(corpus.audio(k)) // encodec.HOP, m.codebooks, m.codebook_size)
