"""What each pipeline step depends on: STEP_KEYS' keys exist, the steps fit UPSTREAM and DVC_STAGES,
and result_keys / settings on the default config."""

from __future__ import annotations

import pytest
from helpers import RUN_NAMES, write_sweep_config

from acoustic_mlm import config as C
from acoustic_mlm.config.steps import DVC_STAGES, STEP_KEYS, UPSTREAM, result_keys, settings


def _has(cfg: C.Config, key: str) -> bool:
    try:
        cfg.value(key)
    except (KeyError, TypeError):
        return False
    return True


def test_every_step_key_names_a_key_of_the_config(root, tmp_path):
    """The default config holds every included and excluded key, for every arm; `sweep` only a sweep's."""
    cfg = C.load(root / "config" / "config.yaml")
    swept = C.load(write_sweep_config(root, tmp_path / "sweep.yaml"))
    for step, (include, exclude) in STEP_KEYS.items():
        for pattern in include + exclude:
            keys = [pattern.replace("{run}", run) for run in RUN_NAMES] if "{run}" in pattern else [pattern]
            for key in keys:
                assert _has(cfg, key) or (key == "sweep" and _has(swept, key)), f"{step}: {key}"


def test_upstream_and_dvc_stages_cover_the_steps_in_order():
    steps = list(STEP_KEYS)
    assert sorted(s for group in DVC_STAGES.values() for s in group) == sorted(steps)  # each step in one stage
    for step, before in UPSTREAM.items():
        assert all(steps.index(b) < steps.index(step) for b in before), step
        assert all(set(UPSTREAM.get(b, ())) <= set(before) for b in before), step  # transitively closed


def test_train_depends_on_its_arm_the_model_and_training_but_not_on_how_fast_it_runs(smoke_cfg):
    run, other = RUN_NAMES[1], RUN_NAMES[0]
    keys = result_keys("train", smoke_cfg, run)
    arm = [k for k in keys if k.startswith("runs.")]
    assert arm == [f"runs.{run}.{k}" for k in smoke_cfg["runs"][run] if k not in ("label", "role")]
    assert not any(k.startswith(f"runs.{other}.") for k in keys)
    assert "model.dim" in keys and "train.lr" in keys
    assert not {"train.threads", "train.workers", "train.checkpoint_interval"} & set(keys)
    assert not any(k.startswith(("data.", "tokenizer.")) for k in keys)
    assert len(keys) == len(set(keys))
    # config order: model before train before runs, as in the file
    assert keys.index("model.dim") < keys.index("train.lr") < keys.index(arm[0])


def test_upstream_adds_prepares_and_tokenizes_keys(smoke_cfg):
    run = RUN_NAMES[0]
    own, whole = result_keys("train", smoke_cfg, run), result_keys("train", smoke_cfg, run, upstream=True)
    assert set(own) < set(whole)
    added = set(whole) - set(own)
    assert {
        "data.source",
        "data.synthetic.seed",
        "data.shard_files",
        "data.sample_rate",
        "data.valid_fraction",
        "data.split_seed",
        "train.crop_seconds",
        "tokenizer.mode",
        "tokenizer.seed",
        "tokenizer.batch_size",
    } <= added | set(own)
    assert {k.split(".")[0] for k in added} == {"data", "tokenizer"}  # crop_seconds: already train's own
    assert result_keys("fetch", smoke_cfg, upstream=True) == result_keys("fetch", smoke_cfg)  # nothing before it


def test_fetch_leaves_out_what_later_steps_take():
    cfg = {
        "data": {
            "source": "synthetic",
            "shard_files": 4,
            "sample_rate": 24000,
            "valid_fraction": 0.1,
            "split_seed": 0,
            "synthetic": {"n_clips": 2, "seed": 0},
            "folder": None,
        }
    }
    assert result_keys("fetch", cfg) == ["data.source", "data.synthetic.n_clips", "data.synthetic.seed", "data.folder"]
    assert result_keys("plan", cfg) == ["data.shard_files"]


def test_a_step_without_an_arm_has_no_arm_keys_and_star_means_every_arm(smoke_cfg, monkeypatch):
    assert not any(k.startswith("runs.") for k in result_keys("train", smoke_cfg))  # "{run}" without a run
    monkeypatch.setitem(STEP_KEYS, "every_clip", (("runs.*.clip",), ()))
    assert result_keys("every_clip", smoke_cfg) == [f"runs.{name}.clip" for name in smoke_cfg["runs"]]


def test_an_unknown_step_is_a_key_error_listing_the_steps(smoke_cfg):
    with pytest.raises(KeyError, match=r"no pipeline step 'trian' \(steps: fetch, plan, "):
        result_keys("trian", smoke_cfg)


def test_settings_are_the_values_at_those_keys(smoke_cfg):
    run = RUN_NAMES[2]
    values = settings(smoke_cfg, result_keys("train", smoke_cfg, run))
    assert values["model.dim"] == smoke_cfg["model"]["dim"] and values["train.lr"] == smoke_cfg["train"]["lr"]
    assert values[f"runs.{run}.norm"] == "deepnorm" and values[f"runs.{run}.seeds"] == smoke_cfg["runs"][run]["seeds"]
    assert settings(smoke_cfg, ["data.synthetic"]) == {"data.synthetic": smoke_cfg["data"]["synthetic"]}
    assert settings(smoke_cfg, []) == {}
