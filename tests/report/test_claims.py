"""The six claims on loss curves made up in the test: every verdict comes out each way."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from helpers import make_config

from acoustic_mlm.errors import UserError
from acoustic_mlm.report import claims as CL
from acoustic_mlm.report.claims import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, ClaimThresholds

# logged like train.py with the default config: steps 1, 2, 4, ... then every 50, up to 1200
STEPS = np.array([1, 2, 4, 8, 16, 32, 64] + list(range(100, 1201, 50)))

# arm -> (start, final, tau): y = final + (start - final) * exp(-step / tau)
# converged (within 0.1 bits for good) at about tau * ln(40 * (start - final) / 4)
GOOD = {
    "prenorm_clip10": dict(start=9.8, final=5.7, tau=40),  # converged at step 150
    "prenorm_clip1": dict(start=9.8, final=5.9, tau=100),  # 400 (a third of the range)
    "postnorm_deepnorm_clip1": dict(start=9.8, final=5.8, tau=50, spike=(250, 2.5)),  # spike at 250: 300
    "prenorm_attnrelax_clip1": dict(start=9.8, final=5.85, tau=60),  # 250
}


def arm(start, final, tau, spike=None, steps=STEPS, noise=0.0, rng=None):
    y = final + (start - final) * np.exp(-steps / tau)
    if spike is not None:
        at, height = spike
        y = y + height * (steps == at)
    if noise:
        y = y + rng.normal(0, noise, len(steps))
    return y


def make_curves(spec=GOOD, seeds=(1,), per_seed=None):
    """Tidy curves; `per_seed[(run, seed)]` overrides an arm's parameters for one seed."""
    rows = []
    for run, params in spec.items():
        for seed in seeds:
            p = {**params, **(per_seed or {}).get((run, seed), {})}
            for split, offset in (("train", 0.0), ("valid", 0.2)):
                for cb in (0, 1):
                    for s, y in zip(STEPS, arm(**p) + offset + cb):
                        rows.append((run, run, seed, int(s), split, cb, float(y)))
    return pd.DataFrame(rows, columns=["run", "label", "seed", "step", "split", "codebook", "loss_bits"])


ROLES = {
    "clip10": "prenorm_clip10",
    "clip1": "prenorm_clip1",
    "deepnorm": "postnorm_deepnorm_clip1",
    "attn_relax": "prenorm_attnrelax_clip1",
}


def verdicts(curves, **kw):
    return {c["id"]: c["verdict"] for c in CL.evaluate(curves, ClaimThresholds(**kw), ROLES)}


def by_id(curves, **kw):
    return {c["id"]: c for c in CL.evaluate(curves, ClaimThresholds(**kw), ROLES)}


def claims_cfg(smoke_cfg, **thresholds):
    smoke_cfg["claims"].update(thresholds)
    return smoke_cfg


def with_arm(**changes):
    return {run: {**p, **changes.get(run, {})} for run, p in GOOD.items()}


# ----------------------------------------------------------------------------- verdicts


def test_all_claims_reproduced_on_one_seed():
    out = CL.evaluate(make_curves(), ClaimThresholds(), ROLES)
    assert [c["id"] for c in out] == list("abcdef")
    assert {c["id"]: c["verdict"] for c in out} == dict.fromkeys("abcdef", REPRODUCED)
    for c in out:
        assert set(c) == {"id", "claim", "paper", "measured", "verdict", "note"}
        assert "one seed" in c["note"]
    m = {c["id"]: c["measured"] for c in out}
    assert m["a"]["first_bits"]["prenorm_clip10"] == pytest.approx(5.7 + 4.1 * math.exp(-1 / 40), abs=1e-4)
    assert m["b"]["final_bits"]["prenorm_clip10"] == pytest.approx(5.7, abs=0.01)
    steps = m["c"]["converged_step"]
    assert steps["prenorm_clip10"] < steps["prenorm_attnrelax_clip1"] < steps["prenorm_clip1"]
    assert m["d"]["spike"]["1"]["peak_step"] == 250 and m["d"]["spike"]["1"]["recovery_step"] == 300
    assert m["d"]["spikes_in_other_arms"] == {}
    assert max(m["f"]["converged_fraction"].values()) <= 0.4


@pytest.mark.parametrize(
    "claim, spec, why",
    [
        ("a", with_arm(prenorm_clip1={"start": 11.5}), "outside [9, 10.6]"),
        ("b", with_arm(prenorm_clip10={"final": 6.0}), "difference -0.200 bits"),
        ("c", with_arm(prenorm_clip1={"tau": 30}), "slowest other arm"),
        ("d", with_arm(postnorm_deepnorm_clip1={"spike": None}), ""),
        ("e", with_arm(prenorm_attnrelax_clip1={"tau": 20}), "expected > 0"),
        ("f", with_arm(prenorm_clip1={"tau": 200}), "not stabilised by 40% of the x-range: prenorm_clip1"),
    ],
)
def test_each_claim_not_reproduced(claim, spec, why):
    c = by_id(make_curves(spec))[claim]
    assert c["verdict"] == NOT_REPRODUCED
    assert why in c["note"]


def test_tie_in_final_loss_is_inconclusive():
    # clip 10 and Post-Norm end 0.01 bits apart: below min_final_gap (0.02) -> a tie
    c = by_id(make_curves(with_arm(postnorm_deepnorm_clip1={"final": 5.71})))["b"]
    assert c["verdict"] == INCONCLUSIVE and "tie" in c["note"]


def test_attn_relax_equal_to_clip1_is_inconclusive_and_explained():
    # the fp32 expectation: PB-Relax changes nothing, so the arm converges with clip 1
    c = by_id(make_curves(with_arm(prenorm_attnrelax_clip1=GOOD["prenorm_clip1"])))["e"]
    assert c["verdict"] == INCONCLUSIVE
    assert "tie" in c["note"] and "PB-Relax" in c["note"]


def test_spike_that_never_recovers_is_not_reproduced():
    spec = with_arm(postnorm_deepnorm_clip1={"spike": None})
    curves = make_curves(spec)
    late = (curves.run == "postnorm_deepnorm_clip1") & (curves.step >= 1100)
    curves.loc[late, "loss_bits"] += 2.0
    c = by_id(curves)["d"]
    assert c["verdict"] == NOT_REPRODUCED and "did not recover" in c["note"]


def test_spikes_in_other_arms_are_reported():
    c = by_id(make_curves(with_arm(prenorm_clip10={"spike": (500, 1.5)})))["d"]
    assert c["verdict"] == REPRODUCED
    assert c["measured"]["spikes_in_other_arms"] == {"prenorm_clip10": 1}
    assert "other arms spike too" in c["note"]


# ----------------------------------------------------------------------------- seeds


def test_several_seeds_clear_differences_are_reproduced():
    offsets = {(run, s): {"final": p["final"] + 0.005 * s} for run, p in GOOD.items() for s in (1, 2, 3)}
    out = by_id(make_curves(seeds=(1, 2, 3), per_seed=offsets))
    assert {k: c["verdict"] for k, c in out.items()} == dict.fromkeys("abcdef", REPRODUCED)
    assert "one seed" not in out["b"]["note"]
    assert out["b"]["measured"]["seeds"]["prenorm_clip10"] == 3
    assert set(out["b"]["measured"]["final_bits_per_seed"]["prenorm_clip10"]) == {"1", "2", "3"}


@pytest.mark.parametrize("how", ["range", "2std"])
def test_difference_within_seed_spread_is_inconclusive(how):
    # clip 10 ends lowest on average, but its seeds spread 0.4 bits: 0.05 bits mean nothing
    per_seed = {
        ("prenorm_clip10", 1): {"final": 5.5},
        ("prenorm_clip10", 2): {"final": 5.9},
        ("postnorm_deepnorm_clip1", 1): {"final": 5.75},
        ("postnorm_deepnorm_clip1", 2): {"final": 5.75},
        # clip 1 converges slowest in one seed, fastest in the other
        ("prenorm_clip1", 1): {"tau": 150},
        ("prenorm_clip1", 2): {"tau": 35},
    }
    out = by_id(make_curves(seeds=(1, 2), per_seed=per_seed), seed_spread=how)
    assert out["b"]["verdict"] == INCONCLUSIVE and "within the seed spread" in out["b"]["note"]
    assert out["c"]["verdict"] == INCONCLUSIVE and "within the seed spread" in out["c"]["note"]
    assert out["a"]["verdict"] == REPRODUCED


def test_spike_in_some_seeds_is_inconclusive():
    per_seed = {("postnorm_deepnorm_clip1", 2): {"spike": None}}
    c = by_id(make_curves(seeds=(1, 2), per_seed=per_seed))["d"]
    assert c["verdict"] == INCONCLUSIVE and "spike in 1 of 2 seeds" in c["note"]
    assert c["measured"]["spike"]["2"] is None


# ----------------------------------------------------------------------------- missing and diverged runs


def test_missing_run_is_inconclusive_not_a_crash():
    curves = make_curves()
    out = by_id(curves[curves.run != "prenorm_clip1"])
    for cid in "acef":
        assert out[cid]["verdict"] == INCONCLUSIVE, cid
        assert "missing from the curves: prenorm_clip1" in out[cid]["note"]
    assert out["b"]["verdict"] == INCONCLUSIVE  # clip 10 lowest among the three, but not all four
    assert out["d"]["verdict"] == REPRODUCED  # needs only the Post-Norm arm


def test_no_rows_at_all_is_inconclusive():
    empty = make_curves().iloc[0:0]
    assert set(verdicts(empty).values()) == {INCONCLUSIVE}


def test_diverged_run_is_noted():
    curves = make_curves()
    bad = (curves.run == "prenorm_clip1") & (curves.step >= 600)
    curves.loc[bad, "loss_bits"] = np.nan
    out = by_id(curves)
    assert "prenorm_clip1 seed 1 diverged (non-finite loss from step 600)" in out["c"]["note"]
    assert out["c"]["verdict"] == INCONCLUSIVE and out["e"]["verdict"] == INCONCLUSIVE
    assert out["f"]["verdict"] == NOT_REPRODUCED  # a diverged arm has not stabilised
    assert out["b"]["verdict"] == REPRODUCED  # a diverged rival ends worse; clip 10 still lowest
    assert out["b"]["measured"]["final_bits"]["prenorm_clip1"] is None


def test_diverged_clip10_has_no_final_loss():
    curves = make_curves()
    curves.loc[(curves.run == "prenorm_clip10") & (curves.step == 1200), "loss_bits"] = np.inf
    c = by_id(curves)["b"]
    assert c["verdict"] == NOT_REPRODUCED and "has no final loss" in c["note"]


def test_roles_map_to_other_run_names():
    curves = make_curves().replace({"run": {"prenorm_clip10": "my_clip10"}})
    assert verdicts(curves)["b"] == INCONCLUSIVE  # the old name is missing
    out = CL.evaluate(curves, ClaimThresholds(), {**ROLES, "clip10": "my_clip10"})
    assert {c["id"]: c["verdict"] for c in out} == dict.fromkeys("abcdef", REPRODUCED)
    with pytest.raises(UserError, match="unknown role 'clip5'"):
        CL.evaluate(curves, ClaimThresholds(), {"clip5": "x"})
    no_deepnorm = {r: n for r, n in ROLES.items() if r != "deepnorm"}
    d = {c["id"]: c for c in CL.evaluate(curves, ClaimThresholds(), no_deepnorm)}["d"]
    assert d["verdict"] == INCONCLUSIVE and "(no arm with role deepnorm)" in d["note"]


def test_renamed_arms_keep_their_verdicts(smoke_cfg, tmp_path):
    """Claims find arms by role: renaming every arm in the config changes no verdict."""
    renamed = {name: f"arm_{i}" for i, name in enumerate(GOOD)}
    curves_path = tmp_path / "loss_curves.csv"
    make_curves().replace({"run": renamed}).to_csv(curves_path, index=False)
    smoke_cfg["runs"] = {renamed[name]: r for name, r in smoke_cfg["runs"].items()}
    doc_claims = CL.run(make_config(smoke_cfg), curves_path, tmp_path / "c.json", tmp_path / "c.md")
    assert {c["id"]: c["verdict"] for c in doc_claims} == dict.fromkeys("abcdef", REPRODUCED)
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["n_seeds"] == {f"arm_{i}": 1 for i in range(4)}


def test_valid_split_is_evaluated_when_asked():
    curves = make_curves()
    train = CL.evaluate(curves, ClaimThresholds(), ROLES, split="train")
    valid = CL.evaluate(curves, ClaimThresholds(), ROLES, split="valid")
    assert valid[1]["measured"]["final_bits"]["prenorm_clip10"] == pytest.approx(
        train[1]["measured"]["final_bits"]["prenorm_clip10"] + 0.2, abs=1e-3
    )


# ----------------------------------------------------------------------------- files


def test_run_writes_json_and_markdown(tmp_path, smoke_cfg):
    curves_path = tmp_path / "loss_curves.csv"
    make_curves(seeds=(1,)).to_csv(curves_path, index=False)
    out_json, out_md = tmp_path / "claims.json", tmp_path / "claims.md"
    result = CL.run(make_config(claims_cfg(smoke_cfg, spike_threshold=1.0)), curves_path, out_json, out_md)
    assert len(result) == 6

    doc = json.loads(out_json.read_text())  # strict JSON: no NaN
    assert [c["id"] for c in doc["claims"]] == list("abcdef")
    assert doc["thresholds"]["spike_threshold"] == 1.0 and doc["thresholds"]["start_min"] == 9.0
    assert doc["n_seeds"] == dict.fromkeys(GOOD, 1)
    assert doc["verdicts"] == dict.fromkeys("abcdef", REPRODUCED)
    # the same checks on the paper's digitised curves (pinned in test_reference.py)
    assert doc["paper_verdicts"]["f"] == NOT_REPRODUCED

    md = out_md.read_text()
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0] == "|  | claim | paper | measured | verdict | on the paper's curves |"
    assert len(table) == 2 + 6  # header, rule, one row per claim
    assert all(line.count(" | ") == 5 for line in table[2:])  # pipes inside cells are escaped
    assert "**reproduced**" in md and "## Notes" in md
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_run_without_curves_names_the_file(tmp_path, smoke_cfg):
    with pytest.raises(UserError, match="loss curves not found"):
        CL.run(make_config(smoke_cfg), tmp_path / "nope.csv", tmp_path / "c.json", tmp_path / "c.md")
    assert not (tmp_path / "c.json").exists()


def test_run_without_reference_still_writes(tmp_path, smoke_cfg):
    curves_path = tmp_path / "loss_curves.csv"
    make_curves().to_csv(curves_path, index=False)
    CL.run(
        make_config(smoke_cfg),
        curves_path,
        tmp_path / "c.json",
        tmp_path / "c.md",
        reference_path=tmp_path / "none.csv",
    )
    doc = json.loads((tmp_path / "c.json").read_text())
    assert "paper_verdicts" not in doc and len(doc["claims"]) == 6
    assert "on the paper's curves" not in (tmp_path / "c.md").read_text()
