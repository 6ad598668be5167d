"""A small archive in the Free Music Archive's layout for config/gpu-rehearsal.yaml: procedural music
(acoustic_mlm.data.synth) encoded as MP3 by soundfile (libsndfile >= 1.1 with LAME), stored as FMA's zips
store their tracks (github.com/mdeff/fma: `fma_large/<3-digit folder>/<6-digit track id>.mp3`, the folder
being the id's first three digits), with FMA's `README.txt` and `checksums` (sha1 of each track, as
`sha1sum` prints it from inside the archive's root folder) beside them.

    python tests/fma_rehearsal.py OUT_DIR    # writes OUT_DIR/fma_rehearsal.zip and prints its sha256
"""

from __future__ import annotations

import hashlib
import io
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

from acoustic_mlm.data import synth

ROOT_FOLDER = "fma_large"  # the archive stands in for fma_large, gpu-small's corpus
# track id -> (sample rate, channels): FMA's MP3s are mostly 44.1 kHz stereo, some 48 kHz or mono
TRACKS = {
    "000002": (44100, 2),
    "000005": (44100, 2),
    "000010": (48000, 2),
    "000140": (44100, 1),
    "001039": (44100, 2),
    "010250": (32000, 2),
    "024424": (44100, 2),
    "098566": (48000, 1),
    "108924": (44100, 2),
    "133296": (44100, 2),
}
SECONDS = 4.0  # FMA's clips are 30 s; four keep tokenization and training to seconds on a CPU
SEED = 0


def member(track: str) -> str:
    return f"{ROOT_FOLDER}/{track[:3]}/{track}.mp3"


def track_mp3(index: int, sample_rate: int, channels: int) -> bytes:
    """One track: procedural music at `sample_rate`, `channels` channels, as MP3 (LAME via libsndfile)."""
    mono = synth.generate_clip(synth.clip_rng(SEED, index), SECONDS, sample_rate).mean(axis=1)
    x = np.repeat(mono[:, None], channels, axis=1) * np.linspace(1.0, 0.7, channels, dtype=np.float32)
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), sample_rate, format="MP3")
    return buf.getvalue()


def tracks() -> dict[str, bytes]:
    """Archive member -> MP3 bytes, in FMA's naming."""
    return {member(t): track_mp3(i, sr, ch) for i, (t, (sr, ch)) in enumerate(TRACKS.items())}


def checksums(members: dict[str, bytes]) -> bytes:
    """FMA's `checksums` file: `<sha1>  <path from the root folder>` per track, as sha1sum prints it."""
    prefix = ROOT_FOLDER + "/"
    lines = [f"{hashlib.sha1(data).hexdigest()}  {name.removeprefix(prefix)}\n" for name, data in members.items()]
    return "".join(lines).encode()


def archive() -> bytes:
    """The zip: the tracks, then README.txt and checksums, as FMA's archives hold them."""
    from helpers import make_zip

    members = tracks()
    readme = b"A stand-in for the Free Music Archive (github.com/mdeff/fma): procedural music in its layout.\n"
    return make_zip({**members, f"{ROOT_FOLDER}/README.txt": readme, f"{ROOT_FOLDER}/checksums": checksums(members)})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))  # helpers.make_zip
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    blob = archive()
    (out / "fma_rehearsal.zip").write_bytes(blob)
    print(f"sha256:{hashlib.sha256(blob).hexdigest()}")
