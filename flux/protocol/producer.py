"""The abstract producer of Figure 3, over many consumer partition pairs (5.1).

For every consumer partition ``i`` a producer keeps one ``Buffer`` with two
destinations (PRIM, SEC), and one ``Link`` per destination (``flux.protocol.links``):
the paper's connection modes ``conn_i[d]`` (a subset of {SEND, ACK}) and status, with
what catch-up adds. The ingress and F-Prod differ only in their normal modes and their
take-over events, so both build on this class.

Actions (Figure 3), here:
1. ``put``: a produced tuple enters the buffer of its consumer partition.
2. ``flush``: send the next tuples to an ACTIVE destination with SEND;
   2a. on a connection without ACK, sending marks the tuples as held.
3. ``on_ack``: a cumulative ack from an ACTIVE destination with ACK.
Take-over and catch-up change the connections' roles
(``flux.protocol.producer_roles``).

Back-pressure (docs/design/backpressure.md): a connection with SEND carries at most
``window`` tuples its consumer has not taken from its merge yet; the consumer's
cumulative ``Credit`` frees them. The window bounds data only: bounds, acks and
the catch-up's control messages are never held back by it.

``flushable`` is asked at every step a driver may take, far more often than a
connection opens or closes: the open connections are kept (``_open``), and forgotten at
every change of a link's status, modes or pause (``_links_changed``).

A consumer partition paused for its catch-up (5.3.1) takes nothing until it resumes;
if its buffer held the producer at its capacity, every other partition would wait
for that pause too (an item, or a segment's next input, has rows for all of them).
So a paused partition's buffer may hold ``pause_room`` times the capacity: memory
bounded by the pause's share of the input, and the back-pressure of any longer
pause as before (docs/design/backpressure.md). The room lasts past the resume, until
the new replica has worked the buffer back within its capacity: it installs the
state before it takes anything, so at the resume its buffer holds the whole pause's
backlog, and a buffer shrunk at once would stop every partition again until the
slowest replica caught up (docs/design/handback.md: the active runs ahead of its new
twin, and the hand-back carries its output meanwhile).
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from flux.addresses import Addr
from flux.data_messages import Ack, Batch, Credit
from flux.effects import Send
from flux.errors import RemoteProtocolError
from flux.protocol.buffer import DESTS, Buffer
from flux.protocol.links import (  # noqa: F401 (the producer's vocabulary, imported from here)
    ACK,
    ACTIVE,
    DEAD,
    NONE,
    SEND,
    STDBY,
    ConnMode,
    Link,
    Status,
)
from flux.protocol.producer_membership import PartitionMembership
from flux.protocol.producer_roles import ConnectionRoles
from flux.sequence import INF, SN, before, bound_key, weakest

#: how many times its capacity a paused consumer partition's buffer may hold (default)
PAUSE_ROOM = 8

BufferFactory = Callable[[int], Buffer]


class Producer(ConnectionRoles, PartitionMembership):
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
        pause_room: int = PAUSE_ROOM,
        dormant: Iterable[int] = (),
        partitioned: bool = True,
    ):
        """``normal_modes[d]``: the modes of destination d in the normal case, restored at
        fold-in; ``absent``: consumer replicas that never exist (dead from the start);
        ``dormant``: consumer partitions not running yet, as absent until they ``join``;
        ``partitioned``: the consumers are a stage's partitions (not an egress), which
        may start and leave (docs/design/rescaling.md);
        ``window``: tuples a consumer may hold untaken per connection (None: no limit);
        ``pause_room``: how many times the capacity a paused partition's buffer holds."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if pause_room < 1:
            raise ValueError(f"pause_room must be >= 1, got {pause_room}")
        self.pause_room = pause_room
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 tuple, got {window}")
        self.addr = addr
        self.batch_size = batch_size
        #: the newest checkpoint cut this producer's side knows, stamped on every batch, and
        #: every cut that carried live moves of key groups: a batch carries those newer
        #: than the cut its connection was told last (``flux.protocol.cuts``)
        self.cut = None
        self.move_cuts: Tuple[tuple, ...] = ()
        self.window = window
        self.capacity = capacity
        self.buffer_factory = buffer_factory
        self.normal_modes = tuple(normal_modes)
        self.buffers: List[Buffer] = [buffer_factory(capacity) for _ in peers]
        #: links[i][d]: the connection with destination d of consumer partition i
        self.links: List[Tuple[Link, Link]] = [
            tuple(Link(pair[d], self.normal_modes[d]) for d in DESTS) for pair in peers
        ]
        #: the connections that may send now (ACTIVE, SEND, not paused) as (i, d, link), in
        #: (i, d) order, or None once a status, mode or pause changed (``_open_links``)
        self._open: Optional[List[Tuple[int, int, Link]]] = None
        self._where: Dict[Addr, List[Tuple[int, int]]] = {}
        for i, pair in enumerate(peers):
            for d in DESTS:
                self._where.setdefault(pair[d], []).append((i, d))
        self.fail_addresses(set(absent))
        #: consumer partitions not running yet (docs/design/rescaling.md): nothing is
        #: routed to them, their links are as dead ones until they join
        self.dormant: set = set()
        self.partitioned = partitioned
        self.sleep(dormant)

    # -- queries ---------------------------------------------------------
    @property
    def peers(self) -> List[Tuple[Addr, Addr]]:
        """peers[i][d]: the address of destination d of consumer partition i."""
        return [(row[0].peer, row[1].peer) for row in self.links]

    def status(self, i: int, d: int) -> Status:
        return self.links[i][d].status

    def full(self) -> bool:
        """Figure 3 action 1's guard, over every destination buffer."""
        for b in self.buffers:
            if b.full():
                return True
        return False

    def input_room(self) -> int:
        """Inputs that may be taken before a buffer can be full, if each puts at most one
        tuple in each buffer (0 when one is full)."""
        return max(0, min(b.capacity - len(b) for b in self.buffers))

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
        return link.is_open() and self._has_news(self.buffers[i].first_unsent(d), link,
                                                 bound_key(frontier))

    def _has_news(self, first: Optional[SN], link: Link, frontier_key: tuple) -> bool:
        """Action 2's guard on an open connection whose first unsent SN is ``first``: data
        its window lets out, a new checkpoint cut, or a stronger bound to tell than it
        told (``bound_for``, compared by ``bound_key``, inline: this runs at every step)."""
        if first is not None:
            if self.window is None or link.in_flight_tuples < self.window:
                return True
            key = first[:-1] + (first[-1] - 1, INF)  # bound_key(before(first))
            if frontier_key < key:
                key = frontier_key
        else:
            key = frontier_key
        if self.cut != link.told_cut:
            return True  # a new checkpoint cut travels even when no data does
        return key > link.sent_bound + (INF,)

    def all_taken(self) -> bool:
        """Every consumer on an open connection took every batch sent on it."""
        return all(not link.in_flight for _, _, link in self._open_links())

    def keeps_up(self, i: int, d: int) -> bool:
        """The consumer on ``(i, d)`` took every batch sent on it (credited them all)."""
        return not self.links[i][d].in_flight

    def flushable(self, frontier: SN) -> List[Tuple[int, int]]:
        """The connections ``flush`` would send on, in (i, d) order: only the open ones
        are asked (half of them in the normal case, 5.1)."""
        has_news, buffers, frontier_key = self._has_news, self.buffers, frontier + (INF,)
        return [(i, d) for i, d, link in self._open_links()
                if has_news(buffers[i].first_unsent(d), link, frontier_key)]

    def _open_links(self) -> List[Tuple[int, int, Link]]:
        """The open connections, kept until a link changes (``_links_changed``)."""
        if self._open is None:
            self._open = links_open_now(self.links)
        return self._open

    def _links_changed(self) -> None:
        """A link's status, modes or pause changed: the open connections are asked anew,
        and a paused (or catching-up) partition's buffer gets its room (``pause_room``)."""
        self._open = None
        for buffer, row in zip(self.buffers, self.links):
            buffer.resize(self.capacity * self.pause_room if has_room(row) else self.capacity)

    # -- actions ---------------------------------------------------------
    def put(self, i: int, sn: SN, item) -> None:
        """Action 1: a produced tuple (a sub-item, DESIGN 11) for consumer partition i."""
        self.buffers[i].put(sn, item)

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
                self._end_room(i)
        bound = self.bound_for(i, d, frontier)
        if bound_key(bound) > bound_key(link.sent_bound):
            link.sent_bound = bound
        else:
            bound = link.sent_bound
        cut = self.cut
        if self.move_cuts and cut is not None:
            told = link.told_cut
            news = tuple(m for m in self.move_cuts if told is None or m[0] > told[0])
            if news:
                cut = cut + (news,)
        link.told_cut = self.cut
        return Send(self.addr, link.peer, Batch(tuple(items), bound, cut))

    def on_ack(self, src: Addr, msg: Ack) -> None:
        """Action 3: a cumulative ack from an ACTIVE destination with ACK."""
        i, d = self.locate(src, ACK)
        self.buffers[i].ack(msg.hwm, d)
        self._end_room(i)
        heard_moves(self.links[i][d], msg.moves)

    def on_credit(self, src: Addr, msg: Credit) -> None:
        """The consumer ``src`` took tuples from its merge. A credit that crossed a change
        of roles (we no longer send to ``src``) frees nothing and is dropped."""
        for i, d in self._where.get(src, ()):
            link = self.links[i][d]
            if link.status is ACTIVE and SEND in link.modes:
                link.credit(msg.sn)
                heard_moves(link, msg.moves)

    def moves_forgettable(self) -> float:
        """The newest move cut every consumer we may tell has crossed (DESIGN 13): a dead
        one's standby gets its state from its twin, which is among them; a standby not
        heard from yet holds it back."""
        crossed = [link.moves_crossed for row in self.links for link in row
                   if link.status is not DEAD and link.moves_crossed is not None]
        return min(crossed, default=float("inf"))

    def check_invariants(self) -> None:
        if self._open is not None:
            assert self._open == links_open_now(self.links), (
                f"{self.addr}: open connections kept as {self._open}, "
                f"are {links_open_now(self.links)}")
        for buffer, row in zip(self.buffers, self.links):
            buffer.check_invariants()
            room = self.pause_room if has_room(row) else 1
            assert buffer.capacity == self.capacity * room, (
                f"{self.addr}: buffer capacity {buffer.capacity}, room={room > 1}")
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


def links_open_now(links: List[List[Link]]) -> List[Tuple[int, int, Link]]:
    """``(i, d, link)`` for every connection data may flow on now (Figure 3 action 2)."""
    return [(i, d, row[d]) for i, row in enumerate(links) for d in DESTS if row[d].is_open()]


def heard_moves(link: Link, moves: Optional[int]) -> None:
    """The consumer on ``link`` crossed move cut ``moves`` (None: it keeps none)."""
    if moves is None:
        link.moves_crossed = None
    elif link.moves_crossed is not None and moves > link.moves_crossed:
        link.moves_crossed = moves


def has_room(row: Tuple[Link, Link]) -> bool:
    """A consumer partition paused for its catch-up, or whose new replica is catching up,
    gets ``pause_room`` times the capacity."""
    return row[0].paused or row[1].paused or row[0].catching_up or row[1].catching_up


__all__ = ["Producer", "Link", "Status", "ConnMode", "SEND", "ACK", "NONE", "ACTIVE", "DEAD",
           "STDBY", "BufferFactory"]
