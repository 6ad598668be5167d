"""The data side of the GPU presets, offline and without data: corpus, download, disk, CPU hours of
prepare and tokenize, and epochs at the preset's updates, from constants with their source."""

from __future__ import annotations

from pathlib import Path

import pytest

from acoustic_mlm import config as C
from acoustic_mlm.data import sources
from acoustic_mlm.preflight import data_costs as D

ROOT = Path(__file__).resolve().parents[2]
GPU_PRESETS = {"paper": "fma_full", "paper-1node": "fma_full", "gpu-small": "fma_large", "proxy-gpu": "fma_medium"}


@pytest.mark.parametrize("preset,source", sorted(GPU_PRESETS.items()))
def test_every_gpu_preset_trains_on_real_music_against_the_official_encodec(preset, source):
    cfg = C.load(ROOT / "config" / f"{preset}.yaml")
    assert cfg.data.source == source and cfg.tokenizer.mode == "pretrained" and cfg.data.sample_format == "int16"
    assert cfg.data.max_extract_gb * 1e9 >= D.KNOWN_CORPORA[source].download_gib * 2**30  # fetch would refuse less
    r = D.data_costs(cfg, cores=16)
    hours = D.KNOWN_CORPORA[source].hours
    assert r["corpus_hours"] == pytest.approx(hours) and "github.com/mdeff/fma" in r["corpus_source"]
    seen_h = cfg.train.steps * cfg.train.batch_size * cfg.train.accum_steps * cfg.crop_frames * 320 / 24000 / 3600
    assert r["epochs"] == pytest.approx(seen_h / (hours * (1 - cfg.data.valid_fraction)))
    assert r["prepared_gb"] == pytest.approx(hours * 3600 * 24000 * 2 / 1e9)  # int16: 2 bytes per sample
    assert r["codes_gb"] == pytest.approx(hours * 3600 * 75 * 8 * 2 / 1e9)
    # FMA's zip is read in place by prepare (nothing extracted), and kept: data.remove_archive is false
    assert r["extracted_gb"] == 0 and not cfg.data.remove_archive and not r["archive_removed"]
    assert r["disk_gb"] == pytest.approx(r["download_gb"] + r["prepared_gb"] + r["codes_gb"])
    assert r["peak_disk_gb"] == r["final_disk_gb"] == r["disk_gb"]  # nothing is removed along the way
    assert r["free_gb"] > 0 and r["disk_fits"] == (r["peak_disk_gb"] <= r["free_gb"])
    # on a GPU: EnCodec's counted FLOPs at the assumed share of the fp32 peak
    assert r["tokenize_gflops_per_audio_second"] == pytest.approx(3.137, abs=0.001)
    assert r["tokenize_gpu_hours"] == pytest.approx(hours * 3600 * 3.1368192e9 / (67e12 * 0.35) / 3600)
    assert r["tokenize_hours"] == pytest.approx(hours * D.TOKENIZE_CORE_HOURS_PER_AUDIO_HOUR / 16)
    assert r["prepare_hours"] == pytest.approx(hours * D.PREPARE_CORE_HOURS_PER_AUDIO_HOUR / 16)
    page = " ".join(D.lines(r))
    assert f"{D._n(r['epochs'])} epochs" in page and "a lower bound, not measured" in page
    assert f"on one H100 / H200 (SXM): {D._n(r['tokenize_gpu_hours'])} h" in page


def test_fma_full_tokenizes_in_hours_on_a_gpu_by_its_counted_flops_against_1780_on_two_cores():
    r = D.data_costs(C.load(ROOT / "config" / "paper.yaml"), 2)
    assert round(r["tokenize_hours"]) == 1780  # CPU: measured per core (BENCHMARKS.md)
    assert 1.0 < r["tokenize_gpu_hours"] < 1.2  # 8,232 h x 3.14 GFLOP/s at 35 % of 67 TFLOP/s: a lower bound


def test_the_peak_that_does_not_fit_the_free_space_is_marked(tmp_path, monkeypatch):
    cfg = C.load(ROOT / "config" / "gpu-small.yaml")
    monkeypatch.setattr(sources.shutil, "disk_usage", lambda p: type("U", (), {"free": 64 * 2**30})())
    r = D.data_costs(cfg, 2, data_dir=tmp_path / "not" / "yet")
    assert r["free_where"] == str(tmp_path) and r["free_gb"] == pytest.approx(68.72, abs=0.01)
    # gpu-small: fma_large's 99.9 GB zip read in place + 153.5 GB of int16 audio + 3.8 GB of codes
    assert r["disk_fits"] is False and round(r["peak_disk_gb"]) == 257
    assert "(**the peak does not fit**)" in " ".join(D.lines(r))


def test_removing_the_archive_once_prepared_lowers_the_end_and_the_peak_to_prepares_end():
    kept = C.load(ROOT / "config" / "gpu-small.yaml")
    m = kept.mapping
    m["data"]["remove_archive"] = True
    r, k = D.data_costs(C.from_mapping(m), 2), D.data_costs(kept, 2)
    assert r["archive_removed"] and r["extracted_gb"] == 0
    # at prepare's end: the archive and the prepared audio; when done: the prepared audio and the codes
    assert r["peak_disk_gb"] == pytest.approx(r["download_gb"] + r["prepared_gb"])
    assert r["final_disk_gb"] == pytest.approx(r["prepared_gb"] + r["codes_gb"])
    assert (round(r["peak_disk_gb"]), round(r["final_disk_gb"]), round(k["final_disk_gb"])) == (253, 157, 257)
    page, kept_page = " ".join(D.lines(r)), " ".join(D.lines(k))
    assert "disk 253 GB at the peak and 157 GB when done (archive 99.9, read in place and removed once prepared" in page
    assert "(archive 99.9, read in place and kept, + prepared audio 153 (int16, 24 kHz) + codes 3.84)" in kept_page


def test_the_figures_the_preset_headers_quote():
    full, large = D.KNOWN_CORPORA["fma_full"], D.KNOWN_CORPORA["fma_large"]
    assert round(large.hours) == 888 and full.hours == 8232 and full.tracks == large.tracks == 106_574
    epochs = {p: D.data_costs(C.load(ROOT / "config" / f"{p}.yaml"), 1)["epochs"] for p in GPU_PRESETS}
    assert round(epochs["paper"]) == round(epochs["paper-1node"]) == 69
    assert round(epochs["gpu-small"]) == 178 and round(epochs["proxy-gpu"], 2) == 0.76
    paper = D.data_costs(C.load(ROOT / "config" / "paper.yaml"), 1)
    assert round(paper["mert_epochs"], 1) == 3.2  # MERT-330M's 160K h by step 100K
    assert round(paper["download_gb"]) == 944


def test_float32_doubles_the_prepared_audio_and_an_unknown_corpus_asks_for_its_hours():
    cfg = C.load(ROOT / "config" / "gpu-small.yaml")
    m = cfg.mapping
    m["data"]["sample_format"] = "float32"
    r = D.data_costs(C.from_mapping(m), 4)
    assert r["prepared_gb"] == pytest.approx(2 * D.data_costs(cfg, 4)["prepared_gb"])
    m["data"].update(source="folder", folder="/music")
    r = D.data_costs(C.from_mapping(m), 4)
    assert "pass --corpus-hours" in r["note"] and "epochs" not in r
    r = D.data_costs(C.from_mapping(m), 4, corpus_hours=160_000)
    assert r["download_gb"] == 0.0 and r["epochs"] == pytest.approx(r["mert_epochs"] / (1 - cfg.data.valid_fraction))
