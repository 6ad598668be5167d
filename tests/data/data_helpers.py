"""The data tests' data: tones in audio formats, a small corpus of them to pack in archives, the
config of a url source, and the files a folder holds; the smoke preset with other data settings
(`preset`), the config of a small synthetic corpus (`make_cfg`), a sine, and a folder of good files
of many shapes next to bad files of every kind (`make_messy_folder`)."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile as sf
from helpers import make_config

from acoustic_mlm import config as C

SR = 24000
SMOKE = Path(__file__).resolve().parents[2] / "config" / "smoke.yaml"


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


def preset(**data_keys) -> dict:
    """The smoke preset's mapping (`C.read_yaml`, to edit as a user edits the file; `make_config` types
    it for the stages' entry functions) with these `data:` keys, in tokenizer mode pretrained: the data tests' corpora
    are too small to calibrate a tokenizer on, which prepare would refuse in calibrated mode."""
    cfg = C.read_yaml(SMOKE)
    cfg["data"].update(data_keys)
    cfg["tokenizer"]["mode"] = "pretrained"
    return cfg


def data_section(**keys) -> C.DataConfig:
    """The smoke preset's typed `data:` section with these values (not validated: for the functions
    that take the section and check it themselves)."""
    return replace(C.load(SMOKE).data, **keys)


def url_cfg(url: str, known_hash: str) -> C.Config:
    """The smoke preset (as `preset` gives it) with a url source, validated and typed."""
    return make_config(preset(source="url", url=url, known_hash=known_hash, folder=None, sample_rate=SR))


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def make_cfg(
    n_clips: int = 4,
    clip_seconds: float = 1.1,
    valid_fraction: float = 0.25,
    split_seed: int = 0,
    crop_seconds: float = 0.1,
    shard_files: int = 3,
) -> dict:
    cfg = preset(
        source="synthetic",
        sample_rate=SR,
        valid_fraction=valid_fraction,
        split_seed=split_seed,
        shard_files=shard_files,
        synthetic={"n_clips": n_clips, "clip_seconds": clip_seconds, "sample_rate": 32000, "seed": 0},
    )
    cfg["train"]["crop_seconds"] = crop_seconds  # clips shorter than one crop are rejected
    cfg["model"]["mask_length"] = 2  # a crop holds two spans (the config's rule): 0.1 s is 7 frames
    return cfg


def sine(hz: float, seconds: float, sr: int, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * hz * np.arange(int(seconds * sr)) / sr)).astype(np.float32)


def _write(path, x: np.ndarray, sr: int, **kw) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, x, sr, **kw)
    return path.read_bytes()


def _scramble(data: bytes, start: float, stop: float) -> bytes:
    b = bytearray(data)
    for i in range(int(len(b) * start), int(len(b) * stop)):
        b[i] = (b[i] * 7 + 13) % 256
    return bytes(b)


def make_messy_folder(folder) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Good files of many shapes next to bad files of every kind.

    Returns ({good path: (orig rate, orig channels)}, {bad path: expected reason kind}).
    """
    one = sine(440.0, 1.0, SR)
    good = {
        "good/mono_24k.wav": (SR, 1),
        "good/stereo_48k.flac": (48000, 2),
        "good/six_channels_8k.wav": (8000, 6),
        "good/vorbis_22k.ogg": (22050, 1),
        "good/lame_44k.mp3": (44100, 1),
        "good/float_96k.wav": (96000, 1),
        "good/odd_rate_44101.wav": (44101, 1),  # resampled as 44100 Hz: exact would take minutes
    }
    _write(folder / "good/mono_24k.wav", one, SR)
    _write(folder / "good/stereo_48k.flac", np.stack([sine(440, 1.0, 48000), sine(660, 1.0, 48000)], 1), 48000)
    _write(folder / "good/six_channels_8k.wav", np.stack([sine(200 + 50 * c, 1.0, 8000) for c in range(6)], 1), 8000)
    _write(folder / "good/vorbis_22k.ogg", sine(440, 1.0, 22050), 22050, format="OGG", subtype="VORBIS")
    mp3 = _write(folder / "good/lame_44k.mp3", sine(440, 1.0, 44100), 44100, format="MP3")
    _write(folder / "good/float_96k.wav", sine(440, 1.0, 96000), 96000, subtype="FLOAT")
    _write(folder / "good/odd_rate_44101.wav", sine(440, 1.0, 44101), 44101)

    bad_dir = folder / "bad"
    bad_dir.mkdir()
    flac = _write(bad_dir / "corrupt.flac", sine(440, 1.0, SR), SR)
    (bad_dir / "corrupt.flac").write_bytes(_scramble(flac, 0.3, 0.5))
    (bad_dir / "truncated.flac").write_bytes(flac[: len(flac) // 2])
    (bad_dir / "truncated.mp3").write_bytes(mp3[: len(mp3) // 2])
    (bad_dir / "corrupt.mp3").write_bytes(_scramble(mp3, 0.2, 0.6))
    (bad_dir / "empty.wav").write_bytes(b"")
    (bad_dir / "notes.wav").write_text("these are lecture notes, not audio\n" * 20)
    (bad_dir / "cover.mp3").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF" + bytes(range(256)) * 4)  # a JPEG
    (bad_dir / "html.ogg").write_text("<html><body>404 Not Found</body></html>")
    x = one.copy()
    x[100] = np.nan
    _write(bad_dir / "nan.wav", x, SR, subtype="FLOAT")
    x = one.copy()
    x[200] = np.inf
    _write(bad_dir / "inf.wav", x, SR, subtype="FLOAT")
    _write(bad_dir / "silence.flac", np.zeros(SR, np.float32), SR)
    _write(bad_dir / "cancelling_stereo.wav", np.stack([one, -one], 1), SR)  # mono mix is silent
    _write(bad_dir / "short.wav", sine(440, 0.3, SR), SR)  # shorter than one 0.5 s crop
    bad = {
        "bad/corrupt.flac": "not decodable",  # libsndfile: "flac decoder lost sync"
        "bad/truncated.flac": "not decodable",
        "bad/truncated.mp3": "truncated or corrupt",  # mpg123 decodes what is there: fewer frames than declared
        "bad/corrupt.mp3": ("truncated or corrupt", "not decodable"),  # depends on where mpg123 resyncs
        "bad/empty.wav": "empty file",
        "bad/notes.wav": "not decodable",
        "bad/cover.mp3": "not decodable",
        "bad/html.ogg": "not decodable",
        "bad/nan.wav": "non-finite samples",
        "bad/inf.wav": "non-finite samples",
        "bad/silence.flac": "digital silence",
        "bad/cancelling_stereo.wav": "digital silence",
        "bad/short.wav": "shorter than one training crop",
    }
    return good, bad


def one_note_score(
    seconds: float = 1.0,
    pitch: float = 69.0,
    onset: float = 0.1,
    gate: float = 0.3,
    stereo: bool = False,
    pan: float = 0.5,
    drums: list | None = None,
    reverb_wet: float = 0.0,
):
    """A score of one sine-like note (a single harmonic, no detune or vibrato) and the given drums."""
    from acoustic_mlm.data.synth_score import Score, Timbre, Track

    timbre = Timbre(
        harmonics=np.array([1.0]),
        phases=np.zeros(1),
        darken=1.0,
        bright_tau=0.1,
        attack=0.01,
        decay=0.1,
        sustain=0.7,
        release=0.05,
        detune_cents=0.0,
        vibrato_hz=0.0,
        vibrato_cents=0.0,
    )
    note = Track(
        name="lead",
        onset=np.array([onset]),
        gate=np.array([gate]),
        pitch=np.array([pitch]),
        velocity=np.array([0.8]),
        timbre=timbre,
        gain=1.0,
        pan=pan,
    )
    return Score(
        seconds=seconds,
        tempo=120.0,
        beats_per_bar=4,
        key=0,
        mode="major",
        scale="major",
        progression=(0,),
        bars_per_chord=1,
        swing=0.0,
        stereo=stereo,
        reverb_seconds=0.3,
        reverb_wet=reverb_wet,
        level=0.5,
        tracks=[note],
        drums=drums or [],
    )
