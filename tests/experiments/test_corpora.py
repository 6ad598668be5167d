"""experiments.corpora: a round's corpus named, checked, placed and made by the package's own stages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from acoustic_mlm.errors import UserError
from acoustic_mlm.experiments import corpora
from acoustic_mlm.experiments import declaration as D

ROOT = Path(__file__).resolve().parents[2]


def _preset(tmp_path: Path, name: str = "mine.yaml", **data) -> Path:
    """config/smoke.yaml with some data.synthetic keys changed, written under tmp_path."""
    mapping = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    mapping["data"]["synthetic"].update(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(mapping, sort_keys=False))
    return path


def test_a_corpus_is_tones_or_a_valid_preset_and_anything_else_is_one_line(tmp_path):
    decl = tmp_path / "round.yaml"
    assert corpora.check(decl, "tones") == "tones" and corpora.check(decl, "") == ""
    assert corpora.check(decl, "config/smoke.yaml") == "config/smoke.yaml"
    with pytest.raises(UserError, match=r"round\.yaml: 'corpus' is 'synthetic', not 'tones' or a preset's \.yaml"):
        corpora.check(decl, "synthetic")
    with pytest.raises(UserError, match=r"'corpus' names a preset that is not valid: .*nothere\.yaml"):
        corpora.check(decl, str(tmp_path / "nothere.yaml"))
    broken = _preset(tmp_path, n_clips=-3)
    with pytest.raises(UserError, match=r"'corpus' names a preset that is not valid: .*n_clips") as err:
        corpora.check(decl, str(broken))
    assert "\n" not in str(err.value)


def test_a_declaration_with_an_unknown_corpus_is_refused_before_anything_runs(tmp_path):
    doc = yaml.safe_load((ROOT / "config" / "experiments" / "example.yaml").read_text())
    doc["corpus"] = "music"
    decl = tmp_path / "example.yaml"
    decl.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(UserError, match=r"example\.yaml: 'corpus' is 'music'"):
        D.load(decl)


def test_each_corpus_has_its_folder_and_only_its_data_decides_it(tmp_path):
    work = tmp_path / "work"
    assert corpora.folder_of(work, "tones") == work / "data"  # where the published rounds' runs trained
    a = corpora.folder_of(work, str(_preset(tmp_path, "a.yaml")))
    assert a.parent == work / "corpora" and a.name.startswith("a-") and len(a.name) == len("a-") + 12
    other_seed = corpora.folder_of(work, str(_preset(tmp_path, "a.yaml", seed=7)))
    assert other_seed != a  # another corpus, another folder
    mapping = yaml.safe_load((tmp_path / "a.yaml").read_text())
    mapping["data"]["synthetic"]["seed"] = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())["data"][
        "synthetic"
    ]["seed"]
    mapping["model"]["dim"] = 48  # the model is not the corpus
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(mapping, sort_keys=False))
    assert corpora.folder_of(work, str(tmp_path / "a.yaml")) == a


@pytest.mark.slow
def test_a_presets_corpus_is_made_once_by_the_stages_and_read_back(tmp_path, monkeypatch):
    """A small synthetic corpus through fetch, prepare and the calibrated tokenizer: made once, its plateau
    the tokenizer's unigram entropy; asked again, it is read, not made; a folder cut short is made again."""
    preset = _preset(tmp_path, n_clips=6, clip_seconds=4.0)  # 1,024 train frames: the calibrated tokenizer's least
    work = tmp_path / "work"
    prepared, codes, plateau = corpora.data_for(str(preset), work)
    summary = json.loads((codes / "tokenizer.json").read_text())
    assert plateau == pytest.approx(summary["unigram_entropy_bits"][0]) and 0 < plateau < 10.01  # codebook 0's
    assert (prepared / "manifest.csv").exists() and np.load(next(codes.glob("shard-*/codes.npy"))).shape[0] == 8
    made = (codes / "tokenizer.json").stat().st_mtime_ns
    monkeypatch.setattr(corpora, "stage", lambda *a, **k: pytest.fail("a complete corpus was made again"))
    assert corpora.data_for(str(preset), work)[2] == plateau and (codes / "tokenizer.json").stat().st_mtime_ns == made
    (codes / "tokenizer.json").unlink()  # as a maker killed before its last file leaves it
    calls = []
    monkeypatch.setattr(corpora, "stage", lambda root, config, cwd=None: calls.append(root) or (root, root))
    with pytest.raises(Exception):  # noqa: B017 - the stub makes nothing: only that it was asked matters here
        corpora.data_for(str(preset), work)
    assert calls == [corpora.folder_of(work, str(preset))] and not (prepared / "manifest.csv").exists()


def test_a_stage_that_fails_is_one_line_naming_the_preset_and_the_stage(tmp_path):
    preset = _preset(tmp_path)
    mapping = yaml.safe_load(preset.read_text())
    mapping["data"]["source"] = "folder"
    mapping["data"]["folder"] = str(tmp_path / "no-such-folder")
    preset.write_text(yaml.safe_dump(mapping, sort_keys=False))
    with pytest.raises(UserError, match=r"mine\.yaml: amlm fetch failed: ") as err:
        corpora.stage(tmp_path / "c", preset)
    assert "\n" not in str(err.value)
