"""The one base class for errors meant for the user.

A `UserError` is a problem with the user's input (a configuration key, a file, a folder, a
setting that cannot work): its message is one line that names the file or key and says what to
do. The command line prints it without a traceback and exits with status 2. Anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input; the message is one line naming the file or key."""


class ConfigError(UserError, ValueError):
    """A configuration problem; the message is one line naming the file and the key."""


def one_line(exc: BaseException) -> str:
    """An exception's message folded onto one line (its type's name when the message is empty)."""
    return " ".join(str(exc).split()) or type(exc).__name__
