"""Every key's event-time timers in expiry order, beside the ``KeyedState`` that holds
them: the store is the truth (each key's timers go with its state through a catch-up and
a checkpoint), the index only finds the due ones without a scan of every key.

What fires, and in what order, is a function of the store alone: due timers in
(expiry, key order), so a replica whose index was rebuilt from a moved state fires
exactly what its twin fires (DESIGN 4.1). Pure: no I/O, no clock.
"""
from __future__ import annotations

import heapq
from typing import Any, Callable, List, Tuple

from flux.keyed_state import KeyedState
from flux.keys import sorted_keys


class TimerIndex:
    def __init__(self, timers_of: Callable[[Any, Any], Tuple[int, ...]]):
        #: (key, stored value) -> that key's timers (empty for entries that hold none)
        self._timers_of = timers_of
        self._heap: List[tuple] = []
        self._seq = 0
        self._installs = -1  # the store's ``installs`` this index was built at

    def follow(self, store: KeyedState) -> None:
        """Rebuild from ``store`` if state came into it from elsewhere since the last call
        (a restore, a catch-up's parts and delta)."""
        if store.installs == self._installs:
            return
        self._heap, self._installs = [], store.installs
        for key, value in store.items():
            for expiry in self._timers_of(key, value):
                self.add(key, expiry)

    def add(self, key: Any, expiry: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (expiry, self._seq, key))

    def pop_due(self, watermark: int, store: KeyedState) -> List[Tuple[int, Any]]:
        """The timers at or below ``watermark`` still set in ``store``, in (expiry, key
        order), taken out of the index (deleted timers were left in it: dropped here)."""
        heap, due = self._heap, {}
        while heap and heap[0][0] <= watermark:
            expiry, _, key = heapq.heappop(heap)
            if expiry in self._timers_of(key, store.get(key)):
                due.setdefault(expiry, set()).add(key)
        return [(expiry, key) for expiry in sorted(due) for key in sorted_keys(due[expiry])]
