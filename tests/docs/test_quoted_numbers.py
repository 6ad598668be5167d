"""The numbers the README quotes equal their sources: BENCHMARKS.md's tables, the presets, the
decisive experiments' tables in data/reference/decisive/. One entry of QUOTES per number (or range);
a new check is one more entry. A quote matches when its source value, rounded half up to the quote's
own decimals, is the quoted value."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from functools import cache
from pathlib import Path

import pytest
import test_holm_restatement as restated  # tests/docs (pytest puts a test's folder on the path): its statistics

ROOT = Path(__file__).resolve().parents[2]


@cache
def _text(rel: str) -> str:
    return (ROOT / rel).read_text()


def _row(rel: str, *cells: str) -> list[str]:
    """The cells of the one table row of `rel` that holds every one of `cells` (exact cell text)."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in _text(rel).splitlines()
        if line.startswith("|") and all(f"| {c} |" in line for c in cells)
    ]
    assert len(rows) == 1, f"{rel}: {len(rows)} table rows hold {cells}"
    return rows[0]


def _minutes(cell: str) -> float:
    m = re.fullmatch(r"(\d+) min(?: (\d+) s)?", cell)
    assert m, cell
    return int(m.group(1)) + int(m.group(2) or 0) / 60


DEFAULT_TIER = "the default test tier: unit tests and one smoke pipeline"  # BENCHMARKS.md's rows of the tiers
FULL_SUITE = "the full suite, as CI runs it: both tiers on two pytest-xdist workers"


def _tier(cells: str) -> tuple[float, float]:
    """A test tier's count and minutes, from its BENCHMARKS.md row (its last cell: "1,619 tests (...), 5 min 47 s")."""
    result = _row("BENCHMARKS.md", cells)[-1]
    return _number(result.split(" tests")[0]), _minutes(result.split(", ")[-1])


def _number(cell: str) -> float:
    return float(re.search(r"-?[\d,]+(?:\.\d+)?", cell).group().replace(",", ""))


def _bench_column(header: str, *cells: str) -> str:
    """The cell under `header` in BENCHMARKS.md's row holding `cells`."""
    row = _row("BENCHMARKS.md", *cells)
    lines = _text("BENCHMARKS.md").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("|") and all(f"| {c} |" in line for c in cells))
    head = next(lines[i] for i in range(at, -1, -1) if lines[i].startswith("|") and lines[i + 1].startswith("| ---"))
    columns = [c.strip() for c in head.strip().strip("|").split("|")]
    return row[columns.index(header)]


@cache
def _decisive() -> dict:
    return json.loads(_text("data/reference/decisive/decisive.json"))


def _decisive_row(promise: str, cell: str, steps: int) -> dict:
    (p,) = [p for p in _decisive()["promises"] if p["id"] == promise]
    (row,) = [r for r in p["rows"] if r["cell"] == cell and r["steps"] == steps]
    return row


def _sweep_runs(preset: str) -> list[int]:
    from acoustic_mlm import config as C

    cfg = C.load(ROOT / preset)
    return [len(next(iter(cfg.point(p).runs.values())).seeds) for p in cfg.points]


@dataclass(frozen=True)
class Quote:
    what: str
    readme: str  # a regex on README.md; its groups are the quoted numbers
    source: Callable[[], tuple[float, ...]]  # the values those numbers quote, in the groups' order


DEEPNORM = ("deepnorm", "16 layers, lr 0.01, fp32")
CLIPPING = ("clipping", "16 layers, lr 0.01, fp32")
QUOTES = [
    Quote(
        "the default pipeline's wall time",
        r"results/figures/ \((\d+) min on 2 cores",
        lambda: (_minutes(_row("BENCHMARKS.md", "default", "`/usr/bin/time -v snakemake --cores all`")[-2]),),
    ),
    Quote(
        "the default pipeline's peak memory",
        r"on 2 cores, ([\d.]+) GB RAM",
        lambda: (_number(_row("BENCHMARKS.md", "default", "`/usr/bin/time -v snakemake --cores all`")[-1]),),
    ),
    Quote(
        "the default pipeline's data on disk",
        r"GB RAM, (\d+) MB of data\)",
        lambda: (_number(_bench_column("data", "default (`config/config.yaml`)", "`du -sh data results .snakemake`")),),
    ),
    Quote(
        "the default test tier's time",
        r"pytest\s+# the tests' default tier, after the install \((\d+) min on 2 cores\)",
        lambda: _tier(DEFAULT_TIER)[1:],
    ),
    Quote(
        "the default test tier's count and time",
        r"shipped reference run \(([\d,]+) tests, (\d+) min on 2 cores\)",
        lambda: _tier(DEFAULT_TIER),
    ),
    Quote(
        "the full suite's count and time",
        r"the full suite, as CI runs it \(([\d,]+) tests, (\d+) min on 2 cores[;)]",
        lambda: _tier(FULL_SUITE),
    ),
    Quote(
        "torch's CUDA install",
        r"CUDA build \(([\d.]+) GB installed\)",
        lambda: (
            _number(_row("BENCHMARKS.md", "`du -sch torch nvidia* triton`, in the environment's `site-packages`")[-1]),
        ),
    ),
    Quote(
        "gpu-small's MFU on the H200",
        r"gpu-small at (\d+) % MFU",
        lambda: tuple(
            float(v) for v in re.search(r"gpu-small at ([\d.]+)-([\d.]+) % MFU", _text("BENCHMARKS.md")).groups()
        ),
    ),
    Quote(
        "gpu-small's GPU-hours for one arm",
        r"(\d+)-(\d+) GPU-hours for 100K updates of one arm",
        lambda: (
            _number(_row("BENCHMARKS.md", "`fp16_fairseq` (the preset's)")[2]),
            _number(_row("BENCHMARKS.md", "`bf16`")[2]),
        ),
    ),
    Quote(
        "paper's MFU on the H200",
        r"and paper at\s+(\d+) %",
        lambda: (_number(re.search(r"paper at ([\d.]+) %", _text("BENCHMARKS.md")).group(1)),),
    ),
    Quote(
        "the decisive preset's seeds (presets table)",
        r"`config/decisive.yaml` \| the decisive experiments(?: on synthetic music)?: "
        r"the map.s edge cells with (\d+)-(\d+) seeds",
        lambda: (min(_sweep_runs("config/decisive.yaml")), max(_sweep_runs("config/decisive.yaml"))),
    ),
    Quote(
        "the decisive preset's seeds and runs (its section)",
        r"on its edge cells with (\d+)-(\d+) seeds \((\d+) runs",
        lambda: (
            min(_sweep_runs("config/decisive.yaml")),
            max(_sweep_runs("config/decisive.yaml")),
            sum(_sweep_runs("config/decisive.yaml")),
        ),
    ),
    Quote(
        "the decisive runs recorded",
        r"\((\d+) runs, pinned kernels; tables in `data/reference/decisive/`\)",
        lambda: (len(list(csv.DictReader(open(ROOT / "data/reference/decisive/runs.csv")))),),
    ),
    Quote(
        "the stability map's runs",
        r"`config/proxy.yaml` \((\d+) runs, six rates, two depths\)",
        lambda: (sum(_sweep_runs("config/proxy.yaml")),),
    ),
    Quote(
        "DeepNorm against plain Post-Norm",
        r"plain Post-Norm (\d+) of (\d+) runs trained, DeepNorm (\d+) of (\d+) at each budget \(p = ([\d.]+); "
        r"gaps (-?[\d.]+) and (-?[\d.]+) bits inside 2 SE of ([\d.]+) and ([\d.]+)\); a fresh round at these "
        r"shares needs (\d+) seeds per arm for 80 % power",
        lambda: (
            sum(_decisive_row(*DEEPNORM, s)["trained_b"] for s in (500, 1000)),
            sum(_decisive_row(*DEEPNORM, s)["n_b"] for s in (500, 1000)),
            *{_decisive_row(*DEEPNORM, s)["trained_a"] for s in (500, 1000)},  # the same at each budget
            *{_decisive_row(*DEEPNORM, s)["n_a"] for s in (500, 1000)},
            *{_decisive_row(*DEEPNORM, s)["p_a"] for s in (500, 1000)},
            _decisive_row(*DEEPNORM, 500)["gap"],
            _decisive_row(*DEEPNORM, 1000)["gap"],
            _decisive_row(*DEEPNORM, 500)["resolution"],
            _decisive_row(*DEEPNORM, 1000)["resolution"],
            max(_decisive_row(*DEEPNORM, s)["seeds_for_survival"] for s in (500, 1000)),
        ),
    ),
    Quote(
        "clip 1 against clip 10",
        r"16 layers, 1e-2: (\d+) of (\d+) against (\d+) of (\d+) trained at 1,000 updates, (\d+) of (\d+) against "
        r"(\d+) of (\d+) at 500",
        lambda: tuple(
            _decisive_row(*CLIPPING, s)[k] for s in (1000, 500) for k in ("trained_a", "n_a", "trained_b", "n_b")
        ),
    ),
]


def _matches(quoted: str, value: float) -> bool:
    quoted = quoted.replace(",", "")  # thousands separators, as the README writes counts
    decimals = Decimal(quoted).as_tuple().exponent
    return Decimal(str(value)).quantize(Decimal(1).scaleb(decimals), rounding=ROUND_HALF_UP) == Decimal(quoted)


@cache
def _dose(pid: str) -> dict:
    """A promise of round 6's published verdicts (data/reference/dose_response/verdicts.json)."""
    (v,) = [v for v in json.loads(_text("data/reference/dose_response/verdicts.json"))["verdicts"] if v["id"] == pid]
    return v


@cache
def _round(name: str) -> dict:
    """An equivalence round's published verdict (data/reference/<name>/verdict.json)."""
    return json.loads(_text(f"data/reference/{name}/verdict.json"))


@cache
def _confirm(pid: str) -> dict:
    result = json.loads(_text("data/reference/confirm_round/verdicts.json"))
    (v,) = [v for v in result["verdicts"] if v["id"] == pid]
    return v


def _interval(pid: str) -> tuple[float, float, float]:
    v = _confirm(pid)
    return restated.newcombe(v["trained_a"], v["n_a"], v["trained_b"], v["n_b"])


def _counts_p_interval(pid: str, p_scale: float) -> tuple:
    """A promise of the confirmatory round as the README quotes it: both trained counts, p times
    `p_scale` (its mantissa where the text writes e-5 or e-7), the difference and its interval."""
    v = _confirm(pid)
    return (v["trained_a"], v["trained_b"], v["p_for"] * p_scale, *_interval(pid))


QUOTES += [
    Quote(
        "the confirmatory round's P1",
        r"(\d+) of 12 against (\d+) of 12 trained, p = (\d\.\d)e-5 \(Fisher one-sided, α = 0\.025\); difference "
        r"([\d.]+), 95 % interval "
        r"\[([\d.]+), ([\d.]+)\]",
        lambda: _counts_p_interval("P1", 1e5),
    ),
    Quote(
        "the confirmatory round's P2, by its interval and its planned power",
        r"\| undecided \| (\d+) of 12 against (\d+) of 12, p = ([\d.]+) \(difference ([\d.]+), 95 % interval "
        r"\[([\d.]+), ([\d.]+)\]\); planned with about ([\d.]+) % power \|",
        lambda: (*_counts_p_interval("P2", 1), 100 * restated.fisher_power(0.8, 2 / 3, 12)),  # the pilot's shares
    ),
    Quote(
        "the confirmatory round's P3",
        r"a positive control\) \| supported \| (\d+) of 12 against (\d+) of 12, p = (\d\.\d)e-7; difference "
        r"([\d.]+), 95 % interval \[([\d.]+), ([\d.]+)\]",
        lambda: _counts_p_interval("P3", 1e7),
    ),
    Quote(
        "the A/A pair's chance of failing",
        r"could not fail \(the exact tests reject ([\d.]+) % of the time\)",
        lambda: (100 * restated.aa_rejection(0.9),),
    ),
    Quote(
        "round 6 at width 64 and the width test",
        r"at width 64 \(secondary\) (\d+) of 28 against (\d+) of 28, ([\d.]+) times; whether the breakdown rate falls "
        r"with width \(Wortsman et al.\) is not shown: shifts ([\d.]+) \[(-?[\d.]+), ([\d.]+)\] \(clip 10\) and "
        r"([\d.]+) \[(-?[\d.]+), ([\d.]+)\] \(clip 1\)",
        lambda: (
            *(_dose("D3")[k] for k in ("trained_a", "trained_b", "breakdown_rate_ratio")),
            *(x for d in ("D4", "D5") for x in (_dose(d)["shift_log_rate"], *_dose(d)["shift_interval_95"])),
        ),
    ),
    Quote(
        "round 8's seed-to-seed sd",
        r"round 8's, on final loss, could and did \(sd ([\d.]+) bits",
        lambda: (min(p[k] for p in _round("aa_control")["pairs"] for k in ("sd_a", "sd_b")),),  # 0.035-0.038
    ),
    Quote(
        "round 9's A/A pair and positive control",
        r"round 9, sized from it, held: 12 seeds a side, (-?[\d.]+) bits \[(-?[\d.]+), ([\d.]+)\] inside "
        r"\+-([\d.]+), and a planted ([\d.]+) \[([\d.]+), ([\d.]+)\] detected",
        lambda: tuple(
            x
            for p in _round("aa_margin")["pairs"]
            for x in (
                p["difference"],
                *p["interval_90"],
                *([_round("aa_margin")["margin_bits"]] if p["id"] == "AA" else []),
            )
        ),
    ),
    Quote(
        "round 5 under Holm with the three confirmatory tests",
        r"above it does not stand \(adjusted p = ([\d.]+)\)",
        lambda: (restated.stats()["R5"]["four"],),
    ),
]


@cache
def _pb_relax_round5() -> tuple[dict, list[dict]]:
    folder = ROOT / "data/reference/pb_relax_confirm"
    return json.loads((folder / "verdict.json").read_text()), list(csv.DictReader(open(folder / "runs.csv")))


A, B = "prenorm_attnrelax_clip1", "prenorm_unfused_clip1"  # PB-Relax, fairseq's unfused order


def _verdict(name: str) -> dict:
    """The one promise of a dose round on synthetic music (data/reference/<name>/verdicts.json)."""
    (v,) = json.loads(_text(f"data/reference/{name}/verdicts.json"))["verdicts"]
    return v


QUOTES.append(
    Quote(
        "rounds 12 and 13 on synthetic music",
        r"round 12 at [\d.e-]+ to [\d.e-]+ missed: (\d+) of 28 against (\d+) of 28 trained, p = ([\d.]+) \(difference "
        r"([\d.]+) \[(-?[\d.]+), ([\d.]+)\]\); round 13 one octave lower, [\d.e-]+ to [\d.e-]+: (\d+) of 28 against "
        r"(\d+) of 28, p = ([\d.]+) against α = ([\d.]+) .*?breakdown rate ([\d.]+) times clip 10's, 95 % interval "
        r"\[([\d.]+), ([\d.]+)\]",
        lambda: (
            *(_verdict("synth_dose")[k] for k in ("trained_a", "trained_b", "p_for", "difference")),
            *_verdict("synth_dose")["interval_95"],
            *(_verdict("synth_dose_low")[k] for k in ("trained_a", "trained_b", "p_for", "alpha")),
            _verdict("synth_dose_low")["breakdown_rate_ratio"],
            *(math.exp(x) for x in _verdict("synth_dose_low")["shift_interval_95"]),
        ),
    )
)


def _round5(gain: float, arm: str, column: str) -> list[float]:
    return [float(r[column]) for r in _pb_relax_round5()[1] if float(r["qk_gain"]) == gain and r["arm"] == arm]


QUOTES.append(
    Quote(
        "PB-Relax in fp16 training, round 5",
        r"PB-Relax trained through (\d) of 4 runs, fairseq's unfused order (\d) of 4 \(each stopped by update (\d+) "
        r"at the loss scaler's floor once its logits passed 65,504\), p = ([\d.]+); at the control gain "
        r"\(x (\d+), logits below (\d+),000\) both orders trained through (\d) of 2",
        lambda: (
            _pb_relax_round5()[0]["trained_high"][A],
            _pb_relax_round5()[0]["trained_high"][B],
            max(_round5(128.0, B, "updates")),
            _pb_relax_round5()[0]["p_for"],
            _pb_relax_round5()[0]["gains"][0],
            # "below 26,000": the largest control logit, in thousands rounded up
            math.ceil(max(v for a in (A, B) for v in _round5(32.0, a, "attn_logit_max")) / 1000),
            *{_pb_relax_round5()[0]["trained_low"][a] for a in (A, B)},
        ),
    )
)


@pytest.mark.parametrize("quote", QUOTES, ids=[q.what for q in QUOTES])
def test_the_readme_quotes_its_sources(quote):
    readme = " ".join(_text("README.md").split())  # a quote may wrap across lines
    m = re.search(quote.readme, readme)
    assert m, f"README.md no longer quotes {quote.what} in the form {quote.readme!r}"
    values = quote.source()
    quoted = m.groups() * len(values) if len(m.groups()) == 1 else m.groups()  # one number for a range: both ends
    assert len(values) == len(quoted), (quote.what, values)
    wrong = [(q, v) for q, v in zip(quoted, values) if not _matches(q, v)]
    assert not wrong, f"README.md quotes {quote.what} as {m.groups()}, its sources say {values}"


def test_a_quote_that_drifts_fails():
    assert _matches("1.9", 1.85) and _matches("9", _minutes("8 min 51 s")) and _matches("-0.75", -0.753)
    assert not _matches("1.8", 1.85) and not _matches("182", 190.4) and not _matches("3", 2)
