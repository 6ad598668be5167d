"""Fetch stage: put raw audio files into one folder (`data/raw` by default).

One function per `data.source`; each fills a temporary folder and returns what it made, which
lands in `SOURCE.json` next to the audio. The folder appears at `out_dir` only when complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import soundfile as sf

from acoustic_mlm import __version__, synth
from acoustic_mlm.utils import atomic_dir, log, write_json


def _fetch_synthetic(cfg: dict, out_dir: Path) -> dict:
    """Procedural music (acoustic_mlm.synth): offline, identical for a seed."""
    p = cfg["data"]["synthetic"]
    log.info("fetch: generating %d synthetic clips of %.1f s at %d Hz (seed %d)",
             p["n_clips"], p["clip_seconds"], p["sample_rate"], p["seed"])
    paths = synth.generate_corpus(out_dir, p["n_clips"], p["clip_seconds"], p["sample_rate"], p["seed"])
    return {
        "params": {k: p[k] for k in ("n_clips", "clip_seconds", "sample_rate", "seed")},
        "format": "FLAC PCM_16",
        "generator": f"acoustic_mlm.synth {__version__}",
        "files": len(paths),
        "total_seconds": round(sum(sf.info(str(q)).duration for q in paths), 3),
    }


# data.source -> function(cfg, tmp_dir) -> description; later sources (url, folder, fma,
# librispeech) are one more entry here and one more enum value in config.schema.json.
SOURCES: dict[str, Callable[[dict, Path], dict]] = {
    "synthetic": _fetch_synthetic,
}


def run(cfg: dict, out_dir: Path) -> None:
    """Fill `out_dir` with the raw audio of `data.source`, plus `SOURCE.json` describing it."""
    source = cfg["data"]["source"]
    if source not in SOURCES:
        raise ValueError(f"data.source: unknown source '{source}' (known: {', '.join(SOURCES)})")
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        info = SOURCES[source](cfg, tmp)
        write_json(tmp / "SOURCE.json", {"source": source, **info})
    log.info("fetch: %s: %d files, %.1f s of audio in %s", source, info["files"], info["total_seconds"], out_dir)
