"""The fetch tests' data: tones in audio formats, a small corpus of them to pack in archives, the
config of a url source, and the files a folder holds."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import soundfile as sf


SR = 24000


def tone_bytes(fmt: str, seconds: float = 1.0, hz: float = 440.0, sr: int = SR, channels: int = 1) -> bytes:
    t = np.arange(int(seconds * sr)) / sr
    x = (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    x = np.stack([x] * channels, axis=1)
    buf = io.BytesIO()
    sf.write(buf, x, sr, format=fmt.upper())
    return buf.getvalue()


def corpus() -> dict[str, bytes]:
    """A few audio files in folders, and a text file that is not audio."""
    return {
        "corpus/a/one.wav": tone_bytes("wav", hz=330),
        "corpus/a/two.flac": tone_bytes("flac", hz=440, sr=16000, channels=2),
        "corpus/b/three.wav": tone_bytes("wav", hz=550, sr=44100),
        "corpus/README.txt": b"not audio\n",
    }


def url_cfg(url: str, known_hash: str) -> dict:
    return {"data": {"source": "url", "url": url, "known_hash": known_hash, "folder": None, "sample_rate": SR}}


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
