"""The producer's buffer of in-flight tuples (paper 3.1.3, DESIGN 4.2).

One buffer serves one consumer partition pair, with two destinations: PRIM
and SEC. With cumulative acks and FIFO connections the paper's explicit marks
collapse into one high-water mark per destination:

- mark PROD on SN ``s``: ``s`` was put (it is in the queue, or was evicted);
- mark ``d`` on SN ``s``: ``s <= hwm[d]``, i.e. destination ``d`` is known to
  hold ``s`` (it acked it, or it was sent on a connection that carries no
  acks). A *dangling* ack is ``hwm[d]`` ahead of the last SN put.

An entry is evicted once it carries every mark in ``delete`` (PROD is always
required, so ``delete`` lists only destinations). The send cursor of ``d``
skips every entry ``d`` already holds: that is the duplicate filter that keeps
a producer from re-sending what a consumer got from the other replica.

Only ``ack`` and ``advance`` move a mark or cursor forward; ``ack_all`` and
``reset`` assign them and may move them back (DESIGN 4.2).

The first unsent SN of each destination is asked at every step a producer may flush
(its bound, DESIGN 4.3): it is kept, and forgotten by every method that moves a mark,
a cursor or the queue (``check_invariants`` compares it with asking anew).
"""
from __future__ import annotations

import enum
from bisect import bisect_right
from typing import Any, Callable, Iterable, List, Optional, Tuple

from flux.data_messages import Item
from flux.errors import LocalProtocolError
from flux.sequence import NO_SN, SN


def _same(payload: Any) -> Any:
    return payload


class Dest(enum.IntEnum):
    """A buffer's two destinations (3.1.3). For F-Prod, PRIM is the consumer replica it
    sends data to and SEC the one it takes acks from (5.1); an index, so an IntEnum."""

    PRIM = 0
    SEC = 1

    @property
    def other(self) -> "Dest":
        return Dest(1 - self)


PRIM = Dest.PRIM
SEC = Dest.SEC
DESTS = (PRIM, SEC)
#: the producer's own mark (3.1.3): not a destination, so not a Dest
PROD = "PROD"
#: a destination's first unsent SN not known: to be asked (``_next_index``) again
UNKNOWN = object()


class BufferMisuse(LocalProtocolError):
    """This machine misused its buffer: a bug here, never a peer's fault."""


class Buffer:
    """A queue of produced tuples with per-destination marks and cursors."""

    _COMPACT_AT = 256

    def __init__(self, capacity: int, delete: Iterable[int] = DESTS):
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.delete = {Dest(d) for d in delete}
        self.last_put: SN = NO_SN
        self.hwm: List[SN] = [NO_SN, NO_SN]
        self.sent: List[SN] = [NO_SN, NO_SN]
        self._sns: List[SN] = []
        self._items: List[Any] = []
        self._head = 0
        #: what ``_evict`` last found: the lowest mark of ``delete`` (an entry at or below
        #: it is evicted), or that ``delete`` is empty (every entry is); ``put`` needs
        #: ``_evict`` only for a tuple already below it (not once per tuple)
        self._low: SN = NO_SN
        self._evict_all = not self.delete
        self._last_take: tuple = (None, ())  # (first SN, last SN, count), the tuples
        #: [d]: ``first_unsent(d)`` as last asked, or UNKNOWN
        self._first: list = [UNKNOWN, UNKNOWN]

    # -- queries ---------------------------------------------------------
    def __len__(self) -> int:
        return len(self._sns) - self._head

    def full(self) -> bool:
        return len(self._sns) - self._head >= self.capacity

    def resize(self, capacity: int) -> None:
        """A new capacity (a paused destination's room, ``Producer``); entries beyond it
        stay, and the buffer is full until they are evicted."""
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity

    def entries(self) -> List[Item]:
        """The buffered (SN, tuple) pairs, oldest first."""
        return list(zip(self._sns[self._head:], self._items[self._head:]))

    def marks(self, sn: SN) -> Optional[frozenset]:
        """The marks on ``sn``, or None once it was evicted (for tests and traces)."""
        dest_marks = {d for d in DESTS if sn <= self.hwm[d]}
        if sn > self.last_put:
            return frozenset(dest_marks)
        i = bisect_right(self._sns, sn, lo=self._head) - 1
        if i >= self._head and self._sns[i] == sn:
            return frozenset(dest_marks | {PROD})
        return None

    def dangling(self, dest: int) -> bool:
        """True when ``dest`` acked SNs that were not put yet."""
        return self.hwm[dest] > self.last_put

    def first_unsent(self, dest: int) -> Optional[SN]:
        first = self._first[dest]
        if first is UNKNOWN:
            i = self._next_index(dest)
            first = self._first[dest] = self._sns[i] if i < len(self._sns) else None
        return first

    def peek(self, dest: int) -> Optional[Item]:
        """The first tuple ``dest`` does not hold and was not sent yet (Figure 3, action 2)."""
        i = self._next_index(dest)
        if i < len(self._sns):
            return self._sns[i], self._items[i]
        return None

    # -- events ----------------------------------------------------------
    def put(self, sn: SN, item: Any) -> None:
        """Insert a produced tuple; it is evicted at once if its marks are complete."""
        if sn <= self.last_put:
            raise BufferMisuse(f"put {sn} after {self.last_put}: SNs must increase")
        self._sns.append(sn)
        self._items.append(item)
        self.last_put = sn
        first = self._first
        if first[0] is None:  # nothing was unsent: this one may be (a dangling ack may
            first[0] = UNKNOWN  # hold it already)
        if first[1] is None:
            first[1] = UNKNOWN
        if self._evict_all or sn <= self._low:  # marked already (dangling acks): evict
            self._evict()

    def advance(self, dest: int) -> SN:
        """Move ``dest``'s cursor past the tuple ``peek(dest)`` returned."""
        i = self._next_index(dest)
        if i >= len(self._sns):
            raise BufferMisuse(f"advance {Dest(dest).name} with nothing to send")
        self.sent[dest] = self._sns[i]
        self._first[dest] = UNKNOWN
        return self.sent[dest]

    def take(self, dest: int, limit: int) -> Tuple[Item, ...]:
        """Up to ``limit`` tuples for ``dest``, advancing its cursor past them. The same
        tuples taken for the other destination come back as the same object (an SN names
        one item for the buffer's life), so a batch sent to both is encoded once."""
        i = self._next_index(dest)
        j = min(len(self._sns), i + limit)
        if j <= i:
            return ()
        self.sent[dest] = self._sns[j - 1]
        self._first[dest] = UNKNOWN
        key = (self._sns[i], self._sns[j - 1], j - i)
        if self._last_take[0] == key:
            return self._last_take[1]
        items = tuple(zip(self._sns[i:j], self._items[i:j]))
        self._last_take = (key, items)
        return items

    def ack(self, sn: SN, dest: int) -> None:
        """``dest`` holds every SN <= ``sn`` (cumulative; never moves the mark back)."""
        if sn > self.hwm[dest]:
            self.hwm[dest] = sn
            self._first[dest] = UNKNOWN
            self._evict()

    def ack_all(self, dest: int) -> None:
        """Take-over: treat everything put as held by ``dest`` and drop its dangling acks."""
        self.hwm[dest] = self.last_put
        self._first[dest] = UNKNOWN
        self._evict()

    def reset(self, dest: int) -> None:
        """Fold-in: give ``dest`` the other destination's marks; its cursor restarts there (3.3.2)."""
        self.hwm[dest] = self.hwm[1 - dest]
        self.sent[dest] = NO_SN
        self._first[dest] = UNKNOWN
        self._evict()

    def rewind(self, dest: int, after: SN = NO_SN) -> None:
        """Restart ``dest``'s cursor right after what it holds, or after ``after`` if that
        is later (reverse assigns, DESIGN 4.2): a sink's writer holds more than it acked."""
        self.sent[dest] = after
        self._first[dest] = UNKNOWN

    def set_delete(self, delete: Iterable[int]) -> None:
        self.delete = {Dest(d) for d in delete}
        self._evict()

    # -- state movement (5.3) ----------------------------------------------
    def to_state(self, encode: Callable[[Any], Any] = _same) -> dict:
        """The buffer as plain, msgpack-safe data (SNs as lists, payloads by ``encode``)."""
        live = slice(self._head, None)
        return {
            "entries": [[list(sn), encode(item)]
                        for sn, item in zip(self._sns[live], self._items[live])],
            "last_put": list(self.last_put),
            "hwm": [list(h) for h in self.hwm],
            "sent": [list(c) for c in self.sent],
            "delete": [int(d) for d in sorted(self.delete)],
        }

    @classmethod
    def from_state(cls, state: dict, capacity: int, reverse: bool = False,
                   decode: Callable[[Any], Any] = _same) -> "Buffer":
        """Rebuild a buffer; ``reverse`` swaps PRIM and SEC, marks and cursors (5.3):
        the new replica's primary consumers are the active replica's secondaries."""
        buf = cls(capacity, ())
        order = (SEC, PRIM) if reverse else (PRIM, SEC)
        buf._sns = [tuple(sn) for sn, _ in state["entries"]]
        buf._items = [decode(item) for _, item in state["entries"]]
        buf.last_put = tuple(state["last_put"])
        buf.hwm = [tuple(state["hwm"][d]) for d in order]
        buf.sent = [tuple(state["sent"][d]) for d in order]
        buf.delete = {Dest(order.index(d)) for d in state["delete"]}
        buf._first = [UNKNOWN, UNKNOWN]
        buf._evict()
        return buf

    # -- internals -------------------------------------------------------
    def _next_index(self, dest: int) -> int:
        floor = max(self.sent[dest], self.hwm[dest])
        return bisect_right(self._sns, floor, lo=self._head)

    def _evict(self) -> None:
        if self.delete:
            low = self._low = min(self.hwm[d] for d in self.delete)
            self._evict_all = False
            new_head = bisect_right(self._sns, low, lo=self._head)
        else:
            self._evict_all = True
            new_head = len(self._sns)
        if new_head == self._head:
            return
        self._first = [UNKNOWN, UNKNOWN]  # it may have been one a destination outside
        # delete had not been sent yet
        self._items[self._head:new_head] = [None] * (new_head - self._head)  # in C
        self._head = new_head
        if self._head >= self._COMPACT_AT and self._head * 2 >= len(self._sns):
            del self._sns[: self._head]
            del self._items[: self._head]
            self._head = 0

    def check_invariants(self) -> None:
        """Raise AssertionError when the buffer's own rules are broken."""
        live = self._sns[self._head:]
        assert len(self._items) == len(self._sns), "items and SNs out of step"
        assert all(a < b for a, b in zip(live, live[1:])), "SNs not strictly increasing"
        if live:
            assert live[-1] == self.last_put, "last entry is not the last SN put"
            if self.delete:
                assert not all(live[0] <= self.hwm[d] for d in self.delete), (
                    "an entry with every mark in delete was not evicted"
                )
        elif self._sns:
            assert self._sns[-1] == self.last_put
        assert self.delete <= set(DESTS), f"unknown destinations in delete: {self.delete}"
        assert all(x is None for x in self._items[: self._head]), "evicted items still referenced"
        for d in DESTS:
            if self._first[d] is not UNKNOWN:
                i = self._next_index(d)
                assert self._first[d] == (self._sns[i] if i < len(self._sns) else None), (
                    f"first unsent of {Dest(d).name} kept as {self._first[d]}, is not")

    def __repr__(self) -> str:
        return (
            f"Buffer(n={len(self)}, last_put={self.last_put}, hwm={self.hwm}, "
            f"sent={self.sent}, delete={sorted(d.name for d in self.delete)})"
        )
