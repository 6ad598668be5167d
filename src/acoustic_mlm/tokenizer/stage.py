"""Tokenize stage: EnCodec 24 kHz codes (8 RVQ levels x 1024 codes at 75 Hz) for every clip.

The stage's steps and files; the model (`codec`: built, pretrained or calibrated), the loudness
normalisation of its input (`loudness`), the calibration of its codebooks (`calibration`, by
`kmeans`) and the encoding (`encode`) live in the modules beside this one.

Three steps over the prepared shards (Snakemake: one job per shard; `run` does all three in one
process for DVC and by hand), each written atomically into the stage's output folder:

1. `fit` -> `model/`: `fit.json` (mode, bandwidth, seed, loudness normalisation, calibration
   statistics, the pretrained checkpoint's sha256, or in pitch mode the oracle's tones: `pitch.record`)
   and, in calibrated mode, `tokenizer.pt`: the
   calibrated model's state_dict (torch.load with weights_only=True; `codec.load_calibrated`
   rebuilds the exact tokenizer from it; the fit is the same at 1 and 2 threads, the encoding is
   not, hence `tokenizer.threads`). Calibration draws on the
   train clips of every shard.
2. `encode_shard` -> `shard-<k>/`: `codes.npy`, int16, shape (K, len(audio.npy) // 320) for the
   shard's audio.npy. Column t holds the codes of samples [320 t, 320 (t + 1)), so clip i's codes
   are columns offset_i // 320 ... + num_frames_i. Columns that belong to no clip hold -1.
   Clips are encoded in zero-padded batches of `tokenizer.batch_size` and trimmed to their own
   frames; clips longer than `tokenizer.segment_seconds` in segments with `context_seconds` of
   left context. `encode.json`: clips, seconds, speed.
   `loudness.csv`: each clip's RMS dBFS, LUFS and the mean gain applied.
3. `merge` -> `files.csv` (one row per clip: loudness, codebook-0 codes used, entropy, most frequent
   code's share) and `tokenizer.json`: the fit, the loudness normalisation applied, codes used,
   unigram entropy and most frequent code's share per level on the whole corpus, total encode time
   and speed; one warning line when a code holds more than 10% of a level's frames. Written last:
   it marks the codes complete.

The files' names, writers and readers are acoustic_mlm.artifacts.codes's (training reads the
codes through it); the prepared corpus is read through acoustic_mlm.artifacts.prepared.

In pitch mode (`tokenizer.mode: pitch`, the tone corpus's oracle: acoustic_mlm.tokenizer.pitch) the
oracle stands where EnCodec stands: the same three steps and files, its codes read from each frame's pitch.

Tensor axes: K codebooks (RVQ levels), T frames.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.artifacts.codes import (
    CODES,
    ENCODE_RECORD,
    FILE_STATS_COLUMNS,
    FILES,
    FILES_COLUMNS,
    FIT,
    LOUDNESS_TABLE,
    MODEL_DIR,
    codes_path,
    create_codes,
    read_codes,
    read_encode_record,
    read_fit,
    read_loudness,
    shard_codes_problem,
    write_encode_record,
    write_files,
    write_fit,
    write_loudness,
    write_tokenizer_summary,
)
from acoustic_mlm.artifacts.prepared import AUDIO, MANIFEST, PLAN, load_prepared, read_plan, shard_name
from acoustic_mlm.data.corpus import check_calibration_data
from acoustic_mlm.devices import pick_device
from acoustic_mlm.errors import UserError
from acoustic_mlm.tokenizer.calibration import calibrate
from acoustic_mlm.tokenizer.codec import (
    TokenizerError,
    build_encodec,
    hub_checkpoint_path,
    load_calibrated,
    load_pretrained,
    n_codebooks,
)  # fmt: skip
from acoustic_mlm.tokenizer.encode import EncodeSettings, encode_clips
from acoustic_mlm.tokenizer.loudness import clip_loudness, loudness_of, loudness_record
from acoustic_mlm.tokenizer.pitch import PitchTokenizer
from acoustic_mlm.tokenizer.pitch import record as pitch_record
from acoustic_mlm.utils import (
    atomic_dir,
    file_sha256,
    keep_freed_memory,
    log,
    resumable_dir,
    set_threads,
)


def read_prepared(prepared_dir: str | Path, sample_format: str | None = None):
    """The prepared corpus through `artifacts.prepared.load_prepared` (stored as `sample_format`,
    data.sample_format, when given), its errors as TokenizerError."""
    try:
        return load_prepared(prepared_dir, sample_format)
    except UserError as exc:
        raise TokenizerError(str(exc)) from None


def _check_config(cfg: C.Config) -> None:
    sr = cfg.data.sample_rate
    if sr != encodec.SAMPLE_RATE:
        raise TokenizerError(f"config: 'data.sample_rate' is {sr}; EnCodec 24 kHz needs {encodec.SAMPLE_RATE}")
    if cfg.tokenizer.mode not in C.TOKENIZER_MODES:
        raise TokenizerError(
            f"config: 'tokenizer.mode' must be {' or '.join(C.TOKENIZER_MODES)}, got {cfg.tokenizer.mode!r}"
        )
    loudness_of(cfg.tokenizer)  # a known loudness method


def fit(cfg: C.Config, prepared_dir: Path, out_dir: Path, threads: int = 1) -> dict:
    """The tokenizer for the corpus, into out_dir/model/ (atomically): fit.json, and tokenizer.pt
    in calibrated mode (codebooks fitted on the train split of every shard).

    In pretrained mode it checks the checkpoint (downloading it if needed) and records its sha256; in
    pitch mode it records the oracle (`pitch.record`): nothing is fitted.
    `cfg`: a `Config` (`config.load`), as for every step.
    """
    set_threads(threads)
    keep_freed_memory()
    _check_config(cfg)
    tc = cfg.tokenizer
    mode, bandwidth, seed = tc.mode, float(tc.bandwidth), int(tc.seed)
    loudness = loudness_of(tc)
    info: dict = {
        "mode": mode,
        "bandwidth": bandwidth,
        "seed": seed,
        "checkpoint": None,
        "loudness": loudness,
        "calibration_frames_requested": None,
        "calibration_iters": None,
    }
    with atomic_dir(Path(out_dir) / MODEL_DIR) as tmp:
        if mode == "calibrated":
            corpus = read_prepared(prepared_dir, cfg.data.sample_format)
            train = np.flatnonzero((corpus.manifest["split"] == "train").to_numpy())
            if not len(train):
                raise TokenizerError(f"{Path(prepared_dir) / MANIFEST}: no train clips to calibrate on")
            check_calibration_data(cfg, corpus.manifest, where=str(Path(prepared_dir) / MANIFEST))
            model = build_encodec(bandwidth, seed)
            chunks = [corpus.clip(int(i)) for i in train]
            info.update(
                calibrate(
                    model,
                    chunks,
                    int(tc.calibration_frames),
                    int(tc.calibration_iters),
                    seed,
                    loudness=(loudness["method"], loudness["target"] or 0.0),
                )
            )
            info.update(
                calibration_frames_requested=int(tc.calibration_frames),
                calibration_frames_per_code=round(info["calibration_frames"] / encodec.CODEBOOK_SIZE, 2),
                calibration_iters=int(tc.calibration_iters),
            )
            torch.save(model.state_dict(), tmp / "tokenizer.pt")
        elif mode == "pitch":
            info["pitch"] = pitch_record()
        else:
            load_pretrained(tc.checkpoint, bandwidth)
            path = Path(tc.checkpoint).expanduser() if tc.checkpoint else hub_checkpoint_path()
            info["checkpoint"] = {"path": str(path), "sha256": file_sha256(path)}
        write_fit(tmp, info)
    return info


def check_fit(cfg: C.Config, path: Path) -> None:
    """The fitted tokenizer (fit.json) is the one this configuration fits: its mode and bandwidth, and
    in calibrated mode its seed, k-means frames and iterations; else `--shard`/`--merge` would encode with
    (or record) a model another configuration fitted. One line naming the first setting that differs."""
    info, tc = read_fit(path), cfg.tokenizer
    wanted = {"mode": tc.mode, "bandwidth": float(tc.bandwidth)}
    if tc.mode == "calibrated":  # the pretrained checkpoint is the same whatever the seed
        wanted["seed"] = int(tc.seed)
        wanted["calibration_frames_requested"] = int(tc.calibration_frames)
        wanted["calibration_iters"] = int(tc.calibration_iters)
    for key, value in wanted.items():
        if key in info and info[key] != value:
            setting = {"calibration_frames_requested": "calibration_frames"}.get(key, key)
            raise TokenizerError(
                f"{path}: fitted with tokenizer.{setting} {info[key]!r}, the configuration says {value!r}; "
                "rerun `amlm tokenize --fit` with this configuration"
            )


def load_tokenizer(cfg: C.Config, out_dir: Path):
    """The model `fit` made for this corpus (calibrated: out_dir/model/tokenizer.pt; pretrained: the checkpoint;
    pitch: the oracle at the bandwidth's codebooks)."""
    tc = cfg.tokenizer
    folder = Path(out_dir) / MODEL_DIR
    if not (folder / FIT).is_file():
        raise UserError(f"{folder / FIT}: not found (run `amlm tokenize --fit` first)")
    check_fit(cfg, folder / FIT)
    fitted = read_fit(folder / FIT).get("loudness", loudness_record("none"))  # no loudness record in fit.json: none
    wanted = loudness_of(tc)
    if (fitted["method"], fitted["target"]) != (wanted["method"], wanted["target"]):
        raise TokenizerError(
            f"{folder / FIT}: fitted with loudness {fitted['method']} {fitted['target']}, the "
            f"config asks for {wanted['method']} {wanted['target']} (tokenizer.loudness); rerun "
            "`amlm tokenize --fit`"
        )
    if tc.mode == "calibrated":
        return load_calibrated(folder / "tokenizer.pt", float(tc.bandwidth))
    if tc.mode == "pitch":
        return PitchTokenizer(encodec.codebooks(float(tc.bandwidth)))
    return load_pretrained(tc.checkpoint, float(tc.bandwidth))


def encode_shard(cfg: C.Config, prepared_dir: Path, out_dir: Path, shard: int, threads: int = 1) -> dict:
    """One shard's codes into out_dir/shard-<k>/ (atomically): codes.npy aligned with the shard's
    audio.npy (int16 (K, frames), -1 where no clip is), encode.json (clips, seconds, speed).

    Memory: one padded batch and a memory map of the shard's codes.
    """
    set_threads(threads)
    keep_freed_memory()  # faster encoding on CPU (BENCHMARKS.md, glibc's allocator)
    _check_config(cfg)
    tc = cfg.tokenizer
    corpus = read_prepared(prepared_dir, cfg.data.sample_format)
    if int(shard) not in corpus.shards and int(shard) not in _planned_shards(prepared_dir):
        raise TokenizerError(f"{Path(prepared_dir) / MANIFEST}: no clips in shard {shard}")
    # A planned shard whose files were all rejected gets its (empty) codes too: every shard of
    # the plan is encoded, so that Snakemake can ask for all of them before the manifest exists.
    clips = corpus.manifest[corpus.manifest["shard"] == int(shard)]
    audio = corpus.audio(int(shard))
    try:
        device = pick_device(tc.device, "tokenizer.device")
    except ValueError as exc:
        raise TokenizerError(f"config: {exc}") from None
    model = load_tokenizer(cfg, out_dir).to(device)
    settings = EncodeSettings.from_config(tc, device)
    measured, frame_gain = clip_loudness(audio, clips, loudness_of(tc))
    with atomic_dir(Path(out_dir) / shard_name(shard)) as tmp:
        write_loudness(tmp, measured)
        codes = create_codes(tmp / CODES, n_codebooks(model), len(audio) // encodec.HOP)  # (K, frames of the shard)
        t0 = time.perf_counter()
        encode_clips(
            model,
            audio,
            clips,
            settings,
            frame_gain=frame_gain,
            out=codes,
            label=f"tokenize {shard_name(shard)}",
        )
        seconds = time.perf_counter() - t0
        codes.flush()
        segment = settings.segment_frames
        del codes  # close the memory map before the folder is renamed into place
        audio_s = float(clips["num_samples"].sum()) / encodec.SAMPLE_RATE
        info = {
            "shard": int(shard),
            "clips": len(clips),
            "audio_seconds": round(audio_s, 3),
            "encode_seconds": round(seconds, 3),
            "x_real_time": round(audio_s / max(seconds, 1e-9), 2),
            "batch_size": int(tc.batch_size),
            "segment_seconds": tc.segment_seconds,
            "context_seconds": tc.context_seconds,
            # clips longer than segment_seconds, encoded in segments: their codes are not whole-file codes
            "segmented_clips": int((clips["num_frames"] > segment).sum()) if segment > 0 else 0,
            "device": str(device),
            "threads": int(threads),
            "codes_sha256": file_sha256(tmp / CODES),  # a resumed run checks the codes against it
        }
        write_encode_record(tmp, info)
    log.info(
        "tokenize %s: %d clips, %.0f s of audio in %.1f s (%.1fx real time)",
        shard_name(shard),
        info["clips"],
        audio_s,
        seconds,
        info["x_real_time"],
    )
    return info


def _planned_shards(prepared_dir: Path) -> set[int]:
    """The shards prepare's plan (shards.csv) lists; empty when there is no plan."""
    if not (Path(prepared_dir) / PLAN).is_file():
        return set()
    return {int(k) for k in read_plan(prepared_dir)["shard"]}


def merge(cfg: C.Config, prepared_dir: Path, out_dir: Path) -> dict:
    """tokenizer.json for the whole corpus: the fit, codes used and unigram entropy per level over
    every shard (counted shard by shard), total encode time. Written last: it marks the codes complete."""
    out_dir = Path(out_dir)
    corpus = read_prepared(prepared_dir, cfg.data.sample_format)
    fit_path = out_dir / MODEL_DIR / FIT
    if not fit_path.is_file():
        raise TokenizerError(f"{fit_path}: not found (run `amlm tokenize --fit` first)")
    check_fit(cfg, fit_path)
    info = read_fit(fit_path)
    counts = None  # (K, codebook size) code counts over every shard
    shards, tables = [], []
    for k in corpus.shards:
        enc_path = out_dir / shard_name(k) / ENCODE_RECORD
        if not enc_path.is_file():
            raise TokenizerError(f"{enc_path}: not found (run `amlm tokenize --shard {k}` first)")
        shards.append(read_encode_record(enc_path))
        codes = read_codes(codes_path(out_dir, k), len(corpus.audio(k)) // encodec.HOP, None, encodec.CODEBOOK_SIZE)
        part = np.stack([code_counts(np.asarray(row)) for row in codes])
        counts = part if counts is None else counts + part
        tables.append(_file_table(corpus.manifest[corpus.manifest["shard"] == k], codes, out_dir / shard_name(k)))
    audio_s = sum(s["audio_seconds"] for s in shards)
    encode_s = sum(s["encode_seconds"] for s in shards)
    meta = {
        **info,
        "n_codebooks": int(counts.shape[0]),
        "codebook_size": encodec.CODEBOOK_SIZE,
        "frame_rate": encodec.FRAME_RATE,
        "hop_length": encodec.HOP,
        "sample_rate": encodec.SAMPLE_RATE,
        "shards": len(shards),
        "clips": int(sum(s["clips"] for s in shards)),
        "audio_seconds": round(audio_s, 3),
        "distinct_codes": [int((row > 0).sum()) for row in counts],
        "top_code": [int(row.argmax()) for row in counts],
        "top_code_share": [round(float(row.max()) / max(int(row.sum()), 1), 5) for row in counts],
        "max_code": [int(np.flatnonzero(row).max()) if row.any() else -1 for row in counts],
        "unigram_entropy_bits": [round(_entropy_bits(row), 4) for row in counts],
        "encode_seconds": round(encode_s, 3),
        "real_time_factor": round(encode_s / max(audio_s, 1e-9), 5),  # encode seconds per audio second
        "x_real_time": round(audio_s / max(encode_s, 1e-9), 2),  # audio seconds per encode second
        "batch_size": int(cfg.tokenizer.batch_size),
        # clips encoded in segments (longer than tokenizer.segment_seconds); None: a shard did not record it
        "segmented_clips": (
            sum(s["segmented_clips"] for s in shards) if all("segmented_clips" in s for s in shards) else None
        ),
        "versions": {"torch": torch.__version__, "encodec": _encodec_version()},
    }
    files = pd.concat(tables, ignore_index=True).sort_values("path", kind="stable")
    write_files(out_dir, files)
    meta["files_table"] = FILES
    crowded = [
        f"level {k} code {meta['top_code'][k]} ({100 * share:.1f}%)"
        for k, share in enumerate(meta["top_code_share"])
        if share > TOP_CODE_WARNING
    ]
    if crowded:
        log.warning(
            "tokenize: one code holds more than %d%% of a level's frames: %s; see %s for each file's loudness "
            "and codebook-0 entropy",
            round(100 * TOP_CODE_WARNING),
            ", ".join(crowded),
            out_dir / FILES,
        )
    if meta["segmented_clips"]:
        log.warning(
            "tokenize: %d clip(s) longer than tokenizer.segment_seconds (%g s) were encoded in segments with "
            "%g s of left context: their codes are not the whole-file codes MERT encodes",
            meta["segmented_clips"],
            cfg.tokenizer.segment_seconds,
            cfg.tokenizer.context_seconds,
        )
    write_tokenizer_summary(out_dir, meta)
    log.info(
        "tokenize: %d clips in %d shard(s), %.0f s of audio in %.1f s (%.1fx real time); codes used per level %s",
        meta["clips"],
        meta["shards"],
        audio_s,
        encode_s,
        meta["x_real_time"],
        meta["distinct_codes"],
    )
    return meta


TOP_CODE_WARNING = 0.10  # tokenize warns when one code holds more than this share of a level's frames


def _file_table(clips, codes: np.ndarray, shard_dir: Path):
    """One row per clip of a shard: its loudness (loudness.csv) and its codebook-0 codes used, unigram
    entropy and most frequent code's share."""
    path = shard_dir / LOUDNESS_TABLE
    if not path.is_file():
        raise TokenizerError(f"{path}: not found (rerun `amlm tokenize --shard {int(clips['shard'].iloc[0])}`)")
    measured = read_loudness(path)
    rows = []
    for cid, o, nf in zip(clips["clip_id"], clips["offset"].to_numpy(np.int64), clips["num_frames"].to_numpy(np.int64)):
        c = code_counts(np.asarray(codes[0, o // encodec.HOP : o // encodec.HOP + nf]))
        rows.append(
            (cid, int((c > 0).sum()), round(_entropy_bits(c), 4), round(float(c.max()) / max(int(c.sum()), 1), 5))
        )
    stats = pd.DataFrame(rows, columns=["clip_id", *FILE_STATS_COLUMNS])
    table = pd.DataFrame(
        {
            "clip_id": clips["clip_id"].to_numpy(),
            "path": clips["path"].to_numpy() if "path" in clips else clips["clip_id"].to_numpy(),
            "split": clips["split"].to_numpy(),
            "seconds": (clips["num_samples"].to_numpy(np.int64) / encodec.SAMPLE_RATE).round(3),
        }
    )
    table = table.merge(measured, on="clip_id", how="left").merge(stats, on="clip_id")[list(FILES_COLUMNS)]
    if table["gain_db"].isna().any():
        raise TokenizerError(f"{path}: does not list every clip of its shard; rerun tokenize")
    return table


def code_counts(codes: np.ndarray) -> np.ndarray:
    """How often each code of a codebook (encodec.CODEBOOK_SIZE) occurs in `codes` (-1, no clip, is not counted)."""
    codes = np.asarray(codes).astype(np.int64, copy=False)
    if codes.size and int(codes.max()) >= encodec.CODEBOOK_SIZE:
        raise TokenizerError(f"code {int(codes.max())} exceeds the codebook size {encodec.CODEBOOK_SIZE}")
    return np.bincount(codes[codes >= 0], minlength=encodec.CODEBOOK_SIZE)


def _entropy_bits(counts: np.ndarray) -> float:
    p = counts[counts > 0] / max(int(counts.sum()), 1)
    return float(-(p * np.log2(p)).sum())


def run(cfg: C.Config, prepared_dir: Path, out_dir: Path, threads: int = 1) -> None:
    """The whole stage in one process: fit, every shard in turn, merge; out_dir appears complete or not at all.

    Snakemake runs the same three steps as separate jobs (one per shard), DVC runs this. Memory is one
    padded batch and one shard's codes. A run killed mid-corpus (SIGKILL, the OOM killer, a lost node)
    leaves its temporary folder; the next run takes its fitted model and the shards it had finished
    (each written whole) when the settings and the prepared corpus (its manifest and its audio, by
    content) are the same; a SIGTERM (a scheduler's preemption) leaves them too.
    """
    _check_config(cfg)
    corpus = read_prepared(prepared_dir, cfg.data.sample_format)
    with resumable_dir(out_dir, "tokenize") as parts:
        parts.match(_resume_key(cfg, prepared_dir, corpus.shards))
        if not parts.take(MODEL_DIR, FIT):
            fit(cfg, prepared_dir, parts.tmp, threads)
        for shard in corpus.shards:
            if not parts.take(shard_name(shard), ENCODE_RECORD, check=shard_codes_problem):
                encode_shard(cfg, prepared_dir, parts.tmp, shard, threads)
        parts.done()
        merge(cfg, prepared_dir, parts.tmp)


def _resume_key(cfg: C.Config, prepared_dir: Path, shards: list[int]) -> dict:
    """What the fit and a shard's codes depend on: the settings of the steps up to them and the corpus,
    its manifest and every shard's audio by content (clips replaced by other sounds of the same names
    and lengths leave the manifest as it was)."""
    prepared_dir = Path(prepared_dir)
    return {
        "prepared_dir": str(prepared_dir.resolve()),
        "manifest_sha256": file_sha256(prepared_dir / MANIFEST),
        "audio_sha256": {shard_name(k): file_sha256(prepared_dir / shard_name(k) / AUDIO) for k in shards},
        "settings": C.settings(cfg, C.result_keys("tokenize_shard", cfg, upstream=True)),
    }


def _encodec_version() -> str | None:
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        return version("encodec")
    return None
