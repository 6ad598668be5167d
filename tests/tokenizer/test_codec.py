"""EnCodec as the tokenizer builds and loads it: seeded untrained models, and the official weights
checked by sha256 and downloaded into torch hub's cache."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizer_helpers import saved_checkpoint, synth_clip

from acoustic_mlm.tokenizer import codec
from acoustic_mlm.tokenizer.codec import TokenizerError
from acoustic_mlm.utils import file_sha256


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


def test_an_unresolvable_host_is_one_line_naming_the_file_url_and_remedy_without_retries(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    lookups = []

    def offline(host, *args, **kwargs):
        lookups.append(host)
        raise codec.socket.gaierror(-3, "Temporary failure in name resolution")

    monkeypatch.setattr(codec.socket, "getaddrinfo", offline)
    from acoustic_mlm.data import download as D

    monkeypatch.setattr(D, "download", lambda *a, **k: pytest.fail("no download is tried offline"))
    with pytest.raises(TokenizerError) as err:
        codec.load_pretrained(None, 6.0)
    msg = str(err.value)
    dest = codec.hub_checkpoint_path()
    assert lookups == ["dl.fbaipublicfiles.com"]  # one name lookup, no retries
    assert "\n" not in msg and len(msg) - len(str(dest)) < 300, msg  # one line: the file, the URL, the remedy
    assert msg.startswith("encodec_24khz-d7cc33bc.th: not here and dl.fbaipublicfiles.com does not resolve")
    assert codec.OFFICIAL_URL in msg and f"copy it to {dest}" in msg and "tokenizer.checkpoint" in msg
    assert not dest.exists()


def test_fetch_checkpoint_returns_the_checked_local_file(tmp_path):
    good = saved_checkpoint(codec.build_encodec(6.0, 4).state_dict(), tmp_path)
    assert codec.fetch_checkpoint(good) == good
    with pytest.raises(TokenizerError, match="EnCodec checkpoint not found"):
        codec.fetch_checkpoint(tmp_path / "encodec_24khz-d7cc33bc.th")
