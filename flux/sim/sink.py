"""The simulated sink: what it holds and what it committed, per sink partition.

With ordered output there is one partition (0). With an egress per last-stage
partition (docs/design/parallel_io.md) each partition's sink holds that partition's
outputs in SN order, commits by itself at the cuts, and after a restart drops what
it had not committed and every replayed output at or below its last committed SN
(``CommitsBySN``, DESIGN 10). ``arrivals`` is everything held, in the order it came,
the list the oracle and the results count.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence


class SimSink:
    def __init__(self, arrivals: List[Any]):
        self.arrivals = arrivals  # every output held, in arrival order (outcome.delivered)
        self.parts: List[int] = []  # the partition of each arrival
        self.held: Dict[int, List[Any]] = {}  # partition -> its outputs, in SN order
        self.committed: Dict[int, int] = {}  # partition -> how many of them are committed
        self.drops = 0  # how many times it dropped what it had not committed

    def deliver(self, partition: int, items: Sequence[Any]) -> None:
        held = self.held.setdefault(partition, [])
        done = self.committed.get(partition, 0)
        floor = held[done - 1][0] if done else None
        kept = [item for item in items if floor is None or item[0] > floor]
        held.extend(kept)
        self.arrivals.extend(kept)
        self.parts.extend([partition] * len(kept))

    def commit(self, partition: Optional[int] = None) -> None:
        """Partition ``partition`` (None: every one) commits everything it holds, and
        with it (atomically) its last output's SN, all a new writer reads back."""
        for p in (self.held if partition is None else [partition]):
            self.committed[p] = len(self.held.get(p, ()))

    def abort(self, partition: int) -> None:
        """A new writer fenced the old one: what it had not committed is gone."""
        done = self.committed.get(partition, 0)
        held = self.held.get(partition, [])
        if len(held) == done:
            return
        drop = len(held) - done
        self.drops += 1
        del held[done:]
        keep = []
        for item, p in zip(reversed(self.arrivals), reversed(self.parts)):
            if p == partition and drop:
                drop -= 1
                continue
            keep.append((item, p))
        keep.reverse()
        self.arrivals[:] = [item for item, _ in keep]
        self.parts = [p for _, p in keep]

    def last_committed(self, partition: int) -> Optional[Any]:
        done = self.committed.get(partition, 0)
        return self.held[partition][done - 1][0] if done else None

    def holds(self, partition: int) -> int:
        return len(self.held.get(partition, ()))

    @property
    def total_committed(self) -> int:
        return sum(self.committed.values())

    def uncommitted(self) -> bool:
        return any(len(h) > self.committed.get(p, 0) for p, h in self.held.items())

    def drop_uncommitted(self) -> None:
        """A restart: each partition keeps what it committed, in arrival order."""
        self.drops += 1
        seen: Dict[int, int] = {}
        kept, parts = [], []
        for item, p in zip(self.arrivals, self.parts):
            seen[p] = seen.get(p, 0) + 1
            if seen[p] <= self.committed.get(p, 0):
                kept.append(item)
                parts.append(p)
        self.arrivals[:] = kept
        self.parts = parts
        for p, h in self.held.items():
            del h[self.committed.get(p, 0):]
