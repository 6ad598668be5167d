"""errors.py: a user's error is one line; a configuration error is both a UserError and a ValueError."""

import pytest

from acoustic_mlm.errors import ConfigError, UserError, one_line


def test_one_line_folds_every_line_break_and_run_of_spaces():
    assert one_line(UserError("data/raw/x.wav:\n  not audio;\tremove it ")) == "data/raw/x.wav: not audio; remove it"


def test_one_line_of_an_empty_message_is_the_type_name():
    assert one_line(KeyError()) == "KeyError" and one_line(UserError("")) == "UserError"


def test_a_config_error_is_caught_as_a_user_error_and_as_a_value_error():
    for kind in (UserError, ValueError):
        with pytest.raises(kind, match="smoke.yaml: unknown key 'x'"):
            raise ConfigError("smoke.yaml: unknown key 'x'")
