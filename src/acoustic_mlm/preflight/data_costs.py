"""The data side of a preset, before any download: what the corpus is, what fetching it downloads, the
disk its stages take, the hours prepare and tokenize need on CPU cores, and how many epochs of it the
preset's updates are. Offline and instant: corpus sizes are constants with their source, the stages'
speeds measured per core (BENCHMARKS.md, "The data stages per core"). A projection, not a measurement.
"""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm import config as C
from acoustic_mlm import encodec

# the corpora's sizes, the bytes per sample and the disk plan: one place, data.sources (fetch refuses by them)
from acoustic_mlm.data.sources import (  # noqa: F401  (SAMPLE_BYTES, KnownCorpus: read from here by project, tests)
    GB,
    GIB,
    KNOWN_CORPORA,
    SAMPLE_BYTES,
    KnownCorpus,
    disk_plan,
    free_gb,
    reads_in_place,
)

# Measured on one CPU core (AMD EPYC, torch 2.9.1), benchmarks/data_throughput.py on 30 s clips of real
# music as 44.1 kHz stereo MP3 (BENCHMARKS.md): core-hours per hour of audio (205x and 2.31x real time).
PREPARE_CORE_HOURS_PER_AUDIO_HOUR = 0.00487  # MP3 decode, mix to mono, resample to 24 kHz
TOKENIZE_CORE_HOURS_PER_AUDIO_HOUR = 0.4325  # EnCodec 24 kHz's encoder and RVQ at 6 kbps (pretrained architecture)
# The GPU tokenization estimate: EnCodec's counted FLOPs (flops.encodec_flops_per_second) on one GPU at an assumed
# share of its fp32 peak (the tokenizer runs EnCodec in float32; NVIDIA's H100/H200 SXM datasheet: 67 TFLOP/s).
# A lower bound on the time: not measured on a GPU, and the encoder's LSTM steps through 75 frames per audio
# second one after another.
TOKENIZE_GPU = ("H100 / H200 (SXM)", 67.0)
TOKENIZE_GPU_UTILISATION = 0.35
MERT_330M_HOURS = 160_000  # MERT's training corpus (Li et al. 2023, arXiv 2306.00107)


def corpus_seconds(cfg: C.Config, corpus_hours: float | None = None) -> float | None:
    """Seconds of audio the preset's source holds, where it can be known before fetching."""
    if corpus_hours is not None:
        return corpus_hours * 3600.0
    d = cfg.data
    if d.source == "synthetic":
        return d.synthetic.n_clips * d.synthetic.clip_seconds
    known = KNOWN_CORPORA.get(d.source)
    return None if known is None else known.hours * 3600.0


def epochs(cfg: C.Config, seconds: float) -> float:
    """Passes over the train split the preset's updates make: steps x crops per update x crop length over
    the train split's audio (1 - data.valid_fraction of the corpus)."""
    t = cfg.train
    seen = t.steps * t.batch_size * t.accum_steps * cfg.crop_frames * encodec.HOP / cfg.data.sample_rate
    return seen / (seconds * (1.0 - cfg.data.valid_fraction))


def data_costs(cfg: C.Config, cores: int, corpus_hours: float | None = None, data_dir: Path = Path("data")) -> dict:
    """The corpus, its download and disk (GB, decimal) at the peak and when the data stages are done, the free
    space where the data goes (`data_dir`), the CPU hours of prepare and tokenize (per core and on `cores`
    cores) and a GPU estimate of tokenize from counted FLOPs, and the epochs the preset's updates make of it."""
    d = cfg.data
    seconds = corpus_seconds(cfg, corpus_hours)
    known = KNOWN_CORPORA.get(d.source) if corpus_hours is None else None
    out: dict = {
        "source": d.source,
        "sample_format": d.sample_format,
        "corpus_source": known.source if known else ("--corpus-hours" if corpus_hours is not None else None),
        "corpus_hours": None if seconds is None else seconds / 3600.0,
        "tokenizer": cfg.tokenizer.mode,
        "cores": cores,
        "throughput_source": "BENCHMARKS.md, The data stages per core (benchmarks/data_throughput.py)",
    }
    if seconds is None:
        out["note"] = f"data.source {d.source}: size unknown before fetching; pass --corpus-hours"
        return out
    hours = seconds / 3600.0
    k = encodec.codebooks(float(cfg.tokenizer.bandwidth))
    download = known.download_gib * GIB / GB if known else 0.0
    # FMA's zips: prepare reads the members in place (nothing extracted); data.remove_archive removes the archive
    # once prepared, before tokenize writes the codes
    plan = disk_plan(
        seconds, download, d.sample_rate, d.sample_format, k, encodec.FRAME_RATE,
        in_place=reads_in_place(d), remove_archive=d.remove_archive,
    )  # fmt: skip
    prepared, codes = plan.prepared_gb, plan.codes_gb
    prepare_ch = hours * PREPARE_CORE_HOURS_PER_AUDIO_HOUR
    tokenize_ch = hours * TOKENIZE_CORE_HOURS_PER_AUDIO_HOUR
    free, where = free_gb(data_dir)
    peak = plan.peak_gb  # the archive (and its members, where extracted), prepared audio, codes; sources.DiskPlan
    from acoustic_mlm.preflight.flops import encodec_flops_per_second  # builds EnCodec's architecture: only here

    tok_flops = encodec_flops_per_second(float(cfg.tokenizer.bandwidth))
    out.update(
        download_gb=download,
        extracted_gb=plan.extracted_gb,  # 0 where prepare reads the zip in place (FMA's)
        prepared_gb=prepared,
        codes_gb=codes,
        archive_removed=plan.archive_removed,
        disk_gb=peak,
        peak_disk_gb=peak,
        final_disk_gb=plan.final_gb,
        disk_parts=plan.parts(d.sample_format),
        free_gb=free,
        free_where=where,
        disk_fits=peak <= free,
        tokenize_gflops_per_audio_second=tok_flops / 1e9,
        tokenize_gpu=TOKENIZE_GPU[0],
        tokenize_gpu_utilisation=TOKENIZE_GPU_UTILISATION,
        tokenize_gpu_hours=seconds * tok_flops / (TOKENIZE_GPU[1] * 1e12 * TOKENIZE_GPU_UTILISATION) / 3600.0,
        prepare_core_hours=prepare_ch,
        tokenize_core_hours=tokenize_ch,
        prepare_hours=prepare_ch / cores,
        tokenize_hours=tokenize_ch / cores,
        epochs=epochs(cfg, seconds),
        mert_epochs=epochs(cfg, MERT_330M_HOURS * 3600.0 / (1.0 - cfg.data.valid_fraction)),
    )
    return out


def _n(x: float) -> str:
    """A number for the page: whole thousands with separators, small ones to 3 significant digits."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _archive_part(r: dict) -> str:
    """The archive's share of the disk, then ' + ': its members extracted beside it, or read in place, kept or
    removed; nothing without an archive."""
    if not r["download_gb"]:
        return ""
    if r["extracted_gb"]:
        return f"archive {_n(r['download_gb'])} + extracted {_n(r['extracted_gb'])} + "
    kept = "removed once prepared (data.remove_archive)" if r["archive_removed"] else "kept"
    return f"archive {_n(r['download_gb'])}, read in place and {kept}, + "


def lines(r: dict) -> list[str]:
    """preflight.md's paragraph on the data."""
    if r.get("note"):
        return [f"**Data** ({r['source']}): {r['note']}."]
    return [
        f"**Data** ({r['source']}, {r['corpus_hours']:,.0f} h of audio; {r['corpus_source'] or 'generated'}): "
        f"download {_n(r['download_gb'])} GB, disk {_n(r['peak_disk_gb'])} GB at the peak and "
        f"{_n(r['final_disk_gb'])} GB when done ({_archive_part(r)}prepared audio {_n(r['prepared_gb'])} "
        f"({r['sample_format']}, 24 kHz) + codes {_n(r['codes_gb'])}); free where the data goes "
        f"({r['free_where']}): {_n(r['free_gb'])} GB"
        f"{'' if r['disk_fits'] else ' (**the peak does not fit**)'}; prepare {_n(r['prepare_core_hours'])} CPU "
        f"core-hours ({_n(r['prepare_hours'])} h on {r['cores']} cores), tokenize ({r['tokenizer']}) "
        f"{_n(r['tokenize_core_hours'])} CPU core-hours ({_n(r['tokenize_hours'])} h on {r['cores']} cores; on one "
        f"{r['tokenize_gpu']}: {_n(r['tokenize_gpu_hours'])} h, projected from EnCodec's counted "
        f"{r['tokenize_gflops_per_audio_second']:.2f} GFLOP per audio second at an assumed "
        f"{100 * r['tokenize_gpu_utilisation']:.0f} % of the fp32 peak, a lower bound, not measured); the "
        f"preset's updates are **{_n(r['epochs'])} epochs** of its train split "
        f"(of MERT-330M's 160K h: {_n(r['mert_epochs'])}). Speeds: {r['throughput_source']}.",
    ]
