"""Event-time expiry of keyed state: keys that event time left behind go.

An endless feed brings keys that are never seen again (a session whose end is
lost, a user who left); an operator that keeps them grows without bound. An
``Expiry`` keeps a *watermark*, the largest event time its operator has seen,
and drops the keys whose own event time fell more than ``ttl`` behind it.

Time comes only from the records (DESIGN 4.8): two replicas fed the same
records expire the same keys at the same record. The watermark lives in the
``KeyedState`` itself, under ``WATERMARK_KEY``, so it moves with the state
when a replica is rebuilt (the bulk parts and the delta of a catch-up, or a
whole snapshot): the new replica goes on expiring exactly as its twin.

Cost: a sweep scans every key once the watermark has advanced by half the ttl
since the last one; so each key is looked at about twice per ``ttl`` of event
time, however many records arrive, and between sweeps a record costs one
comparison. A key is dropped at most ``ttl / 2`` after it expired; an operator
that must not act on an expired key before the sweep asks ``expired(ts)``.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from flux.keyed_state import KeyedState
from flux.keys import EXPIRY_WATERMARK

#: the key under which the watermark and the last sweep are kept: a 1-tuple, so it
#: never equals a user's key of 2 or more fields, and -inf sorts before any number
WATERMARK_KEY = EXPIRY_WATERMARK


class Expiry:
    """Drops the keys of ``state`` whose event time (``time_of(key, value)``) is more
    than ``ttl`` behind the largest event time passed to ``advance``."""

    def __init__(self, state: KeyedState, ttl: int,
                 time_of: Callable[[Any, Any], Any]):
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0 (event-time units), got {ttl!r}")
        self.state, self.ttl, self.time_of = state, ttl, time_of
        self.sweep_every = ttl / 2

    @property
    def watermark(self) -> Optional[Any]:
        """The largest event time seen (None before the first)."""
        kept = self.state.get(WATERMARK_KEY)
        return None if kept is None else kept[0]

    def advance(self, ts: Any) -> int:
        """A record of event time ``ts`` arrived: move the watermark and sweep when it has
        moved by half the ttl since the last sweep. Returns the keys dropped."""
        kept = self.state.get(WATERMARK_KEY)
        if kept is None:
            self.state[WATERMARK_KEY] = (ts, ts)
            return 0
        watermark, swept = kept
        if not ts > watermark:
            return 0
        if ts - swept < self.sweep_every:
            self.state[WATERMARK_KEY] = (ts, swept)
            return 0
        self.state[WATERMARK_KEY] = (ts, ts)
        horizon, time_of = ts - self.ttl, self.time_of
        return self.state.expire(
            lambda key, value: key != WATERMARK_KEY and time_of(key, value) < horizon)

    def expired(self, ts: Any) -> bool:
        """Is event time ``ts`` more than ``ttl`` behind the watermark?"""
        watermark = self.watermark
        return watermark is not None and ts < watermark - self.ttl

    def keys(self) -> int:
        """How many keys the state holds, the watermark's own not counted."""
        return len(self.state) - (WATERMARK_KEY in self.state)
