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
