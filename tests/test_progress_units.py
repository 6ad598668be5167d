"""The download's progress in bytes with SI prefixes (tqdm's unit_scale), on a terminal and in log lines."""

import io
import re

from acoustic_mlm import utils


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bytes_are_shown_with_si_prefixes_in_log_lines():
    out = io.StringIO()
    with utils.Progress(12_345_678, "download x", unit="B", every_s=0, stream=out, unit_scale=True) as bar:
        bar.update(5_000_000)
    line = out.getvalue().splitlines()[0]
    assert line.startswith("download x: 5.00MB/12.3MB (41%) ") and re.search(r" [\d.]+[kMGT]?B/s ", line), line
    plain = io.StringIO()
    with utils.Progress(10, "train", unit="step", every_s=0, stream=plain) as bar:
        bar.update(3)
    assert plain.getvalue().startswith("train: 3/10 (30%) ")  # counts of steps stay plain numbers


def test_the_terminal_bar_scales_bytes():
    term = _Terminal()
    with utils.Progress(12_345_678, "download x", unit="B", stream=term, unit_scale=True) as bar:
        bar.update(5_000_000)
    shown = term.getvalue()
    assert "5.00M/12.3M" in shown and "5000000/12345678" not in shown, shown


def test_the_download_bar_asks_for_scaled_bytes(root):
    source = (root / "src" / "acoustic_mlm" / "data" / "download.py").read_text()
    assert re.search(r'Progress\([^\n]*unit="B", unit_scale=True\)', source)


def test_quiet_shows_no_progress_and_logs_warnings_only(monkeypatch):
    import logging

    monkeypatch.setattr(utils.Progress, "quiet", False)
    root_logger = logging.getLogger()
    monkeypatch.setattr(root_logger, "handlers", [])
    monkeypatch.setattr(root_logger, "level", root_logger.level)
    utils.setup_logging(quiet=True)
    assert utils.Progress.quiet and root_logger.level == logging.WARNING
    out, term = io.StringIO(), _Terminal()
    for stream in (out, term):
        with utils.Progress(10, "train", unit="step", every_s=0, stream=stream) as bar:
            bar.update(10, loss=1.0)
        assert stream.getvalue() == "" and bar.n == 10  # counted, not shown
    utils.setup_logging(verbose=True)
    assert not utils.Progress.quiet


def test_amlm_quiet_prints_nothing_but_its_outputs(tmp_path, root):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "acoustic_mlm", "fetch", "--config", str(root / "config" / "smoke.yaml")]
    cmd += ["--out", str(tmp_path / "raw"), "--downloads", str(tmp_path / "dl")]
    proc = subprocess.run([*cmd, "-q"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == "", proc.stderr
    assert len(list((tmp_path / "raw").rglob("*.flac"))) == 12
    both = subprocess.run([*cmd, "-q", "-v"], capture_output=True, text=True, timeout=300)
    assert both.returncode == 2
    assert both.stderr == "amlm fetch: error: -q/--quiet and -v/--verbose together; choose one\n"
