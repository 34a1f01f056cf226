"""Order-preserving merge of producer streams by SN (paper 4.1, DESIGN 4.3, 11).

Each producer partition's stream arrives in SN order. A tuple is a sub-item: its
SN is its item's SN and its producer's partition (docs/design/batches.md). The
merge releases the smallest item whole, once every producer has proved that
nothing more of it can still come: a later SN queued, or a progress bound that
covers the item. Bounds let an idle producer keep the merge moving.

Every SN that arrives must be larger than the last one from that producer:
a repeated or out-of-order SN is a broken protocol (a duplicate the buffers
failed to filter), so it raises instead of being silently dropped.

A consumer asks for its frontier and whether it may release at every step it could
take, far more often than the merge changes: both answers are kept until the next
push, bound or release (``check_invariants`` compares them with asking anew).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, Hashable, Iterable, List, Optional, Tuple

from flux.data_messages import Item
from flux.errors import RemoteProtocolError
from flux.sequence import INF, NO_PROGRESS, NO_SN, SN, before, strongest

#: an answer the merge has not kept: to be asked again
UNKNOWN = object()

#: the bound of a dormant producer: past every SN
DORMANT: SN = (INF,)


def _same(payload: Any) -> Any:
    return payload


class OrderedMerge:
    """Merge of one queue per producer partition, released in global SN order."""

    def __init__(self, producers: Iterable[Hashable]):
        self.queues: Dict[Hashable, Deque[Item]] = {p: deque() for p in producers}
        if not self.queues:
            raise ValueError("a merge needs at least one producer")
        self.bounds: Dict[Hashable, SN] = {p: NO_PROGRESS for p in self.queues}
        self.last: Dict[Hashable, SN] = {p: NO_SN for p in self.queues}
        #: ``frontier()`` and ``_releasable()`` as last asked, or UNKNOWN: forgotten by
        #: every method that changes a queue, a bound or a last SN
        self._frontier = self._releasable_now = UNKNOWN

    def _changed(self) -> None:
        """A queue, a bound or a last SN changed: the kept answers are asked anew."""
        self._frontier = self._releasable_now = UNKNOWN

    def push(self, producer: Hashable, items: Iterable[Item], bound: Optional[SN] = None) -> SN:
        """Append a batch from ``producer``; returns the last SN received from it."""
        last = self.last[producer]
        for item in items:  # check the whole batch first: a rejected batch changes nothing
            sn = item[0]
            if sn <= last:
                raise RemoteProtocolError(
                    f"SN {sn} from producer {producer} after {last}: duplicate or out of order"
                )
            if last and sn[:-1] == last[:-1]:  # one sub-item per item (DESIGN 11)
                raise RemoteProtocolError(
                    f"SN {sn} from producer {producer} after {last}: two parts of one item")
            last = sn
        self.queues[producer].extend(items)
        self.last[producer] = last
        self._changed()
        if bound is not None:
            self.bound(producer, bound)
        return last

    def resume_after(self, producer: Hashable, sn: SN) -> None:
        """A fresh merge takes ``producer``'s stream from after ``sn`` (a sink's writer
        started again from what its sink committed: docs/design/parallel_io.md)."""
        if self.queues[producer] or self.last[producer] > sn:
            raise ValueError(f"resume {producer} after {sn}: it sent {self.last[producer]}")
        self.last[producer] = sn
        self._changed()

    def sleep(self, producer: Hashable) -> None:
        """``producer`` is a dormant partition (docs/design/rescaling.md): it sends nothing,
        and nothing waits for its bound."""
        if self.queues[producer]:
            raise ValueError(f"producer {producer} has items queued: it cannot be dormant")
        self.bounds[producer] = DORMANT
        self._changed()

    def leave(self, producer: Hashable) -> None:
        """``producer`` left (a live rescale to fewer pairs, docs/design/rescaling.md):
        everything it will ever send is here, queued or released, so nothing waits for its
        bound; what is queued is still released in order."""
        self.bounds[producer] = DORMANT
        self._changed()

    def rejoin(self, producer: Hashable) -> None:
        """A dormant ``producer`` joined: its bound is none again (the one place a bound
        moves back: what it will send lies above everything released while it slept,
        the rule of a joining pair, docs/design/rescaling.md)."""
        if self.bounds[producer] == DORMANT:
            self.bounds[producer] = NO_PROGRESS
            self._changed()

    def bound(self, producer: Hashable, bound: SN) -> None:
        """Record a progress bound; a bound never moves back (DESIGN 4.3)."""
        self.bounds[producer] = strongest(self.bounds[producer], bound)
        self._changed()

    def _idle_bound(self, producer: Hashable) -> SN:
        # Every SN on one connection has the same length, so the last SN
        # received is itself a bound for a producer with an empty queue.
        return strongest(self.bounds[producer], self.last[producer] or NO_PROGRESS)

    def head(self) -> Optional[Tuple[Hashable, SN]]:
        """The producer holding the smallest queued SN, with that SN."""
        best = None
        for producer, queue in self.queues.items():
            if queue and (best is None or queue[0][0] < best[1]):
                best = (producer, queue[0][0])
        return best

    def ready(self) -> bool:
        """True when the smallest queued item may be released whole."""
        return self._releasable() is not None

    def _releasable(self) -> Optional[SN]:
        if self._releasable_now is UNKNOWN:
            self._releasable_now = self._find_releasable()
        return self._releasable_now

    def _find_releasable(self) -> Optional[SN]:
        """The item of the smallest head, once every producer has proved it sends nothing
        more of it: a later SN queued, or a bound covering the item (DESIGN 11)."""
        head = self.head()
        if head is None:
            return None
        item = head[1][:-1]
        point = item + (INF,)  # bound_key(item)
        for producer, queue in self.queues.items():
            if queue and queue[-1][0] > point:
                continue
            if self._idle_bound(producer) + (INF,) < point:
                return None
        return item

    def pop_item(self) -> List[Tuple[Hashable, Item]]:
        """The sub-items of the smallest item, in SN order, each with its producer: the
        connection SN of a sub-item is its item's SN and its producer's partition, so
        every producer holding a part of the item holds it at the head of its queue."""
        item = self._releasable()
        if item is None:
            raise LookupError("no item can be released yet")
        width = len(item)
        out = [(producer, queue.popleft()) for producer, queue in self.queues.items()
               if queue and queue[0][0][:width] == item]
        out.sort(key=lambda pair: pair[1][0])
        self._changed()
        return out

    def frontier(self) -> SN:
        """A bound on every SN the merge will still release (DESIGN 4.3)."""
        if self._frontier is UNKNOWN:
            self._frontier = self._find_frontier()
        return self._frontier

    def _find_frontier(self) -> SN:
        low = low_key = None
        for producer, queue in self.queues.items():
            bound = before(queue[0][0]) if queue else self._idle_bound(producer)
            key = bound + (INF,)  # bound_key, inline: this runs at every change
            if low_key is None or key < low_key:
                low, low_key = bound, key
        return low

    def to_state(self, encode: Callable[[Any], Any] = _same) -> list:
        """Queues, bounds and last SNs per producer, msgpack-safe with ``encode`` of each
        payload (DESIGN 4.6: the drained tuples are part of the state, or the new replica
        would lose them)."""
        return [
            [p, [[list(sn), encode(rec)] for sn, rec in q], list(self.bounds[p]),
             list(self.last[p])]
            for p, q in self.queues.items()
        ]

    def install_state(self, state: list, decode: Callable[[Any], Any] = _same) -> None:
        for p, items, bound, last in state:
            if p not in self.queues:
                raise ValueError(f"state names producer {p!r}, unknown to this merge")
            self.queues[p] = deque((tuple(sn), decode(rec)) for sn, rec in items)
            self.bounds[p] = tuple(bound)
            self.last[p] = tuple(last)
        self._changed()

    def check_invariants(self) -> None:
        """What the merge kept is what asking anew gives."""
        if self._frontier is not UNKNOWN:
            assert self._frontier == self._find_frontier(), (
                f"frontier kept as {self._frontier}, is {self._find_frontier()}")
        if self._releasable_now is not UNKNOWN:
            assert self._releasable_now == self._find_releasable(), (
                f"releasable kept as {self._releasable_now!r}, is {self._find_releasable()!r}")

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def queued_from(self, producer: Hashable) -> int:
        return len(self.queues[producer])

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{p}: n={len(q)} last={self.last[p]} bound={self.bounds[p]}"
            for p, q in self.queues.items()
        )
        return f"OrderedMerge({parts})"
