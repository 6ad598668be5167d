"""model/config.py: the model's configuration and its formulas (stride, receptive field, mask groups,
CQT frequencies), which the configuration's checks import."""

import dataclasses

import numpy as np
import pytest

from acoustic_mlm.model.config import (
    ModelConfig,
    ModelSection,
    cqt_top_frequency,
    mask_groups,
    receptive_field,
    total_stride,
)

MERT_CONV = ((512, 10, 5),) + ((512, 3, 2),) * 4 + ((512, 2, 2),) * 2  # MERT / wav2vec 2.0's front end


def test_mert_front_end_strides_320_samples_and_sees_400():
    assert total_stride(MERT_CONV) == 320  # EnCodec's hop: one feature per code
    assert receptive_field(MERT_CONV) == 400  # 25 ms at 16 kHz in wav2vec 2.0; 16.7 ms at 24 kHz


def test_mask_groups_split_rows_so_that_processes_hold_whole_groups():
    groups = mask_groups(8, 2)
    assert [g.tolist() for g in groups] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    rank1_of_2 = set(range(1, 8, 2))  # rows a DDP process r of P keeps: r, r + P, ...
    assert all(set(g.tolist()) <= rank1_of_2 or not set(g.tolist()) & rank1_of_2 for g in groups)
    assert [g.tolist() for g in mask_groups(5, 0)] == [list(range(5))]
    assert np.concatenate(mask_groups(7, 3)).tolist() == [0, 3, 6, 1, 4, 2, 5]


def test_mert_cqt_bins_reach_4126_hz():
    assert cqt_top_frequency(32.7, 336, 48) == pytest.approx(32.7 * 2 ** (335 / 48))
    assert round(cqt_top_frequency(32.7, 336, 48)) == 4126


def test_a_section_with_an_arm_is_the_arms_model(root):
    from acoustic_mlm import config as C

    section = C.load(root / "config" / "smoke.yaml").model
    m = section.with_arm(norm="deepnorm", attention="pb_relax")
    assert isinstance(m, ModelConfig) and (m.norm, m.attention) == ("deepnorm", "pb_relax")
    assert {f.name: getattr(m, f.name) for f in dataclasses.fields(ModelSection)} == dataclasses.asdict(section)
    assert section.stride == 320


def test_only_the_optional_key_has_a_default():
    defaults = [
        f.name
        for f in dataclasses.fields(ModelConfig)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert defaults == ["cqt_impl"]
    with pytest.raises(TypeError):
        ModelSection()  # every key of the section must be given


def test_an_arm_with_qk_norm_is_accepted_and_a_misspelling_named(root):
    """`attention: qk_norm` passes the schema and the checks and reaches the arm's model; a
    misspelling is one line naming the key (and the CLI exits 2 on it, as on every ConfigError)."""
    from acoustic_mlm import config as C

    raw = C.read_yaml(root / "config" / "smoke.yaml")
    raw["runs"]["prenorm_clip1"]["attention"] = "qk_norm"
    cfg = C.from_mapping(raw, "smoke.yaml")
    assert cfg.model_for("prenorm_clip1").attention == "qk_norm"
    from acoustic_mlm.config.checks import schema

    assert "qk_norm" in schema()["properties"]["runs"]["additionalProperties"]["properties"]["attention"]["enum"]
    raw["runs"]["prenorm_clip1"]["attention"] = "qk-norm"
    with pytest.raises(C.ConfigError) as exc:
        C.validate(raw, source="smoke.yaml")
    assert "'runs.prenorm_clip1.attention'" in str(exc.value) and "\n" not in str(exc.value)
