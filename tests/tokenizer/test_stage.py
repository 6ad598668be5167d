"""Tokenize stage: calibrated EnCodec codes, alignment with audio.npy, checkpoint loading, errors."""

from __future__ import annotations

import copy
import functools
import hashlib
import http.server
import json
import logging
import shutil
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from acoustic_mlm import config
from acoustic_mlm.tokenizer import codec, encode, loudness, stage
from acoustic_mlm.tokenizer.codec import TokenizerError
from acoustic_mlm.tokenizer.encode import EncodeSettings, encode_clips
from acoustic_mlm.tokenizer.kmeans import kmeans
from acoustic_mlm.utils import file_sha256

ROOT = Path(__file__).resolve().parents[2]
SR, HOP = 24_000, 320
CLIP_SECONDS = [4.0, 5.0, 3.2, 6.0, 4.48, 5.0, 2.56] * 2  # about 60 s; clips 3 and 10 are valid
CALIB_FRAMES, CALIB_ITERS = 3000, 6
MIN_DISTINCT = 200  # measured on this corpus: 1024, 613, 460, 405, 350, 321, 316, 314
MIN_ENTROPY_BITS = 3.0  # measured: 7.7, 6.2, 5.4, 5.2, 4.7, 4.7, 4.8, 4.5


# ----------------------------------------------------------------------------- fixtures


def synth_clip(rng: np.random.Generator, seconds: float) -> np.ndarray:
    """Chords of decaying harmonic tones, with noise-burst 'drums', as a 24 kHz float32 clip."""
    n = int(round(seconds * SR)) // HOP * HOP
    y, pos = np.zeros(n), 0
    while pos < n:
        seg_t = np.arange(min(int(rng.uniform(0.2, 0.6) * SR), n - pos)) / SR
        seg = np.zeros(len(seg_t))
        root = rng.integers(40, 70)
        for midi in root + np.array([0, rng.choice([3, 4]), 7, rng.choice([10, 11, 12])]):
            f = 440.0 * 2 ** ((midi - 69) / 12)
            for h in (1, 2, 3):
                seg += np.sin(2 * np.pi * f * h * seg_t + rng.uniform(0, 2 * np.pi)) / (4 * h)
        seg *= np.exp(-seg_t * rng.uniform(1, 6))
        if rng.random() < 0.5:
            seg += rng.normal(0, 0.3, len(seg)) * np.exp(-seg_t * 40)
        y[pos : pos + len(seg)] = seg
        pos += len(seg)
    y += rng.normal(0, 0.01, n)
    return (0.3 * y / np.abs(y).max()).astype(np.float32)


def make_prepared(folder: Path, seconds=CLIP_SECONDS, seed: int = 0, shard_clips: int = 5) -> Path:
    """A prepared folder as the prepare stage writes it: shard-<k>/audio.npy + manifest.csv."""
    from acoustic_mlm.data.corpus import shard_name

    rng = np.random.default_rng(seed)
    clips = [synth_clip(rng, s) for s in seconds]
    shards = [i // shard_clips for i in range(len(clips))]
    offsets = []
    for k in sorted(set(shards)):
        mine = [c for c, sh in zip(clips, shards) if sh == k]
        offsets += np.concatenate([[0], np.cumsum([len(c) for c in mine])[:-1]]).tolist()
        (folder / shard_name(k)).mkdir(parents=True, exist_ok=True)
        np.save(folder / shard_name(k) / "audio.npy", np.concatenate(mine))
    manifest = pd.DataFrame(
        {
            "clip_id": [f"clip{i:02d}" for i in range(len(clips))],
            "path": [f"synthetic/clip{i:02d}.wav" for i in range(len(clips))],
            "shard": shards,
            "split": ["valid" if i % 7 == 3 else "train" for i in range(len(clips))],
            "offset": offsets,
            "num_samples": [len(c) for c in clips],
            "num_frames": [len(c) // HOP for c in clips],
            "seconds": [len(c) / SR for c in clips],
        }
    )
    manifest.to_csv(folder / "manifest.csv", index=False)
    return folder


def shard_codes(folder: Path) -> list[np.ndarray]:
    return [np.load(p) for p in sorted(folder.glob("shard-*/codes.npy"))]


def clip_codes(prepared: Path, codes_dir: Path) -> list[np.ndarray]:
    """Each clip's (K, frames) codes, in manifest order, whatever the shard layout."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    codes = shard_codes(codes_dir)
    return [codes[r.shard][:, r.offset // HOP : r.offset // HOP + r.num_frames] for r in manifest.itertuples()]


LOUDNESS = {k: config.load(ROOT / "config" / "config.yaml")["tokenizer"][k] for k in ("loudness", "loudness_target")}
LOUDNESS = {"method": LOUDNESS["loudness"], "target": LOUDNESS["loudness_target"]}  # what the default preset normalises to


def tok_cfg(**tokenizer_keys) -> dict:
    cfg = copy.deepcopy(config.load(ROOT / "config" / "config.yaml"))
    cfg["tokenizer"].update(calibration_frames=CALIB_FRAMES, calibration_iters=CALIB_ITERS, batch_size=1,
                            **tokenizer_keys)
    return config.validate(cfg)


@pytest.fixture(autouse=True)
def two_torch_threads():
    """Codes depend on the thread count at float near-ties: compare them at the fixture's 2 threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("prepared"))


@pytest.fixture(scope="module")
def calibrated(prepared, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokenized"
    stage.run(tok_cfg(), prepared, out, threads=2)
    return out


def saved_checkpoint(state: dict, folder: Path) -> Path:
    """Save, hash, rename to encodec_24khz-<first 8 hex of sha256>.th, as EnCodec names its files."""
    tmp = folder / "state.th"
    torch.save(state, tmp)
    prefix = hashlib.sha256(tmp.read_bytes()).hexdigest()[:8]
    return tmp.rename(folder / f"encodec_24khz-{prefix}.th")


# ----------------------------------------------------------------------------- k-means and models


def test_kmeans_deterministic_no_empty_clusters():
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(40, 8, generator=g) * 5
    x = centers[torch.randint(40, (3000,), generator=g)] + 0.1 * torch.randn(3000, 8, generator=g)
    for init in ("plusplus", "random"):
        c1, n1 = kmeans(x, 64, 10, torch.Generator().manual_seed(1), init=init)
        c2, n2 = kmeans(x, 64, 10, torch.Generator().manual_seed(1), init=init)
        assert torch.equal(c1, c2) and torch.equal(n1, n2)
        assert c1.shape == (64, 8) and int(n1.sum()) == 3000 and bool((n1 > 0).all())
        if init == "plusplus":  # D^2 seeding finds every blob: no point is far from its centroid
            idx = torch.cdist(x, c1).argmin(1)
            assert float((x - c1[idx]).norm(dim=1).max()) < 1.0
    with pytest.raises(ValueError, match="N >= k"):
        kmeans(x[:10], 64, 3, torch.Generator())


def test_build_encodec_seeded_and_leaves_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = codec.build_encodec(6.0, 0), codec.build_encodec(6.0, 0), codec.build_encodec(6.0, 1)
    assert torch.equal(torch.rand(1), before)  # the caller's RNG stream is untouched
    w = "encoder.model.0.conv.conv.weight_v"
    assert torch.equal(a.state_dict()[w], b.state_dict()[w]) and not torch.equal(a.state_dict()[w], c.state_dict()[w])
    assert codec.n_codebooks(a) == 8 and not a.training


def test_untrained_encodec_emits_all_zero_codes():
    """The trap this module exists for: EnCodec's codebooks are zero until a training-mode init."""
    model = codec.build_encodec(6.0, 0)
    wav = torch.from_numpy(synth_clip(np.random.default_rng(1), 1.0))[None, None]
    with torch.no_grad():
        codes = model.encode(wav)[0][0]
    assert codes.shape == (1, 8, 75) and int(codes.abs().max()) == 0


# ----------------------------------------------------------------------------- the calibrated stage


def test_calibrated_stage_outputs(calibrated, prepared):
    manifest = pd.read_csv(prepared / "manifest.csv")
    codes = shard_codes(calibrated)
    assert len(codes) == 3  # 14 clips in shards of 5
    for k, c in enumerate(codes):
        audio = np.load(prepared / f"shard-{k:05d}" / "audio.npy")
        assert c.dtype == np.int16 and c.shape == (8, len(audio) // HOP)
        assert c.min() >= 0 and c.max() < 1024  # every column belongs to a clip here
        enc = json.loads((calibrated / f"shard-{k:05d}" / "encode.json").read_text())
        assert enc["clips"] == (manifest["shard"] == k).sum() and enc["x_real_time"] > 0
    meta = json.loads((calibrated / "tokenizer.json").read_text())
    assert meta["mode"] == "calibrated" and meta["n_codebooks"] == 8 and meta["frame_rate"] == 75
    assert meta["calibration_frames"] == CALIB_FRAMES and meta["calibration_iters"] == CALIB_ITERS
    assert (meta["shards"], meta["clips"]) == (3, len(manifest))
    assert meta["audio_seconds"] == pytest.approx(manifest["num_samples"].sum() / SR)
    every = np.concatenate(codes, axis=1)
    assert meta["distinct_codes"] == [len(np.unique(c)) for c in every]
    assert meta["max_code"] == [int(c.max()) for c in every]
    assert min(meta["distinct_codes"]) > MIN_DISTINCT, meta["distinct_codes"]
    assert all(MIN_ENTROPY_BITS < h <= 10.0 for h in meta["unigram_entropy_bits"]), meta["unigram_entropy_bits"]
    p = np.bincount(every[0], minlength=1024) / every.shape[1]
    assert meta["unigram_entropy_bits"][0] == pytest.approx(-(p[p > 0] * np.log2(p[p > 0])).sum(), abs=1e-4)
    assert meta["encode_seconds"] > 0 and meta["real_time_factor"] > 0
    assert (meta["loudness"]["method"], meta["loudness"]["target"]) == (LOUDNESS["method"], LOUDNESS["target"])  # config.yaml
    assert meta["calibration_frames_per_code"] == round(CALIB_FRAMES / 1024, 2)
    shares = [np.bincount(c, minlength=1024).max() / len(c) for c in every]
    assert meta["top_code_share"] == pytest.approx(shares, abs=1e-5)
    files = pd.read_csv(calibrated / "files.csv", keep_default_na=False)
    assert sorted(files["clip_id"]) == sorted(manifest["clip_id"]) and files["gain_db"].notna().all()
    for row in files.itertuples():  # each file's codebook-0 statistics, from its own columns
        clip = manifest.set_index("clip_id").loc[row.clip_id]
        c = codes[clip["shard"]][0, clip["offset"] // HOP : clip["offset"] // HOP + clip["num_frames"]]
        assert row.cb0_codes_used == len(np.unique(c))
        assert row.cb0_top_code_share == pytest.approx(np.bincount(c).max() / len(c), abs=1e-5)
        if LOUDNESS["method"] == "lufs":  # one gain per clip, to the target loudness
            assert row.lufs + row.gain_db == pytest.approx(LOUDNESS["target"], abs=0.02)
        assert row.gain_db != 0.0
    assert sorted(p.name for p in calibrated.iterdir()) == ["files.csv", "model", "shard-00000", "shard-00001",
                                                            "shard-00002", "tokenizer.json"]
    assert sorted(p.name for p in (calibrated / "model").iterdir()) == ["fit.json", "tokenizer.pt"]


def test_codes_aligned_and_equal_to_encodec_encode(calibrated, prepared):
    """tokenizer.pt rebuilds the exact tokenizer; EnCodec's own encode gives the written codes."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    written = clip_codes(prepared, calibrated)
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    torch.load(calibrated / "model" / "tokenizer.pt", weights_only=True)  # loads without unpickling code
    for row, codes in zip(manifest.itertuples(), written):
        audio = np.load(prepared / f"shard-{row.shard:05d}" / "audio.npy", mmap_mode="r")
        clip = np.asarray(audio[row.offset : row.offset + row.num_samples])
        gain = loudness.frame_gains(clip, LOUDNESS["method"], LOUDNESS["target"])  # what the tokenizer saw
        assert not np.all(gain == 1.0)
        wav = torch.from_numpy(clip * np.repeat(gain, HOP))[None, None]
        with torch.no_grad():
            own = model.encode(wav)[0][0][0].numpy()  # (K, T)
        assert own.shape == (8, row.num_samples // HOP)
        np.testing.assert_array_equal(codes, own)


def test_padded_batches_trim_each_clip_to_its_own_codes(calibrated, prepared):
    """Zero padding on the right does not change a clip's codes (the encoder is causal): batched
    codes equal one-clip-at-a-time codes but for rare float near-ties."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    clips = manifest[manifest["shard"] == 0]
    assert clips["num_samples"].nunique() > 2  # unequal lengths: real padding
    audio = np.load(prepared / "shard-00000" / "audio.npy", mmap_mode="r")
    alone = encode_clips(model, audio, clips, EncodeSettings(batch_size=1))
    batched = encode_clips(model, audio, clips, EncodeSettings(batch_size=4))
    assert (batched >= 0).all() and batched.shape == alone.shape
    same = (batched == alone).mean(axis=1)
    assert same[0] > 0.999 and same.min() > 0.99, same  # measured: 1.0 on level 0
    # Padding alone (one clip per batch, padded far past its end) changes nothing at all.
    with torch.no_grad():
        wav = torch.from_numpy(np.asarray(audio[: clips.num_samples[0]]).copy())
        plain = model.encode(wav[None, None])[0][0]
        padded = model.encode(torch.nn.functional.pad(wav, (0, 7 * HOP + 5))[None, None])[0][0]
    assert torch.equal(padded[..., : plain.shape[-1]], plain)


def test_pieces_cut_long_clips_into_segments_with_left_context():
    # clips of 10 and 3 frames at offsets 0 and 12 frames; segments of 4 frames, 2 frames of context
    assert encode.pieces([0, 12 * HOP], [10 * HOP, 3 * HOP], 4, 2) == [
        (0, 4, 0, 0), (2, 6, 2, 4), (6, 4, 2, 8), (12, 3, 0, 12)]
    assert encode.pieces([0], [10 * HOP], 0, 2) == [(0, 10, 0, 0)]  # 0: never segment


def test_encode_settings_from_config_round_seconds_to_frames():
    tc = {"batch_size": 2, "segment_seconds": 60.0, "context_seconds": 0.11}  # 0.11 s: 8.25 frames
    assert EncodeSettings.from_config(tc, "cpu") == EncodeSettings(batch_size=2, segment_frames=4500,
                                                                   context_frames=8, device="cpu")


def test_long_clips_encoded_in_segments_keep_their_codes(calibrated, prepared):
    """Segments with 1 s of left context give the whole clip's codes (the encoder forgets fast);
    without context, each segment's codes are exactly those of the segment alone."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    clips = manifest[manifest["shard"] == 0]
    audio = np.load(prepared / "shard-00000" / "audio.npy", mmap_mode="r")
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    whole = encode_clips(model, audio, clips)
    segmented = encode_clips(model, audio, clips, EncodeSettings(batch_size=3, segment_frames=75, context_frames=75))
    same = (segmented == whole).mean(axis=1)
    assert (segmented >= 0).all() and same.min() > 0.999, same  # measured: 1.0 on every level
    bare = encode_clips(model, audio, clips, EncodeSettings(segment_frames=75, context_frames=0))
    first = clips.offset.iloc[1] // HOP + 75  # the second segment of the second clip
    with torch.no_grad():
        alone = model.encode(torch.from_numpy(np.asarray(audio[first * HOP : (first + 75) * HOP]).copy())[None, None])
    np.testing.assert_array_equal(bare[:, first : first + 75], alone[0][0][0].numpy())


def test_padded_batches_are_longest_first():
    assert encode.padded_batches([5, 9, 9, 1, 7], 2) == [[1, 2], [4, 0], [3]]
    assert encode.padded_batches([3, 3], 8) == [[0, 1]]


def test_sharded_steps_run_separately_match_the_whole_stage(calibrated, prepared, tmp_path):
    """Snakemake runs fit, each shard and merge as separate jobs: the same files as `run`."""
    out, cfg = tmp_path / "steps", tok_cfg()
    stage.fit(cfg, prepared, out, threads=2)
    with pytest.raises(TokenizerError, match=r"shard-00000/encode\.json: not found \(run `amlm tokenize --shard 0`"):
        stage.merge(cfg, prepared, out)
    for k in (2, 0, 1):
        stage.encode_shard(cfg, prepared, out, k, threads=2)
    with pytest.raises(TokenizerError, match="no clips in shard 3"):
        stage.encode_shard(cfg, prepared, out, 3)
    stage.merge(cfg, prepared, out)
    for name in ("model/tokenizer.pt", "shard-00000/codes.npy", "shard-00002/codes.npy"):
        assert (out / name).read_bytes() == (calibrated / name).read_bytes(), name
    drop = ("encode_seconds", "real_time_factor", "x_real_time", "calibration_encoder_seconds",
            "calibration_kmeans_seconds", "calibration_seconds")
    a, b = (json.loads((d / "tokenizer.json").read_text()) for d in (out, calibrated))
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


def test_a_planned_shard_without_usable_clips_gets_empty_codes(calibrated, prepared, tmp_path):
    """Snakemake asks for every shard of the plan; one whose files were all rejected is encoded too."""
    prep, out = tmp_path / "prepared", tmp_path / "codes"
    shutil.copytree(prepared, prep)
    shutil.copytree(calibrated, out)
    (prep / "shard-00003").mkdir()
    np.save(prep / "shard-00003" / "audio.npy", np.zeros(0, np.float32))
    pd.DataFrame({"path": ["bad.wav"], "clip_id": ["bad"], "shard": [3], "skip": [""]}).to_csv(
        prep / "shards.csv", index=False)
    stage.encode_shard(tok_cfg(), prep, out, 3)
    assert np.load(out / "shard-00003" / "codes.npy").shape == (8, 0)
    assert json.loads((out / "shard-00003" / "encode.json").read_text())["clips"] == 0
    with pytest.raises(TokenizerError, match="no clips in shard 4"):
        stage.encode_shard(tok_cfg(), prep, out, 4)


def test_shard_layout_does_not_change_the_tokenizer_or_the_codes(calibrated, prepared, tmp_path):
    one = make_prepared(tmp_path / "one_shard", shard_clips=100)
    out = tmp_path / "codes"
    stage.run(tok_cfg(), one, out, threads=2)
    first, second = (torch.load(d / "model" / "tokenizer.pt", weights_only=True) for d in (calibrated, out))
    assert all(torch.equal(first[k], second[k]) for k in first)
    for a, b in zip(clip_codes(prepared, calibrated), clip_codes(one, out)):
        np.testing.assert_array_equal(a, b)


def test_tokenizer_deterministic_for_seed_whatever_the_threads(calibrated, prepared, tmp_path):
    """Same seed, other --threads: the identical tokenizer; codes equal up to float near-ties."""
    again = tmp_path / "again"
    stage.run(tok_cfg(), prepared, again, threads=1)
    first, second = (torch.load(d / "model" / "tokenizer.pt", weights_only=True) for d in (calibrated, again))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    same = (np.concatenate(shard_codes(again), 1) == np.concatenate(shard_codes(calibrated), 1)).mean(axis=1)
    assert same.min() > 0.995, same  # measured: 1.0 on level 0, >= 0.9995 on the others


def test_clipless_columns_are_minus_one(calibrated, prepared):
    audio = np.load(prepared / "shard-00000" / "audio.npy", mmap_mode="r")
    manifest = pd.read_csv(prepared / "manifest.csv")
    clips = manifest[manifest["shard"] == 0]
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    _, gain = loudness.clip_loudness(audio, clips, loudness.loudness_of(tok_cfg()))  # as the stage normalised them
    codes = encode_clips(model, audio, clips.drop(index=2).iloc[::-1], frame_gain=gain)  # any order
    gap = slice(manifest.offset[2] // HOP, manifest.offset[2] // HOP + manifest.num_frames[2])
    assert (codes[:, gap] == -1).all()
    full = np.load(calibrated / "shard-00000" / "codes.npy")
    full[:, gap] = -1
    np.testing.assert_array_equal(codes, full)


# ----------------------------------------------------------------------------- pretrained weights


def test_load_pretrained_checks_sha256(tmp_path):
    state = codec.build_encodec(6.0, 3).state_dict()
    good = saved_checkpoint(state, tmp_path)
    model = codec.load_pretrained(good, 6.0)
    assert torch.equal(model.state_dict()["decoder.model.0.conv.conv.bias"], state["decoder.model.0.conv.conv.bias"])
    assert codec.n_codebooks(model) == 8 and not model.training

    wrong = tmp_path / "encodec_24khz-00000000.th"
    shutil.copy(good, wrong)
    with pytest.raises(TokenizerError) as err:
        codec.load_pretrained(wrong, 6.0)
    msg = str(err.value)
    assert "\n" not in msg and str(wrong) in msg and "00000000" in msg and file_sha256(wrong) in msg

    plain = tmp_path / "weights.th"  # no prefix in the name: checked against expected_prefix
    shutil.copy(good, plain)
    with pytest.raises(TokenizerError, match=f"starting with {codec.OFFICIAL_SHA256_PREFIX}"):
        codec.load_pretrained(plain, 6.0)
    codec.load_pretrained(plain, 6.0, expected_prefix=good.stem.split("-")[1])

    junk = tmp_path / "junk.th"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(TokenizerError, match="not an EnCodec 24 kHz state_dict") as err:
        codec.load_pretrained(junk, 6.0, expected_prefix=file_sha256(junk)[:8])
    assert "\n" not in str(err.value)
    with pytest.raises(TokenizerError, match="checkpoint not found"):
        codec.load_pretrained(tmp_path / "absent.th", 6.0)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_load_pretrained_downloads_into_hub_cache(tmp_path, monkeypatch):
    served = tmp_path / "served"
    served.mkdir()
    good = saved_checkpoint(codec.build_encodec(6.0, 4).state_dict(), served)
    shutil.copy(good, served / "encodec_24khz-00000000.th")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    cache = Path(torch.hub.get_dir()) / "checkpoints"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(TokenizerError, match="sha256 mismatch"):
            codec.load_pretrained(None, 6.0, url=f"{base}/encodec_24khz-00000000.th")
        assert not cache.exists() or list(cache.iterdir()) == []  # nothing half-written is left
        with pytest.raises(TokenizerError, match="download failed"):
            codec.load_pretrained(None, 6.0, url=f"{base}/encodec_24khz-12345678.th")
        codec.load_pretrained(None, 6.0, url=f"{base}/{good.name}")
    finally:
        server.shutdown()
    assert sorted(p.name for p in cache.iterdir()) == [good.name]
    codec.load_pretrained(None, 6.0, url=f"{base}/{good.name}")  # server gone: the cache is used


def test_pretrained_mode_reproduces_calibrated_codes(calibrated, prepared, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    path = saved_checkpoint(torch.load(calibrated / "model" / "tokenizer.pt", weights_only=True), ckpt)
    out = tmp_path / "pretrained"
    stage.run(tok_cfg(mode="pretrained", checkpoint=str(path)), prepared, out, threads=2)
    # Pretrained mode is EnCodec 24 kHz as released: no loudness normalisation, the raw clips' codes.
    manifest = pd.read_csv(prepared / "manifest.csv")
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    audio = np.load(prepared / "shard-00001" / "audio.npy", mmap_mode="r")
    raw = encode_clips(model, audio, manifest[manifest["shard"] == 1], EncodeSettings(batch_size=1))
    np.testing.assert_array_equal(shard_codes(out)[1], raw)
    assert (shard_codes(out)[1] != shard_codes(calibrated)[1]).mean() > 0.2  # the calibrated mode's codes are of normalised audio
    meta = json.loads((out / "tokenizer.json").read_text())
    assert meta["loudness"]["method"] == "none"
    assert meta["mode"] == "pretrained" and meta["checkpoint"]["sha256"].startswith(path.stem.split("-")[1])
    assert meta["calibration_frames_requested"] is None
    assert not (out / "model" / "tokenizer.pt").exists()


# ----------------------------------------------------------------------------- loudness normalisation and diagnostics


def test_frame_gains_bring_clips_to_the_target_and_leave_silence_alone():
    rng = np.random.default_rng(0)
    x = (0.05 * rng.standard_normal(SR * 3)).astype(np.float32)
    g = loudness.frame_gains(x, "lufs", -23.0)
    assert g.shape == (len(x) // HOP,) and np.all(g == g[0])
    assert loudness.loudness_lufs(x * g[0]) == pytest.approx(-23.0, abs=0.01)
    g40 = loudness.frame_gains(x * 0.01, "lufs", -23.0)  # 40 dB quieter: 40 dB more gain, same result
    assert 20 * np.log10(g40[0] / g[0]) == pytest.approx(40.0, abs=0.01)
    quiet_then_loud = np.concatenate([x * 0.01, x]).astype(np.float32)
    r = loudness.frame_gains(quiet_then_loud, "rms", -20.0)  # one gain per window
    w = loudness.LOUDNESS_WINDOW_FRAMES
    assert np.all(r[:w] == r[0]) and r[w] != r[0]
    assert loudness.rms_dbfs(quiet_then_loud[: w * HOP] * r[0]) == pytest.approx(-20.0, abs=0.01)
    assert 20 * np.log10(np.median(r[: len(r) // 2]) / np.median(r[len(r) // 2 :])) == pytest.approx(40.0, abs=0.3)
    silence = np.zeros(SR * 2, np.float32)
    for method in loudness.LOUDNESS_METHODS:
        assert np.all(loudness.frame_gains(silence, method, -23.0) == 1.0)  # silence stays silence
    assert np.all(loudness.frame_gains(x[: SR // 10], "lufs", -23.0) == 1.0)  # under 400 ms: not measurable
    assert np.all(loudness.frame_gains(x, "none", -23.0) == 1.0)
    with pytest.raises(TokenizerError, match="tokenizer.loudness"):
        loudness.frame_gains(x, "peak", -23.0)


def _sine(freq: float, seconds: float, amplitude: float = 1.0) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * freq * np.arange(int(seconds * SR)) / SR)).astype(np.float32)


def test_window_loudness_is_bs1770_per_window():
    """A 0 dBFS 1 kHz sine reads -3.01 LUFS (BS.1770-4's calibration) in every window but the first
    (the filter's start-up), as pyloudnorm's integrated loudness of the whole clip; the partial last
    window is measured on its own samples; the filter's tail fades within two windows of silence."""
    w = loudness.LOUDNESS_WINDOW_FRAMES * HOP
    x = _sine(1000, 2.0)
    loud = loudness.window_loudness(x, w)
    assert len(loud) == -(-len(x) // w) and loud[1:] == pytest.approx(-3.01, abs=0.06)
    assert loudness.loudness_lufs(x) == pytest.approx(-3.01, abs=0.06)
    short = loudness.window_loudness(x[: len(x) - w // 2], w)
    assert short[-1] == pytest.approx(loud[-2], abs=0.06)  # half a window: the same loudness, not 3 dB less
    gap = loudness.window_loudness(np.concatenate([x[:w], np.zeros(3 * w, np.float32), x[:w]]), w)
    assert gap[1] < -40 and gap[2] < loudness.WINDOW_SILENCE_DB and gap[4] == pytest.approx(gap[0])  # filter tail
    assert np.isneginf(loudness.window_loudness(np.zeros(2 * w), w)).all()
    for frames in (1, 5, 8):  # clips of one window or less: one gain, bringing them to the target
        g = loudness.frame_gains(x[: frames * HOP], "kweighted", -23.0)
        assert len(g) == frames and np.all(g == g[0]) and 20 * np.log10(g[0]) == pytest.approx(-23 + 3.01, abs=1.5)


def test_kweighted_loudness_discounts_low_frequencies():
    """The point of loudness kweighted: a 40 Hz hum and a 1 kHz tone of the same RMS are not equally loud.
    K-weighting reads the hum 6.2 dB quieter (BS.1770's filters: -5.6 dB at 40 Hz, +0.6 dB at 1 kHz),
    so the tokenizer raises it by that much more, where loudness rms turns both by the same gain (glacier-bay-humpback:
    -8.9 dBFS RMS but -28 LUFS, docs/tokenizer.md)."""
    hum, tone = _sine(40, 2.0, 0.5), _sine(1000, 2.0, 0.5)
    k_hum, k_tone = (loudness.frame_gains(x, "kweighted", -23.0) for x in (hum, tone))
    r_hum, r_tone = (loudness.frame_gains(x, "rms", -23.0) for x in (hum, tone))
    w = loudness.LOUDNESS_WINDOW_FRAMES
    assert 20 * np.log10(r_hum / r_tone) == pytest.approx(0.0, abs=0.2)  # 107 ms holds 4.3 periods of 40 Hz
    extra_db = 20 * np.log10(np.median(k_hum) / np.median(k_tone))
    assert extra_db == pytest.approx(5.59 + 0.64, abs=0.1)
    assert np.all(k_tone[:w] == k_tone[0]) and len(k_tone) == len(tone) // HOP
    # the windows' loudness after their gains is the target
    scaled = tone * np.repeat(k_tone, HOP)[: len(tone)]
    assert loudness.window_loudness(scaled[w * HOP :], w * HOP)[:-1] == pytest.approx(-23.0, abs=0.1)


def test_windows_at_the_silence_floor_keep_gain_one():
    """Digital silence and a window at or below WINDOW_SILENCE_DB keep gain 1; a window just above is
    brought to the target."""
    w = loudness.LOUDNESS_WINDOW_FRAMES * HOP
    tone = _sine(1000, w * 3 / SR)
    floor = loudness.WINDOW_SILENCE_DB
    below = tone * 10 ** ((floor - 1 + 3.01) / 20)  # 1 dB under the floor, in LUFS
    above = tone * 10 ** ((floor + 5 + 3.01) / 20)
    x = np.concatenate([tone, below, np.zeros(w * 3, np.float32), above]).astype(np.float32)
    g = loudness.frame_gains(x, "kweighted", -23.0)
    n = loudness.LOUDNESS_WINDOW_FRAMES
    assert np.all(g[4 * n : 9 * n] == 1.0)  # below the floor (after the tone's filter tail), then zeros
    assert 20 * np.log10(g[-1]) == pytest.approx(-23.0 - floor - 5, abs=0.2)


def test_loudness_normalised_codes_do_not_depend_on_the_recording_level(calibrated, prepared):
    """The same clip 30 dB quieter: the same codes with loudness kweighted and lufs, other codes without."""
    manifest = pd.read_csv(prepared / "manifest.csv")
    model = codec.load_calibrated(calibrated / "model" / "tokenizer.pt")
    row = manifest.iloc[0]
    audio = np.load(prepared / f"shard-{row['shard']:05d}" / "audio.npy", mmap_mode="r")
    clip = np.asarray(audio[row["offset"] : row["offset"] + row["num_samples"]])
    quiet = (clip * 10 ** (-30 / 20)).astype(np.float32)
    one = pd.DataFrame({"offset": [0], "num_samples": [len(clip)]})

    def codes(x, method):
        return encode_clips(model, x, one, frame_gain=loudness.frame_gains(x, method, -23.0))

    for method in ("kweighted", "lufs"):
        assert (codes(clip, method)[0] == codes(quiet, method)[0]).mean() > 0.99, method
    assert (codes(clip, "none")[0] == codes(quiet, "none")[0]).mean() < 0.5


def test_a_tokenizer_fitted_at_another_loudness_is_refused(calibrated, prepared, tmp_path):
    shutil.copytree(calibrated, tmp_path / "codes")
    other = "lufs" if LOUDNESS["method"] == "rms" else "rms"
    with pytest.raises(TokenizerError, match=rf"fit.json: fitted with loudness {LOUDNESS['method']} "
                                             rf"{LOUDNESS['target']}, the config asks for {other} -20.0 "
                                             r"\(tokenizer.loudness\); rerun `amlm tokenize --fit`"):
        stage.encode_shard(tok_cfg(loudness=other, loudness_target=-20.0), prepared, tmp_path / "codes", 0)


def test_merge_reports_each_files_loudness_and_warns_once_about_a_crowded_code(data_dirs, tmp_path, caplog):
    prepared, codes_dir = data_dirs
    out = tmp_path / "codes"
    shutil.copytree(codes_dir, out)
    with caplog.at_level(logging.WARNING, logger="acoustic_mlm"):
        meta = stage.merge({"tokenizer": {"batch_size": 1}}, prepared, out)
    every = np.concatenate([np.load(out / f"shard-{k:05d}" / "codes.npy") for k in range(2)], axis=1)
    shares = [np.bincount(c, minlength=1024).max() / len(c) for c in every]
    assert meta["top_code_share"] == pytest.approx(shares, abs=1e-5) and min(shares) > 0.10  # code 0: 16/136
    warnings_ = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    top0 = int(np.bincount(every[0]).argmax())
    assert len(warnings_) == 1, warnings_
    assert f"one code holds more than 10% of a level's frames: level 0 code {top0} ({100 * shares[0]:.1f}%)" in warnings_[0]
    files = pd.read_csv(out / "files.csv", keep_default_na=False)
    assert files["clip_id"].tolist() == [f"c{i}" for i in range(6)]
    assert list(files.columns) == ["clip_id", "path", "split", "seconds", "rms_dbfs", "lufs", "gain_db",
                                   "cb0_codes_used", "cb0_entropy_bits", "cb0_top_code_share"]
    c0 = every[0, :150]  # clip c0: the first 150 columns of shard 0
    p = np.bincount(c0) / len(c0)
    assert files.loc[0, "cb0_entropy_bits"] == pytest.approx(-(p[p > 0] * np.log2(p[p > 0])).sum(), abs=1e-4)
    assert files.loc[0, "cb0_codes_used"] == len(np.unique(c0))


# ----------------------------------------------------------------------------- input errors


@pytest.mark.parametrize(
    "breakage, needle",
    [
        ("no_audio", "audio.npy: not found"),
        ("no_manifest", "manifest.csv: not found"),
        ("int_audio", "audio.npy: expected a 1-D float32 array"),
        ("no_column", "manifest.csv: missing column(s) num_frames"),
        ("past_end", "manifest.csv: clip 'clip06' (row 8): offset + num_samples exceeds"),
        ("frames", "manifest.csv: clip 'clip01' (row 3): num_frames != num_samples // 320"),
        ("ragged", "manifest.csv: clip 'clip00' (row 2): num_samples is not a positive multiple of 320"),
        ("overlap", "manifest.csv: clip 'clip02' (row 4) overlaps another clip"),
        ("no_train", "manifest.csv: no train clips to calibrate on"),
    ],
)
def test_bad_inputs_fail_in_one_line_naming_the_file(breakage, needle, tmp_path):
    prep = make_prepared(tmp_path / "prep", seconds=[2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0])
    m = pd.read_csv(prep / "manifest.csv")
    if breakage == "no_audio":
        (prep / "shard-00000" / "audio.npy").unlink()
    elif breakage == "no_manifest":
        (prep / "manifest.csv").unlink()
    elif breakage == "int_audio":
        np.save(prep / "shard-00000" / "audio.npy", np.zeros(10, dtype=np.int16))
    elif breakage == "no_column":
        m.drop(columns="num_frames").to_csv(prep / "manifest.csv", index=False)
    elif breakage == "past_end":
        m.loc[6, "offset"] += HOP
    elif breakage == "frames":
        m.loc[1, "num_frames"] += 1
    elif breakage == "ragged":
        m.loc[0, "num_samples"] -= 1
    elif breakage == "overlap":
        m.loc[2, "offset"] -= HOP
    elif breakage == "no_train":
        m["split"] = "valid"
    if breakage in ("past_end", "frames", "ragged", "overlap", "no_train"):
        m.to_csv(prep / "manifest.csv", index=False)
    with pytest.raises(TokenizerError) as err:
        stage.run(tok_cfg(), prep, tmp_path / "out")
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert str(prep) in str(err.value)
    assert not (tmp_path / "out").exists()
