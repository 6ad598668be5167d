"""The first difference of two sets of settings ({dotted key: value}, as a run's summary.json records
them and `train.state.fingerprint` gives them): what the stability map, the decisive experiments and
`amlm verify` name when a run was trained with other settings than it should have been.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

UNSET = "(unset)"  # a key one side does not hold


@dataclass(frozen=True)
class Difference:
    """The first of the keys whose values differ, both values, and how many keys differ after it."""

    key: str
    mine: object  # the value on the first side, UNSET where it lacks the key
    theirs: object  # the value on the other side, UNSET where it lacks the key
    more: int  # further keys that differ

    def and_more(self, what: str = "") -> str:
        """' (and N more)' (with `what` after N: ' (and 2 more settings differ)'), or '' when N is 0."""
        return f" (and {self.more} more{' ' + what if what else ''})" if self.more else ""


def differing_keys(mine: Mapping, theirs: Mapping, ignore: Iterable[str] = (), first: Iterable[str] = ()) -> list[str]:
    """The keys either side holds whose values differ (a key one side lacks differs, unless the other
    holds None), less `ignore`, in sorted order with the keys of `first` before the others."""
    first, skip = set(first), set(ignore)
    keys = (k for k in set(mine) | set(theirs) if k not in skip and mine.get(k) != theirs.get(k))
    return sorted(keys, key=lambda k: (k not in first, k))


def first_difference(
    mine: Mapping, theirs: Mapping, ignore: Iterable[str] = (), first: Iterable[str] = ()
) -> Difference | None:
    """The first of `differing_keys` with both values, or None when the settings agree."""
    keys = differing_keys(mine, theirs, ignore, first)
    if not keys:
        return None
    k = keys[0]
    return Difference(k, mine.get(k, UNSET), theirs.get(k, UNSET), len(keys) - 1)
