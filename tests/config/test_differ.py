"""config/differ.py: the first difference of two sets of settings, the one the stability map, the
decisive experiments and `amlm verify` name."""

from acoustic_mlm.config.differ import UNSET, differing_keys, first_difference


def test_equal_settings_have_no_difference_and_a_null_equals_an_absent_key():
    assert first_difference({"a": 1, "b": "x"}, {"b": "x", "a": 1}) is None
    assert first_difference({"a": 1, "c": None}, {"a": 1}) is None


def test_the_first_difference_in_key_order_with_both_values_and_the_count_after_it():
    d = first_difference({"train.lr": 0.5, "model.layers": 4, "x": 1}, {"train.lr": 0.1, "model.layers": 2})
    assert (d.key, d.mine, d.theirs, d.more) == ("model.layers", 4, 2, 2)
    assert d.and_more() == " (and 2 more)" and d.and_more("settings differ") == " (and 2 more settings differ)"
    assert f"{d.mine!r}" == "4"


def test_a_key_one_side_lacks_shows_as_unset():
    d = first_difference({"a": 1}, {"a": 1, "b": 2})
    assert (d.key, d.mine, d.theirs, d.more) == ("b", UNSET, 2, 0)
    assert f"{d.mine!r}" == "'(unset)'" and d.and_more() == ""


def test_keys_named_first_come_first_and_ignored_keys_never():
    mine, theirs = {"a": 1, "z": 1, "k": 1}, {"a": 2, "z": 2, "k": 2}
    assert differing_keys(mine, theirs) == ["a", "k", "z"]
    assert differing_keys(mine, theirs, first={"z": 0}) == ["z", "a", "k"]  # a mapping's keys will do
    assert differing_keys(mine, theirs, ignore=("a",)) == ["k", "z"]
    assert first_difference({"cpu_kernels": "avx2"}, {"cpu_kernels": "native"}, ignore=("cpu_kernels",)) is None
