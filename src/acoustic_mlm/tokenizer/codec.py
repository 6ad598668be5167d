"""EnCodec 24 kHz as the tokenizer uses it: built untrained under a seed, or loaded with the official
or the calibrated weights, at a bandwidth.

Two modes of EnCodec, one per `tokenizer.mode` (the third, `pitch`, is the tone corpus's oracle,
tokenizer.pitch, no EnCodec):

- `pretrained`: the official EnCodec weights (`encodec_24khz-d7cc33bc.th`, Defossez et al. 2022,
  arXiv 2210.13438), as MERT used them. They cannot be downloaded on offline machines; when they
  can, the fetch stage's downloader brings them (retries, resumes a broken transfer, renames into
  place when complete) and the file's sha256 must start with the prefix its name carries.
- `calibrated` (offline default): an untrained EnCodec built under a fixed seed (`build_encodec`)
  whose residual vector quantizer `calibration.calibrate` fits; `load_calibrated` rebuilds it from
  the `tokenizer.pt` the stage saves. Why not EnCodec as it comes: an untrained model's codebooks
  are all zero until a training-mode forward runs its k-means init, so it emits **all-zero codes**;
  and that k-means builds an (n, 1024, 128) tensor per iteration, far too slow on CPU.
"""

from __future__ import annotations

import re
import socket
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import torch

from acoustic_mlm.errors import UserError
from acoustic_mlm.utils import file_sha256, log

OFFICIAL_URL = "https://dl.fbaipublicfiles.com/encodec/v0/encodec_24khz-d7cc33bc.th"
OFFICIAL_SHA256_PREFIX = "d7cc33bc"  # EnCodec names its checkpoints <name>-<sha256 prefix>.th


class TokenizerError(UserError, ValueError):
    """An input or checkpoint problem; the message is one line naming the file."""


def _bare_encodec():
    from encodec import EncodecModel

    with warnings.catch_warnings():  # encodec uses the deprecated torch.nn.utils.weight_norm
        warnings.simplefilter("ignore", FutureWarning)
        return EncodecModel.encodec_model_24khz(pretrained=False)


def build_encodec(bandwidth: float = 6.0, seed: int = 0):
    """An untrained EnCodec 24 kHz model, identical for a seed, in eval mode at `bandwidth` kbps.

    Its codebooks are still zero (all-zero codes) until `calibration.calibrate` fits them.
    """
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG untouched
        torch.manual_seed(seed)
        model = _bare_encodec()
    model.set_target_bandwidth(float(bandwidth))
    return model.eval()


def n_codebooks(model) -> int:
    """RVQ levels in use at the model's bandwidth (6 kbps: 8); the pitch tokenizer (tokenizer.pitch) states its own."""
    own = getattr(model, "n_codebooks", None)
    if own is not None:
        return int(own)
    return model.quantizer.get_num_quantizers_for_bandwidth(model.frame_rate, model.bandwidth)


def _name_prefix(name: str) -> str | None:
    """The sha256 prefix an EnCodec-style file name carries (`encodec_24khz-d7cc33bc.th`), if any."""
    m = re.fullmatch(r".+-([0-9a-f]{8,64})", Path(name).stem)
    return m.group(1) if m else None


def _verify(path: Path, prefix: str, where: str | Path | None = None) -> str:
    """The file's sha256, which must start with `prefix`; the error names `where` (default: the file)."""
    digest = file_sha256(path)
    if not digest.startswith(prefix.lower()):
        raise TokenizerError(
            f"{where or path}: sha256 mismatch: expected a digest starting with {prefix}, got {digest}"
        )
    return digest


def _place_it(url: str, dest: Path, prefix: str) -> str:
    """How to put the checkpoint in place by hand: the end of every error about a missing one."""
    return (
        f"download {url} where there is network and copy it to {dest}, or set tokenizer.checkpoint to its path "
        f"(its sha256 starts with {prefix})"
    )


def _resolves(host: str) -> bool:
    """Whether `host` resolves: offline machines and compute nodes fail here at once, before any retry."""
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def _download(url: str, dest: Path, prefix: str) -> None:
    """Fetch `url` to `dest` with the fetch stage's downloader, then check its sha256 prefix; a file
    that fails the check is deleted. A host that does not resolve is one line naming the file, the URL
    and how to place the file, with no retries."""
    from acoustic_mlm.data.download import DownloadError, download
    from acoustic_mlm.data.sources import ArchiveSource

    host = urlsplit(url).hostname or ""
    if urlsplit(url).scheme in ("http", "https") and not _resolves(host):
        raise TokenizerError(
            f"{dest.name}: not here and {host} does not resolve (no network?); {_place_it(url, dest, prefix)}"
        )
    log.info("downloading %s -> %s", url, dest)
    # EnCodec publishes only a prefix of each checkpoint's sha256, which pooch cannot check: no
    # known hash for the download, the prefix checked here.
    src = ArchiveSource(name="tokenizer.checkpoint", url=url, known_hash=None, filename=dest.name)
    try:
        path = download(src, dest.parent)
    except DownloadError as exc:  # network, HTTP status: after the downloader's retries
        why = str(exc).splitlines()[0][-200:]  # the downloader's reason, its tail: one line of bounded length
        raise TokenizerError(f"{dest.name}: download failed ({why}); {_place_it(url, dest, prefix)}") from None
    try:
        _verify(path, prefix, where=url)
    except TokenizerError:
        path.unlink()
        raise


def _load_state(model, path: Path):
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as exc:  # unpickling and key/shape errors are multi-line: keep one
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerError(f"{path}: not an EnCodec 24 kHz state_dict ({first})") from None
    return model


def hub_checkpoint_path(url: str = OFFICIAL_URL) -> Path:
    """Where a downloaded checkpoint lives: torch.hub.get_dir()/checkpoints/<file name>."""
    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def fetch_checkpoint(
    checkpoint: str | Path | None = None, *, expected_prefix: str = OFFICIAL_SHA256_PREFIX, url: str = OFFICIAL_URL
) -> Path:
    """The checkpoint file, checked: `checkpoint` (a local path), or with None `url` in
    torch.hub.get_dir()/checkpoints, downloaded there once. Its sha256 must start with the prefix its name
    carries (`<name>-<prefix>.th`), or `expected_prefix` when the name carries none. The Snakemake rule
    `encodec_checkpoint` runs this on the submit host (a local rule), so compute nodes need no network."""
    if checkpoint is None:
        path = hub_checkpoint_path(url)
        prefix = _name_prefix(path.name) or expected_prefix
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            _download(url, path, prefix)
    else:
        path = Path(checkpoint).expanduser()
        prefix = _name_prefix(path.name) or expected_prefix
        if not path.is_file():
            raise TokenizerError(
                f"{path}: EnCodec checkpoint not found (tokenizer.checkpoint; expected a file whose sha256 "
                f"starts with {prefix}, as the official {url.rsplit('/', 1)[-1]} from {url})"
            )
    _verify(path, prefix)
    return path


def load_pretrained(
    checkpoint: str | Path | None = None,
    bandwidth: float = 6.0,
    *,
    expected_prefix: str = OFFICIAL_SHA256_PREFIX,
    url: str = OFFICIAL_URL,
):
    """EnCodec 24 kHz with the official weights (`fetch_checkpoint`), in eval mode at `bandwidth` kbps."""
    path = fetch_checkpoint(checkpoint, expected_prefix=expected_prefix, url=url)
    model = _load_state(_bare_encodec(), path)
    model.set_target_bandwidth(float(bandwidth))
    return model.eval()


def load_calibrated(path: str | Path, bandwidth: float = 6.0):
    """The exact calibrated tokenizer from a `tokenizer.pt` written by the stage's fit."""
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"{path}: calibrated tokenizer not found")
    model = _load_state(_bare_encodec(), path)
    model.set_target_bandwidth(float(bandwidth))
    return model.eval()
