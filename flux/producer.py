"""The abstract producer of Figure 3, over many consumer partition pairs (5.1).

For every consumer partition ``i`` a producer keeps one ``Buffer`` with two
destinations (PRIM, SEC), a connection mode per destination
(``conn[i][d]``, a subset of {SEND, ACK}) and a status per destination
(``status[i][d]``). The ingress and F-Prod differ only in how these are set
and in their take-over events, so both build on this class.

Actions (Figure 3):
1. ``put``: a produced tuple enters the buffer of its consumer partition.
2. ``flush``: send the next tuples to an ACTIVE destination with SEND;
   2a. on a connection without ACK, sending marks the tuples as held.
3. ``on_ack``: a cumulative ack from an ACTIVE destination with ACK.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from flux.addresses import Addr
from flux.buffer import DESTS, PRIM, SEC, Buffer
from flux.control_messages import FoldedIn
from flux.data_messages import Ack, Batch, CSync, Pause, PauseAck, PSync
from flux.effects import Send
from flux.errors import ProtocolError
from flux.sequence import NO_PROGRESS, SN, before, bound_key, weakest

SEND = "SEND"
ACK = "ACK"

ACTIVE = "ACTIVE"
DEAD = "DEAD"
STDBY = "STDBY"

BufferFactory = Callable[[int], Buffer]


class Producer:
    """Buffers, cursors and connection modes toward every consumer partition pair."""

    def __init__(
        self,
        addr: Addr,
        peers: Sequence[Tuple[Addr, Addr]],
        capacity: int,
        batch_size: int,
        buffer_factory: BufferFactory = Buffer,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.addr = addr
        #: peers[i][d]: the address of destination d of consumer partition i.
        self.peers: List[Tuple[Addr, Addr]] = [tuple(p) for p in peers]
        self.batch_size = batch_size
        self.buffers: List[Buffer] = [buffer_factory(capacity) for _ in self.peers]
        self.conn: List[List[Set[str]]] = [[set(), set()] for _ in self.peers]
        self.status: List[List[str]] = [[ACTIVE, ACTIVE] for _ in self.peers]
        self.sent_bound: List[List[SN]] = [[NO_PROGRESS, NO_PROGRESS] for _ in self.peers]
        #: the connection modes of the normal case, restored at fold-in
        self.normal_conn: List[Set[str]] = [set(), set()]
        #: catch-up: paused connections (5.3.1), sync versions seen, versions expected
        self.paused: List[List[bool]] = [[False, False] for _ in self.peers]
        self.ver: List[List[int]] = [[0, 0] for _ in self.peers]
        self.expected: List[List[int]] = [[0, 0] for _ in self.peers]
        self._where: Dict[Addr, List[Tuple[int, int]]] = {}
        for i, pair in enumerate(self.peers):
            for d in DESTS:
                self._where.setdefault(pair[d], []).append((i, d))

    # -- queries ---------------------------------------------------------
    def full(self) -> bool:
        """Figure 3 action 1's guard, over every destination buffer."""
        return any(b.full() for b in self.buffers)

    def locate(self, src: Addr, want: str) -> Tuple[int, int]:
        """The (partition, destination) whose connection from ``src`` has mode ``want``."""
        for i, d in self._where.get(src, ()):
            if self.status[i][d] == ACTIVE and want in self.conn[i][d]:
                return i, d
        raise ProtocolError(f"{self.addr}: no ACTIVE {want} connection with {src}")

    def bound_for(self, i: int, d: int, frontier: SN) -> SN:
        """What destination d of partition i may be told about future SNs (DESIGN 4.3)."""
        first = self.buffers[i].first_unsent(d)
        return frontier if first is None else weakest((before(first), frontier))

    def can_flush(self, i: int, d: int, frontier: SN) -> bool:
        if self.status[i][d] != ACTIVE or SEND not in self.conn[i][d] or self.paused[i][d]:
            return False
        if self.buffers[i].first_unsent(d) is not None:
            return True
        return bound_key(self.bound_for(i, d, frontier)) > bound_key(self.sent_bound[i][d])

    def flushable(self, frontier: SN) -> List[Tuple[int, int]]:
        return [
            (i, d)
            for i in range(len(self.peers))
            for d in DESTS
            if self.can_flush(i, d, frontier)
        ]

    # -- actions ---------------------------------------------------------
    def put(self, i: int, sn: SN, item) -> None:
        """Action 1: a produced tuple for consumer partition i."""
        self.buffers[i].put(sn, item)

    def flush(self, i: int, d: int, frontier: SN) -> Optional[Send]:
        """Action 2 (and 2a): the next batch for destination d, with a progress bound."""
        if not self.can_flush(i, d, frontier):
            return None
        buffer = self.buffers[i]
        items = buffer.take(d, self.batch_size)
        if items and ACK not in self.conn[i][d]:
            buffer.ack(items[-1][0], d)  # 2a: no acks on this connection
        bound = self.bound_for(i, d, frontier)
        if bound_key(bound) > bound_key(self.sent_bound[i][d]):
            self.sent_bound[i][d] = bound
        else:
            bound = self.sent_bound[i][d]
        return Send(self.addr, self.peers[i][d], Batch(tuple(items), bound))

    def on_ack(self, src: Addr, msg: Ack) -> None:
        """Action 3: a cumulative ack from an ACTIVE destination with ACK."""
        i, d = self.locate(src, ACK)
        self.buffers[i].ack(msg.hwm, d)

    def fail_destination(self, i: int, d: int) -> None:
        """Figure 4 action 3: forget a dead consumer replica and stop waiting for it."""
        self.status[i][d] = DEAD
        self.conn[i][d] = set()
        self.paused[i][d] = False
        buffer = self.buffers[i]
        buffer.ack_all(d)
        buffer.set_delete(buffer.delete - {d})

    def fail_addresses(self, dead: Set[Addr]) -> List[Tuple[int, int]]:
        """Apply ``fail()`` for every destination in ``dead``; returns those that changed."""
        changed = []
        for addr in dead:
            for i, d in self._where.get(addr, ()):
                if self.status[i][d] != DEAD:
                    self.fail_destination(i, d)
                    changed.append((i, d))
        return changed

    # -- catch-up (3.3, 5.3) ------------------------------------------------
    def on_avail(self, addr: Addr, version: int, only_if_dead: bool = False) -> None:
        """Figure 5 avail(dest): a standby will replace this dead consumer replica."""
        for i, d in self._where.get(addr, ()):
            if only_if_dead and self.status[i][d] != DEAD:
                continue
            if self.status[i][d] != DEAD:
                raise ProtocolError(f"{self.addr}: avail for {addr}, which is {self.status[i][d]}")
            self.status[i][d] = STDBY
            self.expected[i][d] = version

    def on_pause(self, src: Addr, msg: Pause) -> List[Send]:
        """5.3.1: stop sending to the consumer; the pause-ack follows our last data."""
        i, d = self.locate(src, SEND)
        self.paused[i][d] = True
        return [Send(self.addr, src, PauseAck(msg.version))]

    def _sync_dest(self, src: Addr) -> Tuple[int, int]:
        for i, d in self._where.get(src, ()):
            if self.status[i][d] in (ACTIVE, STDBY):
                return i, d
        raise ProtocolError(f"{self.addr}: csync from {src}, which is neither active nor standby")

    def can_accept_csync(self, src: Addr, msg: CSync) -> bool:
        """A standby's csync waits until the active's csync of the same version (5.3.2)."""
        i, d = self._sync_dest(src)
        if self.status[i][d] == STDBY and self.expected[i][d] == msg.version:
            return self.ver[i][1 - d] == msg.version
        return True

    def on_csync(self, src: Addr, msg: CSync) -> List:
        """5.3.2 csync(dest, v). From the active: unpause it, and give the standby the
        active's marks (reset) so nothing it holds is re-sent and nothing after is lost.
        From the standby (after the active's): it becomes ACTIVE in the normal mode."""
        i, d = self._sync_dest(src)
        v = msg.version
        x = 1 - d
        if self.status[i][d] == ACTIVE:
            self.ver[i][d] = v
            self.paused[i][d] = False
            if self.status[i][x] == STDBY and self.expected[i][x] == v:
                buffer = self.buffers[i]
                buffer.set_delete(buffer.delete | {x})
                buffer.reset(x)
            return []
        if self.expected[i][d] != v:
            return []  # a stale standby's sync changes no role (3.4)
        if self.ver[i][x] != v:
            raise ProtocolError(f"{self.addr}: standby csync from {src} before the active's")
        self.status[i][d] = ACTIVE
        self.conn[i][d] = set(self.normal_conn[d])
        self.ver[i][d] = v
        self.sent_bound[i][d] = NO_PROGRESS
        return [FoldedIn(self.addr, src, v)]

    def psyncs(self, version: int) -> List[Send]:
        """5.3.2: tell every live consumer replica where this replica's output stands."""
        return [
            Send(self.addr, self.peers[i][d], PSync(version))
            for i in range(len(self.peers))
            for d in DESTS
            if self.status[i][d] == ACTIVE
        ]

    def check_invariants(self) -> None:
        for i, buffer in enumerate(self.buffers):
            buffer.check_invariants()
            for d in DESTS:
                if self.status[i][d] == DEAD:
                    assert d not in buffer.delete, f"{self.addr}: dead destination {i}/{d} in delete"

    def idle(self) -> bool:
        """No tuple is waiting in any buffer."""
        return all(len(b) == 0 for b in self.buffers)


__all__ = ["Producer", "SEND", "ACK", "ACTIVE", "DEAD", "PRIM", "SEC"]
