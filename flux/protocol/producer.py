"""The abstract producer of Figure 3, over many consumer partition pairs (5.1).

For every consumer partition ``i`` a producer keeps one ``Buffer`` with two
destinations (PRIM, SEC), and one ``Link`` per destination: the paper's
connection modes ``conn_i[d]`` (a subset of {SEND, ACK}) and status, with
what catch-up adds. The ingress and F-Prod differ only in their normal
modes and their take-over events, so both build on this class.

Actions (Figure 3):
1. ``put``: a produced tuple enters the buffer of its consumer partition.
2. ``flush``: send the next tuples to an ACTIVE destination with SEND;
   2a. on a connection without ACK, sending marks the tuples as held.
3. ``on_ack``: a cumulative ack from an ACTIVE destination with ACK.

Back-pressure (docs/design/backpressure.md): a connection with SEND carries at most
``window`` tuples its consumer has not taken from its merge yet; the consumer's
cumulative ``Credit`` frees them. The window bounds data only: bounds, acks and
the catch-up's control messages are never held back by it.
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from flux.addresses import Addr
from flux.protocol.buffer import DESTS, SEC, Buffer
from flux.control_messages import FoldedIn
from flux.data_messages import Ack, Batch, Credit, CSync, Pause, PauseAck, PSync
from flux.effects import Send
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.sequence import NO_PROGRESS, SN, before, bound_key, weakest


class Status(enum.Enum):
    """What a machine knows of one replica at the other end of a connection (Figures 4, 5)."""

    ACTIVE = "ACTIVE"
    DEAD = "DEAD"
    STDBY = "STDBY"  # announced by avail(), folds in at its sync (3.3)


ACTIVE = Status.ACTIVE
DEAD = Status.DEAD
STDBY = Status.STDBY


class ConnMode(enum.Flag):
    """A connection's modes, the paper's ``conn_i[d]``: data flows on SEND, acks on ACK."""

    NONE = 0
    SEND = enum.auto()
    ACK = enum.auto()


NONE = ConnMode.NONE
SEND = ConnMode.SEND
ACK = ConnMode.ACK

BufferFactory = Callable[[int], Buffer]


@dataclass(slots=True)
class Link:
    """This producer's connection with destination ``d`` of consumer partition ``i``."""

    peer: Addr
    modes: ConnMode = NONE
    status: Status = ACTIVE
    #: the strongest progress bound sent on this connection (DESIGN 4.3)
    sent_bound: SN = NO_PROGRESS
    #: catch-up: paused by the consumer (5.3.1), its last sync version, the one expected
    paused: bool = False
    ver: int = 0
    expected: int = 0
    #: back-pressure: the batches sent and not yet credited, as (last SN, tuples), and
    #: their tuples in all; a new sending episode starts from nothing (``reset_window``)
    in_flight: deque = field(default_factory=deque)
    in_flight_tuples: int = 0
    #: the newest checkpoint cut stamped on a batch of this connection (DESIGN 10)
    told_cut: Optional[Tuple[int, int]] = None

    def reset_window(self) -> None:
        """The consumer's merge holds nothing of ours that it still owes a credit for."""
        self.in_flight.clear()
        self.in_flight_tuples = 0

    def credit(self, sn: SN) -> None:
        """The consumer took every tuple <= ``sn``: free the batches that ends."""
        q = self.in_flight
        while q and q[0][0] <= sn:
            self.in_flight_tuples -= q.popleft()[1]


class Producer:
    """Buffers, cursors and connection modes toward every consumer partition pair."""

    def __init__(
        self,
        addr: Addr,
        peers: Sequence[Tuple[Addr, Addr]],
        capacity: int,
        batch_size: int,
        buffer_factory: BufferFactory = Buffer,
        normal_modes: Tuple[ConnMode, ConnMode] = (NONE, NONE),
        absent: Iterable[Addr] = (),
        window: Optional[int] = None,
    ):
        """``normal_modes[d]``: the modes of destination d in the normal case, restored at
        fold-in; ``absent``: consumer replicas that never exist (dead from the start);
        ``window``: tuples a consumer may hold untaken per connection (None: no limit)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 tuple, got {window}")
        self.addr = addr
        self.batch_size = batch_size
        #: the newest checkpoint cut this producer's side knows, stamped on every batch
        self.cut = None
        self.window = window
        self.capacity = capacity
        self.buffer_factory = buffer_factory
        self.normal_modes = tuple(normal_modes)
        self.buffers: List[Buffer] = [buffer_factory(capacity) for _ in peers]
        #: links[i][d]: the connection with destination d of consumer partition i
        self.links: List[Tuple[Link, Link]] = [
            tuple(Link(pair[d], self.normal_modes[d]) for d in DESTS) for pair in peers
        ]
        self._where: Dict[Addr, List[Tuple[int, int]]] = {}
        for i, pair in enumerate(peers):
            for d in DESTS:
                self._where.setdefault(pair[d], []).append((i, d))
        self.fail_addresses(set(absent))

    # -- queries ---------------------------------------------------------
    @property
    def peers(self) -> List[Tuple[Addr, Addr]]:
        """peers[i][d]: the address of destination d of consumer partition i."""
        return [(row[0].peer, row[1].peer) for row in self.links]

    def status(self, i: int, d: int) -> Status:
        return self.links[i][d].status

    def full(self) -> bool:
        """Figure 3 action 1's guard, over every destination buffer."""
        return any(b.full() for b in self.buffers)

    def input_room(self) -> int:
        """Inputs that may be taken before a buffer can be full, if each puts at most one
        tuple in each buffer (0 when one is full)."""
        return max(0, min(self.capacity - len(b) for b in self.buffers))

    def full_for(self, i: int) -> bool:
        """Figure 3 action 1's guard for a tuple of consumer partition i."""
        return self.buffers[i].full()

    def locate(self, src: Addr, want: ConnMode) -> Tuple[int, int]:
        """The (partition, destination) whose connection from ``src`` has mode ``want``."""
        for i, d in self._where.get(src, ()):
            link = self.links[i][d]
            if link.status is ACTIVE and want in link.modes:
                return i, d
        raise RemoteProtocolError(f"{self.addr}: no ACTIVE {want.name} connection with {src}")

    def bound_for(self, i: int, d: int, frontier: SN) -> SN:
        """What destination d of partition i may be told about future SNs (DESIGN 4.3)."""
        first = self.buffers[i].first_unsent(d)
        return frontier if first is None else weakest((before(first), frontier))

    def room(self, link: Link) -> int:
        """How many more tuples ``link``'s window lets out now."""
        if self.window is None:
            return self.batch_size
        return max(0, self.window - link.in_flight_tuples)

    def can_flush(self, i: int, d: int, frontier: SN) -> bool:
        link = self.links[i][d]
        if link.status is not ACTIVE or SEND not in link.modes or link.paused:
            return False
        if self.buffers[i].first_unsent(d) is not None and self.room(link):
            return True
        if self.cut != link.told_cut:
            return True  # a new checkpoint cut travels even when no data does
        return bound_key(self.bound_for(i, d, frontier)) > bound_key(link.sent_bound)

    def flushable(self, frontier: SN) -> List[Tuple[int, int]]:
        return [
            (i, d)
            for i in range(len(self.links))
            for d in DESTS
            if self.can_flush(i, d, frontier)
        ]

    # -- actions ---------------------------------------------------------
    def put(self, i: int, sn: SN, item) -> None:
        """Action 1: a produced tuple for consumer partition i."""
        self.buffers[i].put(sn, item)

    def put_outputs(self, sn: SN, outputs: List[Any], routes: List[int]) -> None:
        """Action 1 for one input's outputs: the k-th (SN ``sn + (k,)``, DESIGN 4.1) to
        consumer partition ``routes[k - 1]``, in order (a call per input, not per
        output)."""
        buffers, k = self.buffers, 0
        for item, i in zip(outputs, routes):
            k += 1
            buffers[i].put(sn + (k,), item)

    def flush(self, i: int, d: int, frontier: SN) -> Optional[Send]:
        """Action 2 (and 2a): the next batch for destination d, with a progress bound."""
        if not self.can_flush(i, d, frontier):
            return None
        link, buffer = self.links[i][d], self.buffers[i]
        items = buffer.take(d, min(self.batch_size, self.room(link)))
        if items:
            link.in_flight.append((items[-1][0], len(items)))
            link.in_flight_tuples += len(items)
            if ACK not in link.modes:
                buffer.ack(items[-1][0], d)  # 2a: no acks on this connection
        bound = self.bound_for(i, d, frontier)
        if bound_key(bound) > bound_key(link.sent_bound):
            link.sent_bound = bound
        else:
            bound = link.sent_bound
        link.told_cut = self.cut
        return Send(self.addr, link.peer, Batch(tuple(items), bound, self.cut))

    def on_ack(self, src: Addr, msg: Ack) -> None:
        """Action 3: a cumulative ack from an ACTIVE destination with ACK."""
        i, d = self.locate(src, ACK)
        self.buffers[i].ack(msg.hwm, d)

    def on_credit(self, src: Addr, msg: Credit) -> None:
        """The consumer ``src`` took tuples from its merge. A credit that crossed a change
        of roles (we no longer send to ``src``) frees nothing and is dropped."""
        for i, d in self._where.get(src, ()):
            link = self.links[i][d]
            if link.status is ACTIVE and SEND in link.modes:
                link.credit(msg.sn)

    def fail_destination(self, i: int, d: int) -> None:
        """Figure 4 action 3: forget a dead consumer replica and stop waiting for it."""
        link = self.links[i][d]
        link.status, link.modes, link.paused = DEAD, NONE, False
        link.reset_window()
        buffer = self.buffers[i]
        buffer.ack_all(d)
        buffer.set_delete(buffer.delete - {d})

    def fail_addresses(self, dead: Set[Addr]) -> List[Tuple[int, int]]:
        """Apply ``fail()`` for every destination in ``dead``; returns those that changed."""
        changed = []
        for addr in dead:
            for i, d in self._where.get(addr, ()):
                if self.links[i][d].status is not DEAD:
                    self.fail_destination(i, d)
                    changed.append((i, d))
        return changed

    # -- take-over at F-Prod (5.2) ------------------------------------------
    def reverse(self, src: Addr, hwm: SN) -> int:
        """5.2 (replaces Figure 4-(2)): the secondary consumer ``src`` lost its data source;
        conn_i[SEC] := {SEND}, del_i += {SEC}. Returns i."""
        i, d = self.locate(src, ACK)
        if d != SEC:
            raise RemoteProtocolError(f"{self.addr}: reverse from primary consumer {src}")
        buffer = self.buffers[i]
        buffer.ack(hwm, SEC)  # the hwm travels inside reverse (DESIGN 4.2)
        buffer.rewind(SEC)  # start after what SEC holds, whatever an old cursor said
        self.links[i][SEC].modes = SEND
        self.links[i][SEC].reset_window()
        buffer.set_delete(buffer.delete | {SEC})
        return i

    def restore_secondaries(self) -> None:
        """5.3.2 at the active: stop forwarding to secondaries that reversed to us."""
        for row in self.links:
            if SEND in row[SEC].modes:
                row[SEC].modes = self.normal_modes[SEC]
                row[SEC].reset_window()

    # -- catch-up (3.3, 5.3) ------------------------------------------------
    def on_avail(self, addr: Addr, version: int, only_if_dead: bool = False) -> None:
        """Figure 5 avail(dest): a standby will replace this dead consumer replica."""
        for i, d in self._where.get(addr, ()):
            link = self.links[i][d]
            if only_if_dead and link.status is not DEAD:
                continue
            if link.status is not DEAD:
                raise RemoteProtocolError(f"{self.addr}: avail for {addr}, which is {link.status.name}")
            link.status, link.expected = STDBY, version

    def on_pause(self, src: Addr, msg: Pause) -> List[Send]:
        """5.3.1: stop sending to the consumer; the pause-ack follows our last data."""
        i, d = self.locate(src, SEND)
        self.links[i][d].paused = True
        return [Send(self.addr, src, PauseAck(msg.version))]

    def _sync_dest(self, src: Addr) -> Tuple[int, int]:
        for i, d in self._where.get(src, ()):
            if self.links[i][d].status in (ACTIVE, STDBY):
                return i, d
        raise RemoteProtocolError(f"{self.addr}: csync from {src}, which is neither active nor standby")

    def can_accept_csync(self, src: Addr, msg: CSync) -> bool:
        """A standby's csync waits until the active's csync of the same version (5.3.2)."""
        i, d = self._sync_dest(src)
        link = self.links[i][d]
        if link.status is STDBY and link.expected == msg.version:
            return self.links[i][1 - d].ver == msg.version
        return True

    def on_csync(self, src: Addr, msg: CSync) -> List:
        """5.3.2 csync(dest, v). From the active: unpause it, and give the standby the
        active's marks (reset) so nothing it holds is re-sent and nothing after is lost.
        From the standby (after the active's): it becomes ACTIVE in the normal mode."""
        i, d = self._sync_dest(src)
        v = msg.version
        link, dual = self.links[i][d], self.links[i][1 - d]
        if link.status is ACTIVE:
            link.ver, link.paused = v, False
            if dual.status is STDBY and dual.expected == v:
                buffer = self.buffers[i]
                buffer.set_delete(buffer.delete | {1 - d})
                buffer.reset(1 - d)
            return []
        if link.expected != v:
            return []  # a stale standby's sync changes no role (3.4)
        if dual.ver != v:
            raise LocalProtocolError(f"{self.addr}: standby csync from {src} taken before "
                                     "the active's (its guard, DESIGN 4.4)")
        link.status, link.modes, link.ver = ACTIVE, self.normal_modes[d], v
        link.sent_bound = NO_PROGRESS
        link.reset_window()
        return [FoldedIn(self.addr, src, v)]

    def psyncs(self, version: int) -> List[Send]:
        """5.3.2: tell every live consumer replica where this replica's output stands."""
        return [
            Send(self.addr, link.peer, PSync(version))
            for row in self.links
            for link in row
            if link.status is ACTIVE
        ]

    # -- state movement (5.3) -----------------------------------------------
    def to_state(self) -> list:
        """Every buffer with the status of its two destinations, msgpack-safe."""
        return [[b.to_state(), [link.status.value for link in row]]
                for b, row in zip(self.buffers, self.links)]

    def install_state(self, state: list, reverse: bool) -> None:
        """Install the active's buffers; ``reverse`` swaps PRIM and SEC, marks, cursors and
        statuses, because our primary consumers are the active's secondaries (5.3)."""
        if len(state) != len(self.buffers):
            raise RemoteProtocolError(
                f"{self.addr}: state for {len(state)} consumers, not {len(self.buffers)}")
        for i, (buffer_state, statuses) in enumerate(state):
            self.buffers[i] = self.buffer_factory.from_state(buffer_state, self.capacity, reverse)
            if reverse:
                statuses = list(reversed(statuses))
            for d in DESTS:
                link = self.links[i][d]
                link.status = Status(statuses[d])
                link.modes = self.normal_modes[d] if link.status is ACTIVE else NONE
                link.reset_window()

    def check_invariants(self) -> None:
        for buffer, row in zip(self.buffers, self.links):
            buffer.check_invariants()
            for d in DESTS:
                if row[d].status is DEAD:
                    assert d not in buffer.delete, f"{self.addr}: dead destination {row[d].peer} in delete"
                    assert row[d].modes == NONE, f"{self.addr}: dead destination {row[d].peer} connected"

    def buffered(self) -> int:
        """Tuples in every buffer (monitoring)."""
        return sum(len(b) for b in self.buffers)

    def window_use(self) -> Tuple[int, int]:
        """Tuples sent and not credited over every link, and the links with a full window."""
        links = [link for row in self.links for link in row]
        full = 0 if self.window is None else sum(
            1 for link in links if link.in_flight_tuples >= self.window)
        return sum(link.in_flight_tuples for link in links), full

    def idle(self) -> bool:
        """No tuple is waiting in any buffer."""
        return all(len(b) == 0 for b in self.buffers)


__all__ = ["Producer", "Link", "Status", "ConnMode", "SEND", "ACK", "NONE", "ACTIVE", "DEAD",
           "STDBY", "BufferFactory"]
