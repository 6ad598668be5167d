"""Decoding one file: mixed to mono, resampled (odd rates quickly), trimmed to whole EnCodec frames, or
Unusable with the reason rejects.csv records; the frames a header declares (header_frames)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
from data_helpers import SR, make_cfg, make_messy_folder, sine
from helpers import make_config

from acoustic_mlm import encodec
from acoustic_mlm.artifacts.prepared import load_prepared
from acoustic_mlm.data import decode, fetch, prepare


def test_44k_stereo_wav_is_mixed_and_resampled(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    left = sine(440.0, 0.5, 44100, amp=0.5)
    sf.write(raw / "tone.wav", np.stack([left, np.zeros_like(left)], axis=1), 44100)  # right channel silent
    sf.write(raw / "other.wav", sine(220.0, 0.5, 44100)[:, None], 44100)
    prepare.run(make_config(make_cfg()), raw, tmp_path / "prepared")
    corpus = load_prepared(tmp_path / "prepared")
    row = corpus.manifest.set_index("clip_id").loc["tone"]
    assert (row.orig_sample_rate, row.orig_channels) == (44100, 2)
    assert row.num_samples == (int(0.5 * SR) // encodec.HOP) * encodec.HOP == 11840
    x = np.asarray(corpus.clip(int(np.flatnonzero(corpus.manifest["clip_id"] == "tone")[0])), dtype=np.float64)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    peak_hz = np.fft.rfftfreq(len(x), 1 / SR)[np.argmax(spectrum)]
    assert abs(peak_hz - 440.0) < 3.0  # bin width 2 Hz
    middle = x[1000:-1000]
    assert np.abs(middle).max() == pytest.approx(0.25, abs=0.01)  # mean of 0.5 and 0


def test_folder_with_good_and_bad_files(tmp_path, caplog):
    good, bad = make_messy_folder(tmp_path / "music")
    cfg = make_cfg(crop_seconds=0.5)
    cfg["data"].update(source="folder", folder=str(tmp_path / "music"))
    fetch.run(make_config(cfg), tmp_path / "data" / "raw")
    with caplog.at_level(logging.INFO, logger="acoustic_mlm"):
        prepare.run(make_config(cfg), tmp_path / "data" / "raw", tmp_path / "data" / "prepared")
    corpus = load_prepared(tmp_path / "data" / "prepared")
    manifest = corpus.manifest
    assert sorted(manifest["path"]) == sorted(good)
    for _, row in manifest.iterrows():
        assert (row.orig_sample_rate, row.orig_channels) == good[row.path], row.path
        assert row.num_samples == 75 * encodec.HOP or row.path.endswith(".mp3"), row  # 1 s = 75 frames
        assert abs(row.duration_s - 1.0) < 0.06, row
    assert all(np.isfinite(corpus.audio(k)).all() for k in corpus.shards)

    rejects = pd.read_csv(tmp_path / "data" / "prepared" / "rejects.csv", keep_default_na=False)
    assert list(rejects.columns) == ["path", "reason"]
    got = dict(zip(rejects["path"], rejects["reason"]))
    assert sorted(got) == sorted(bad)
    for path, kind in bad.items():
        assert prepare.reason_kind(got[path]) in ((kind,) if isinstance(kind, str) else kind), (path, got[path])
        assert "\n" not in got[path]
    summary = json.loads((tmp_path / "data" / "prepared" / "prepare.json").read_text())
    assert (summary["kept"], summary["rejected"]) == (len(good), len(bad))
    assert sum(summary["rejected_by_reason"].values()) == len(bad)
    assert f"kept {len(good)} files, rejected {len(bad)}" in caplog.text


def test_odd_sample_rate_is_resampled_quickly_and_nearly_exactly(tmp_path):
    x = sine(441.0, 2.0, 44101)
    (tmp_path / "raw").mkdir()
    sf.write(tmp_path / "raw" / "a.wav", x, 44101)
    sf.write(tmp_path / "raw" / "b.wav", x, 44101)
    prepare.run(make_config(make_cfg()), tmp_path / "raw", tmp_path / "prepared")
    corpus = load_prepared(tmp_path / "prepared")
    assert corpus.manifest["orig_sample_rate"].tolist() == [44101, 44101]
    y = np.asarray(corpus.clip(0), dtype=np.float64)
    peak_hz = np.fft.rfftfreq(len(y), 1 / SR)[np.argmax(np.abs(np.fft.rfft(y * np.hanning(len(y)))))]
    assert abs(peak_hz - 441.0) < 1.0


def test_decode_gives_each_bad_file_its_reason_and_each_good_one_whole_frames(tmp_path):
    """decode itself, file by file, on the folder test_folder_with_good_and_bad_files prepares."""
    good, bad = make_messy_folder(tmp_path / "music")
    min_samples = int(0.5 * SR)
    for path, kind in bad.items():
        with pytest.raises(decode.Unusable) as why:
            decode.decode(tmp_path / "music" / path, SR, min_samples)
        assert prepare.reason_kind(str(why.value)) in ((kind,) if isinstance(kind, str) else kind), (path, why.value)
    for path, (rate, channels) in good.items():
        audio, orig_rate, orig_channels = decode.decode(tmp_path / "music" / path, SR, min_samples)
        assert (orig_rate, orig_channels) == (rate, channels), path
        assert audio.dtype == np.float32 and audio.ndim == 1 and len(audio) % encodec.HOP == 0, path


def test_implausible_rates_and_out_of_range_peaks_are_unusable(tmp_path):
    sf.write(tmp_path / "slow.wav", sine(100, 1.0, 2000), 2000)
    with pytest.raises(decode.Unusable, match=r"^implausible sample rate: 2000 Hz, outside 4000-384000 Hz"):
        decode.decode(tmp_path / "slow.wav", SR, encodec.HOP)
    sf.write(tmp_path / "loud.wav", 1e6 * sine(440, 1.0, SR), SR, subtype="FLOAT")
    with pytest.raises(decode.Unusable, match=r"^samples out of range: peak 5e\+05, beyond \+-1000 \(60 dB over"):
        decode.decode(tmp_path / "loud.wav", SR, encodec.HOP)


@pytest.mark.parametrize("fmt", ["WAV", "AIFF", "AU", "W64"])
def test_header_frames_is_what_the_header_declares_even_when_the_data_stops_early(tmp_path, fmt):
    path = tmp_path / f"tone.{fmt.lower()}"
    sf.write(path, np.stack([sine(440, 1.0, SR)] * 2, axis=1), SR, format=fmt, subtype="PCM_16")
    assert decode.header_frames(path) == SR
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the header still says 1 s
    assert decode.header_frames(path) == SR
    assert sf.info(str(path)).frames < SR  # what libsndfile reports: what is there


def test_header_frames_is_zero_when_unknown(tmp_path):
    sf.write(tmp_path / "a.flac", sine(440, 1.0, SR), SR)  # FLAC's decoder checks its own length
    (tmp_path / "notes.wav").write_text("not audio")
    sf.write(tmp_path / "b.wav", sine(440, 1.0, SR), SR)
    (tmp_path / "cut.wav").write_bytes((tmp_path / "b.wav").read_bytes()[:30])  # cut inside the fmt chunk
    for name in ("a.flac", "notes.wav", "cut.wav", "missing.wav"):
        assert decode.header_frames(tmp_path / name) == 0, name


@pytest.mark.parametrize("fmt", ["WAV", "MP3", "FLAC"])
def test_a_files_bytes_decode_as_the_file_does(tmp_path, fmt):
    path = tmp_path / f"tone.{fmt.lower()}"
    sf.write(path, np.stack([sine(440, 1.0, 44100)] * 2, axis=1), 44100, format=fmt)
    data = path.read_bytes()
    from_bytes, from_file = decode.decode(data, SR, encodec.HOP), decode.decode(path, SR, encodec.HOP)
    assert from_bytes[0].tobytes() == from_file[0].tobytes() and from_bytes[1:] == from_file[1:] == (44100, 2)
    assert decode.header_frames(data) == decode.header_frames(path)
    # cut short, empty or not audio: the same reason either way
    for bad in (data[: len(data) // 2], b"", b"not audio at all" * 8):
        (tmp_path / "bad").write_bytes(bad)
        with pytest.raises(decode.Unusable) as by_bytes:
            decode.decode(bad, SR, encodec.HOP)
        with pytest.raises(decode.Unusable) as by_file:
            decode.decode(tmp_path / "bad", SR, encodec.HOP)
        assert str(by_bytes.value) == str(by_file.value), (fmt, len(bad))
