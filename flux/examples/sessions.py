"""Session reconstruction, the paper's first group-by (section 2.4).

Input: packet records ``(src, dst, app, kind, ts)`` with ``kind`` "start"
or "end" and ``ts`` the event time (an int). Records may arrive as lists
after msgpack, so they are indexed, never type-tested.

Output: on the "end" of an open session, ``(app, src, duration, ts_end)``
with ``duration = ts_end - ts_start`` and ``app`` taken from the "start".
The paper's output is ``(app, src, dur)``; ``ts_end`` is added so the next
group-by can window on event time (DESIGN 4.8).

With ``ttl``, a session whose start is more than ``ttl`` (event time) behind
the largest ``ts`` seen has expired: its "end" emits nothing, and it is dropped
from the state (``flux.expiry``), so sessions that never end do not pile up on
an endless feed.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from flux.expiry import Expiry
from flux.keyed_state import KeyedOperator, KeyedState


def session_key(packet: Sequence[Any]) -> tuple:
    """The partition and group key of a packet: ``(src, dst)``."""
    return (packet[0], packet[1])


class SessionReconstruction(KeyedOperator):
    """Per ``(src, dst)``: the open session's ``(app, ts_start)``.

    A second "start" on an open session restarts it; an "end" without an
    open session emits nothing. The open sessions live in ``self.state``, a
    ``KeyedState``; ``get_state()`` gives sorted ``[[src, dst], [app, ts_start]]``
    pairs.
    """

    def __init__(self, ttl: Optional[int] = None) -> None:
        """``ttl``: event-time units after which an open session expires (None: never)."""
        self.state = KeyedState(decode=tuple)
        self.expiry = Expiry(self.state, ttl, _start_of) if ttl is not None else None

    @property
    def open(self) -> KeyedState:
        """The open sessions (the name this state had before it was a ``KeyedState``)."""
        return self.state

    def process(self, packet: Sequence[Any]) -> list:
        src, dst, app, kind, ts = packet
        key = (src, dst)
        expiry = self.expiry
        if expiry is not None:
            expiry.advance(ts)
        if kind == "start":
            self.state[key] = (app, ts)
            return []
        if kind == "end":
            session = self.state.pop(key, None)
            if session is None:
                return []
            start_app, ts_start = session
            if expiry is not None and expiry.expired(ts_start):
                return []  # expired, not yet swept
            return [(start_app, src, ts - ts_start, ts)]
        raise ValueError(f"packet kind must be 'start' or 'end', got {kind!r}")


def _start_of(key: Any, session: Sequence[Any]) -> Any:
    """An open session's event time: its start."""
    return session[1]
