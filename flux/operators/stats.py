"""Windowed max/average session duration, the paper's second group-by (section 2.4).

Input: session records ``(app, src, duration, ts_end)`` from
``SessionReconstruction``. Per ``(app, src)`` it keeps the durations whose
``ts_end`` lies in ``(newest - window, newest]``, where ``newest`` is the
largest ``ts_end`` seen for that key: event time, never wall-clock
(DESIGN 4.8). Every input is an update; on every ``emit_every``-th update
of a key it emits ``(app, src, max_duration, avg_duration, newest)``.

``avg_duration`` is ``sum(durations) / len(durations)`` over the window in
``ts_end`` order: for int durations the sum is exact and the division
correctly rounded, so every replica computes the same float.
"""
from __future__ import annotations

import bisect
from typing import Any, Sequence

from flux.operator import keyed_state, keyed_table

#: Default window in event-time units (the workload's ts advance ~3 per packet).
DEFAULT_WINDOW = 500_000


def stats_key(record: Sequence[Any]) -> tuple:
    """The partition and group key of a session record: ``(app, src)``."""
    return (record[0], record[1])


class _KeyStats:
    """One key's window: ``entries`` sorted ``(ts_end, duration)``."""

    __slots__ = ("newest", "updates", "entries")

    def __init__(self, newest: Any, updates: int, entries: list):
        self.newest = newest
        self.updates = updates
        self.entries = entries


class WindowedDurationStats:
    """Per ``(app, src)``: max and average duration over an event-time window."""

    def __init__(self, window: int = DEFAULT_WINDOW, emit_every: int = 2):
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        if emit_every < 1:
            raise ValueError(f"emit_every must be >= 1, got {emit_every}")
        self.window = window
        self.emit_every = emit_every
        self.keys: dict[tuple, _KeyStats] = {}

    def process(self, record: Sequence[Any]) -> list:
        app, src, duration, ts_end = record[0], record[1], record[2], record[3]
        key = (app, src)
        stats = self.keys.get(key)
        if stats is None:
            stats = self.keys[key] = _KeyStats(ts_end, 0, [])
        stats.newest = max(stats.newest, ts_end)
        stats.updates += 1
        bisect.insort(stats.entries, (ts_end, duration))
        # Drop what fell out of (newest - window, newest]; the newest entry always stays.
        cut = bisect.bisect_right(stats.entries, (stats.newest - self.window, float("inf")))
        del stats.entries[:cut]
        if stats.updates % self.emit_every:
            return []
        durations = [d for _, d in stats.entries]
        return [(app, src, max(durations), sum(durations) / len(durations), stats.newest)]

    def get_state(self) -> list:
        """Sorted ``[[app, src], [newest, updates, [[ts_end, duration], ...]]]`` pairs."""
        return keyed_state(
            {
                key: [s.newest, s.updates, [[t, d] for t, d in s.entries]]
                for key, s in self.keys.items()
            }
        )

    def install_state(self, state: list | None) -> None:
        self.keys = {
            key: _KeyStats(newest, updates, [(t, d) for t, d in entries])
            for key, (newest, updates, entries) in keyed_table(state).items()
        }
