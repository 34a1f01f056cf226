"""Windowed max/average session duration, the paper's second group-by (section 2.4).

Input: session records ``(app, src, duration, ts_end)`` from
``SessionReconstruction``. Per ``(app, src)`` it keeps the durations whose
``ts_end`` lies in ``(newest - window, newest]``, where ``newest`` is the
largest ``ts_end`` seen for that key: event time, never wall-clock
(DESIGN 4.8). Every input is an update; on every ``emit_every``-th update
of a key it emits ``(app, src, max_duration, avg_duration, newest)``.

With ``idle_ttl``, a key whose newest ``ts_end`` is more than ``idle_ttl``
behind the largest ``ts_end`` seen by the operator is dropped (``flux.expiry``):
its window closed long ago; a later record of that key starts afresh (its
update count too).

``avg_duration`` is ``sum(durations) / len(durations)`` over the window in
``ts_end`` order: for int durations the sum is exact and the division
correctly rounded, so every replica computes the same float.
"""
from __future__ import annotations

import bisect
from typing import Any, Optional, Sequence

from flux.expiry import Expiry
from flux.keyed_state import KeyedOperator, KeyedState

#: Default window in event-time units (the workload's ts advance ~3 per packet).
DEFAULT_WINDOW = 500_000


def stats_key(record: Sequence[Any]) -> tuple:
    """The partition and group key of a session record: ``(app, src)``."""
    return (record[0], record[1])


def _stats_value(value: Sequence[Any]) -> tuple:
    """A key's value as ``process`` keeps it, from its msgpack form (lists for tuples)."""
    if len(value) == 2:  # the expiry's watermark (flux.expiry)
        return tuple(value)
    newest, updates, entries = value
    return (newest, updates, tuple((t, d) for t, d in entries))


_PAST_EVERY_DURATION = float("inf")


class WindowedDurationStats(KeyedOperator):
    """Per ``(app, src)``: max and average duration over an event-time window.

    The state is ``self.state``, a ``KeyedState`` whose value per key is the
    immutable ``(newest, updates, entries)``, ``entries`` the window's sorted
    ``(ts_end, duration)`` pairs; each update replaces it.
    """

    def __init__(self, window: int = DEFAULT_WINDOW, emit_every: int = 2,
                 idle_ttl: Optional[int] = None):
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        if emit_every < 1:
            raise ValueError(f"emit_every must be >= 1, got {emit_every}")
        self.window = window
        self.emit_every = emit_every
        self.state = KeyedState(decode=_stats_value)
        self.expiry = (Expiry(self.state, idle_ttl, _newest_of)
                       if idle_ttl is not None else None)

    def process(self, record: Sequence[Any]) -> list:
        app, src, duration, ts_end = record[0], record[1], record[2], record[3]
        key = (app, src)
        expiry = self.expiry
        if expiry is not None:
            expiry.advance(ts_end)
        value = self.state.get(key)
        if value is not None and expiry is not None and expiry.expired(value[0]):
            value = None  # idle too long, not yet swept: start afresh
        if value is None:
            newest, updates, entries = ts_end, 1, ((ts_end, duration),)
        else:
            newest, updates, entries = value
            newest = max(newest, ts_end)
            updates += 1
            entry = (ts_end, duration)
            if not entries or entry >= entries[-1]:  # the common case: event time moves forward
                entries = entries + (entry,)
            else:
                at = bisect.bisect_right(entries, entry)
                entries = entries[:at] + (entry,) + entries[at:]
            # Drop what fell out of (newest - window, newest]; the newest entry always stays.
            cut = bisect.bisect_right(entries, (newest - self.window, _PAST_EVERY_DURATION))
            if cut:
                entries = entries[cut:]
        self.state[key] = (newest, updates, entries)
        if updates % self.emit_every:
            return []
        durations = [d for _, d in entries]
        return [(app, src, max(durations), sum(durations) / len(durations), newest)]


def _newest_of(key: Any, value: Sequence[Any]) -> Any:
    """A key's event time: the newest ``ts_end`` it has seen."""
    return value[0]
