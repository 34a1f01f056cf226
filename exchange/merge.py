"""Order-preserving merge of producer streams by SN (paper 4.1, DESIGN 4.3).

Each producer partition's stream arrives in SN order. The merge releases the
smallest head only once every *other* producer has proved that nothing
smaller can still come: either its own head is larger, or its progress bound
covers the head. Bounds let an idle producer keep the merge moving.

Every SN that arrives must be larger than the last one from that producer:
a repeated or out-of-order SN is a broken protocol (a duplicate the buffers
failed to filter), so it raises instead of being silently dropped.

A consumer asks for its frontier and whether it may release at every step it could
take, far more often than the merge changes: both answers are kept until the next
push, bound or release (``check_invariants`` compares them with asking anew).
"""
from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heapreplace
from typing import Deque, Dict, Hashable, Iterable, List, Optional, Tuple

from flux.data_messages import Item
from flux.errors import RemoteProtocolError
from flux.sequence import INF, NO_PROGRESS, NO_SN, SN, before, bound_key, covers, strongest

#: an answer the merge has not kept: to be asked again
UNKNOWN = object()


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
            last = sn
        self.queues[producer].extend(items)
        self.last[producer] = last
        self._changed()
        if bound is not None:
            self.bound(producer, bound)
        return last

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
        """True when the smallest head may be released."""
        return self._releasable() is not None

    def _releasable(self) -> Optional[Hashable]:
        if self._releasable_now is UNKNOWN:
            self._releasable_now = self._find_releasable()
        return self._releasable_now

    def _find_releasable(self) -> Optional[Hashable]:
        head = self.head()
        if head is None:
            return None
        producer, sn = head
        for other, queue in self.queues.items():
            if not queue and not covers(self._idle_bound(other), sn):
                return None
        return producer

    def pop(self) -> Item:
        return self.pop_from()[1]

    def pop_from(self) -> Tuple[Hashable, Item]:
        """The next tuple in SN order, with the producer it came from."""
        producer = self._releasable()
        if producer is None:
            raise LookupError("no tuple can be released yet")
        self._changed()
        return producer, self.queues[producer].popleft()

    def pop_ready(self) -> List[Item]:
        """Release everything that can be released now."""
        return [item for _, item in self.pop_ready_from()]

    def pop_ready_from(self, limit: Optional[int] = None) -> List[Tuple[Hashable, Item]]:
        """Release everything that can be released now (at most ``limit`` tuples), each
        with its producer.

        By runs over a heap of the queues' heads: the smallest head may go
        while it is below every *empty* producer's bound (another queue's head is larger
        by the heap's order: SNs are unique, DESIGN 4.1), and its producer releases a run
        up to the next head or that bound before the heap is touched again. With inputs
        spread over the producers a run is one or two tuples, so the heap, not a scan of
        every producer per run, is what keeps a release O(log producers) per tuple.
        Releasing tuple by tuple with ``pop_from`` gives the same sequence."""
        out: List[Tuple[Hashable, Item]] = []
        queues = self.queues
        room = float("inf") if limit is None else limit
        heap = []
        below = None  # the smallest SN point an empty producer may still deliver
        for i, (producer, queue) in enumerate(queues.items()):
            if queue:
                heap.append((queue[0][0], i, producer))
            else:
                point = bound_key(self._idle_bound(producer))
                if below is None or point < below:
                    below = point
        heapify(heap)
        append, n = out.append, 0
        while heap and n < room:
            head, i, producer = heap[0]
            if below is not None and not head < below:
                break
            until = below  # this run ends at the next head or at that bound
            if len(heap) > 1:
                other = heap[1][0] if len(heap) == 2 or heap[1] < heap[2] else heap[2][0]
                if until is None or other < until:
                    until = other
            queue = queues[producer]
            while queue and n < room and (until is None or queue[0][0] < until):
                append((producer, queue.popleft()))
                n += 1
            if queue:
                heapreplace(heap, (queue[0][0], i, producer))
            else:  # empty now: what it may still send is bounded by its last SN or bound
                heappop(heap)
                point = bound_key(self._idle_bound(producer))
                if below is None or point < below:
                    below = point
        if out:
            self._changed()
        return out

    def unpop(self, released: List[Tuple[Hashable, Item]]) -> None:
        """Give back tuples just released (the last ``pop_ready_from``'s tail, none
        pushed since): they are the heads of their queues again, in their order."""
        for producer, item in reversed(released):
            self.queues[producer].appendleft(item)
        self._changed()

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

    def to_state(self) -> list:
        """Queues, bounds and last SNs per producer, msgpack-safe (DESIGN 4.6: the drained
        tuples are part of the state, or the new replica would lose them)."""
        return [
            [p, [[list(sn), rec] for sn, rec in q], list(self.bounds[p]), list(self.last[p])]
            for p, q in self.queues.items()
        ]

    def install_state(self, state: list) -> None:
        for p, items, bound, last in state:
            if p not in self.queues:
                raise ValueError(f"state names producer {p!r}, unknown to this merge")
            self.queues[p] = deque((tuple(sn), rec) for sn, rec in items)
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
