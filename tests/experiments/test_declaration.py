"""A round's declaration is read strictly: unknown keys, values of the wrong kind and contradictions are
one line naming the file and the key, before anything is read or trained."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import declaration as D
from acoustic_mlm.experiments import judge as J

ROOT = Path(__file__).resolve().parents[2]
DECL = ROOT / "config" / "experiments"


def _write(tmp_path: Path, doc: dict, name: str = "confirm_round") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _confirm() -> dict:
    return yaml.safe_load((DECL / "confirm_round.yaml").read_text())


def test_every_shipped_declaration_loads_in_at_most_60_lines():
    for path in sorted(DECL.glob("*.yaml")):
        rnd = D.load(path)
        assert rnd.name == path.stem and (rnd.tables.exists() or rnd.name == "example"), path
        assert len(path.read_text().splitlines()) <= 60, path


def test_the_confirmatory_round_reads_as_declared():
    rnd = D.load(DECL / "confirm_round.yaml")
    p2 = rnd.promise("P2")
    assert (p2.favoured, p2.against, p2.cell, p2.alpha, p2.family) == (
        "prenorm_clip1",
        "prenorm_clip10",
        "S1",
        0.025,
        "confirmatory",
    )
    assert p2.seeds == tuple(range(101, 113)) and rnd.promise("AA").seeds_against == tuple(range(101, 111))
    assert rnd.families["confirmatory"].members[-1] == "pb_relax_confirm/R5"
    assert len(J.plan(rnd)) == 12 * 5 + 10 + 32  # P1-P3's arms, the A/A arm, the sensitivity grid
    cfg = D.settings(rnd, "postnorm_deepnorm_clip1", "D12", 101)
    assert (cfg.model_for("postnorm_deepnorm_clip1").layers, cfg.train.warmup_steps, cfg.train.lr) == (12, 0, 0.01)


def _mutate(doc, where, value):
    *path, last = where
    d = doc
    for k in path:
        d = d[k]
    if value is KeyError:
        del d[last]
    else:
        d[last] = value
    return doc


BAD = {
    "an unknown top key": ((["seed"],), [1], "'seed' is not a key of a round"),
    "an unknown promise key": ((["promises", 0, "alpah"],), 0.05, "'promises[0].alpah' is not a key"),
    "an unknown arm key": ((["arms", "prenorm_clip1", "clipp"],), 1.0, "'arms.prenorm_clip1.clipp' is not a key"),
    "a missing key": ((["tables"],), KeyError, "'tables' is missing"),
    "unknown rules": ((["rules"],), "bayes", "'rules' is 'bayes', not one of pairs"),
    "a promise of an undeclared arm": (
        (["promises", 0, "against"],),
        "prenorm_clip3",
        "names 'prenorm_clip3', not an arm",
    ),
    "a promise of an undeclared cell": ((["promises", 1, "cell"],), "S9", "'promises[1].cell' names 'S9'"),
    "undeclared seeds": ((["promises", 1, "seeds"],), "fresh", "'promises[1].seeds' names 'fresh'"),
    "an alpha unlike its family's": ((["promises", 0, "alpha"],), 0.05, "its family 'confirmatory' controls at 0.025"),
    "an undeclared family": ((["promises", 0, "family"],), "exploratory", "names 'exploratory', not a family"),
    "an A/A pair in a family": ((["promises", 3, "family"],), "confirmatory", "a family holds confirmatory tests"),
    "a promise against itself": ((["promises", 0, "against"],), "prenorm_clip1", "an A/A pair is role: calibration"),
    "a two-sided test": ((["promises", 0, "sided"],), "two", "'promises[0].sided' is 'two'"),
    "an alpha out of range": ((["families", "confirmatory", "alpha"],), 0.5, "not a level between 0 and 0.5"),
    "an unknown control": ((["families", "confirmatory", "control"],), "bonferroni", "not one of holm"),
    "a family that forgets its member": (
        (["families", "confirmatory", "members"],),
        ["confirm_round/P2", "confirm_round/P3"],
        "whose members do not list confirm_round/P1",
    ),
    "a seed range backwards": ((["seeds", "main"],), "112..101", "'seeds.main' is '112..101'"),
    "a seed twice": ((["seeds", "aa"],), [201, 201], "'seeds.aa' lists a seed twice"),
    "a negative clip": ((["arms", "prenorm_clip1", "clip"],), -1.0, "'arms.prenorm_clip1.clip' is negative"),
    "a norm not the package's": ((["arms", "prenorm_clip1", "norm"],), "rms", "not one of pre, post, deepnorm"),
    "a clip that is text": ((["arms", "prenorm_clip1", "clip"],), "1", "not a number"),
    "a boolean rate": ((["cells", "S1", "lr"],), True, "'cells.S1.lr' is True, not a number"),
    "a zero rate": ((["cells", "S1", "lr"],), 0.0, "'cells.S1.lr' must be a positive rate"),
    "an override the preset lacks": (
        (["size", "model.width"],),
        32,
        "'size.model.width' is not a key of config/proxy.yaml",
    ),
    "a verdict path": ((["verdict"],), "../verdicts.json", "not a .json file name"),
    "a sensitivity arm not declared": ((["sensitivity", "arms"],), ["prenorm_clip5"], "names 'prenorm_clip5'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_declaration_is_one_line_naming_the_key(case, tmp_path):
    (where,), value, words = BAD[case]
    path = _write(tmp_path, _mutate(_confirm(), where, value))
    with pytest.raises(UserError) as err:
        D.load(path)
    assert words in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_family_declared_unlike_in_another_round_is_refused(tmp_path):
    path = _write(tmp_path, _confirm())
    other = yaml.safe_load((DECL / "pb_relax_confirm.yaml").read_text())
    other["families"]["confirmatory"]["alpha"] = 0.05
    other["promises"][0]["alpha"] = 0.05
    _write(tmp_path, other, "pb_relax_confirm")
    with pytest.raises(UserError, match="'families.confirmatory' differs"):
        J.judge(path, tmp_path / "out")
