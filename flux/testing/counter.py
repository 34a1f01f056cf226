"""A keyed running counter whose outputs expose its state.

Built for testing: every output carries the key's count, so any input that
is lost, duplicated or reordered on the way to this operator changes the
output sequence, and the oracle of DESIGN 8 sees it.
"""
from __future__ import annotations

from typing import Any, Sequence

from flux.keyed_state import KeyedOperator, KeyedState, tuplify


def first_field(record: Sequence[Any]) -> Any:
    """The key of a ``(key, payload, ...)`` record."""
    return record[0]


def key_and_count(record: Sequence[Any]) -> tuple:
    """``(key, count)`` of a counter output: spreads one key over many partitions."""
    return (record[0], record[1])


class KeyedCounter(KeyedOperator):
    """For input ``r``: ``count[r[0]] += 1``, emit ``(r[0], count, r[1])``.

    When ``fanout_every > 0`` and the new count is a multiple of it, also
    emit ``(r[0], -count, r[1])`` (a one-to-many step, so SNs with k = 2
    occur). The counts live in ``self.state``, a ``KeyedState``;
    ``get_state()`` gives sorted ``[key, count]`` pairs.
    """

    def __init__(self, fanout_every: int = 0, regroup: int = 0):
        """``regroup`` > 0: the outputs' first field is ``(key, count % regroup)``, so a
        next stage keyed by it spreads one key over ``regroup`` keys of its own."""
        if fanout_every < 0 or regroup < 0:
            raise ValueError(f"fanout_every and regroup must be >= 0, got {fanout_every}, "
                             f"{regroup}")
        self.fanout_every, self.regroup = fanout_every, regroup
        self.state = KeyedState()

    def process(self, record: Sequence[Any]) -> list:
        key = tuplify(record[0])
        state = self.state
        count = state[key] = state.get(key, 0) + 1
        name = (key, count % self.regroup) if self.regroup else key
        out = [(name, count, record[1])]
        if self.fanout_every and count % self.fanout_every == 0:
            out.append((name, -count, record[1]))
        return out
