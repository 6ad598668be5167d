"""preflight/log_summary.py: the numbers of preflight's log lines, formatted."""

from acoustic_mlm.preflight import log_summary as summary


def test_hours_never_print_zero_hours():
    assert summary.hours(0.0254) == "1.5 min"  # proxy-gpu's map, which printed "0.0 h" before
    assert summary.hours(5 / 3600) == "5 s"
    assert summary.hours(46.8) == "46.8 h" and summary.hours(1234.5) == "1,234.5 h"


def test_gpu_hours_three_digits_below_100_and_whole_above():
    assert summary.number(0.0254) == "0.0254"
    assert summary.number(6.364) == "6.36"
    assert summary.number(2994.4) == "2,994"


def test_share_says_where_the_utilisation_comes_from():
    measured = {"utilisation": 0.124, "utilisation_source": "measured on one H200"}
    assert summary.share(measured) == "12.4 % of its peak (measured on one H200)"
    assert summary.share({"utilisation": 0.35}) == "an assumed 35 % of its peak"
    beside = {
        "utilisation": 0.35,
        "measured_mfu": "measured: gpu-small 5.1 %",
        "lowest_measured": 0.05,
        "gpu_hours_at_lowest_measured": 6.364,
    }
    assert summary.share(beside) == "an assumed 35 % of its peak (measured: gpu-small 5.1 %; at 5 %: 6.36 GPU-hours)"
