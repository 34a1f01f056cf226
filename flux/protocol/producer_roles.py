"""How a producer's connections change roles: take-over (Figure 4, 5.2) and catch-up
(Figure 5, 3.3, 5.3), with the state a catch-up moves.

A part of ``flux.protocol.producer.Producer`` (its attributes are the producer's): the
data path (put, flush, ack, credit) lives there, the events that turn a connection
on, off or around live here. Every change of a link's status, modes or pause goes
through ``_links_changed``, so the producer's list of open connections stays exact.
"""
from __future__ import annotations

from typing import List, Set, Tuple

from exchange.row_states import rows_from_state, rows_to_state
from flux.addresses import Addr
from flux.control_messages import FoldedIn
from flux.data_messages import CSync, Pause, PauseAck, PSync
from flux.effects import Send
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.protocol.buffer import DESTS, PRIM, SEC
from flux.protocol.links import ACK, ACTIVE, DEAD, NONE, SEND, STDBY, Status
from flux.sequence import NO_PROGRESS, SN


class ConnectionRoles:
    """Take-over and catch-up events of a producer; mixed into ``Producer``."""

    # -- take-over (Figure 4, 5.2) --------------------------------------------
    def fail_destination(self, i: int, d: int) -> None:
        """Figure 4 action 3: forget a dead consumer replica and stop waiting for it."""
        link = self.links[i][d]
        link.status, link.modes, link.paused, link.catching_up = DEAD, NONE, False, False
        self._links_changed()
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

    def reverse(self, src: Addr, hwm: SN, held: SN = ()) -> int:
        """5.2 (replaces Figure 4-(2)): the secondary consumer ``src`` lost its data source;
        conn_i[SEC] := {SEND}, del_i += {SEC}. Returns i.

        A sink's writer (docs/design/parallel_io.md) acks both replicas, and only what its
        sink committed: its connections have ACK on both sides, a reversed one sends as
        a primary does (keeping the acks), and ``held`` (what it received, above the
        committed ``hwm``) is where sending resumes, while the buffer keeps the rest. A
        writer started again elsewhere reverses its old data source as well: whichever
        connection it comes on, it must not be one we send on."""
        i, d = self.locate(src, ACK)
        link = self.links[i][d]
        if d != SEC and ACK not in self.normal_modes[PRIM]:
            raise RemoteProtocolError(f"{self.addr}: reverse from primary consumer {src}")
        if SEND in link.modes:
            raise RemoteProtocolError(f"{self.addr}: reverse from {src}, which we send to")
        buffer = self.buffers[i]
        buffer.ack(hwm, d)  # the hwm travels inside reverse (DESIGN 4.2)
        buffer.rewind(d, held)  # start after what it holds, whatever an old cursor said
        link.modes = self.normal_modes[PRIM] | SEND
        self._links_changed()
        link.reset_window()
        buffer.set_delete(buffer.delete | {d})
        return i

    def writer_moved(self, writer: Addr) -> None:
        """The sink's writer ``writer`` starts again on another node, from what its sink
        committed (docs/design/parallel_io.md): stop sending to it until its reverse says
        from where, keep every tuple it did not ack, and tell it bounds and the cut anew
        (the new writer knows none of what was told the old one)."""
        for i, d in self._where.get(writer, ()):
            link = self.links[i][d]
            if link.status is not ACTIVE or ACK not in link.modes:
                continue
            link.modes = ACK
            link.sent_bound = NO_PROGRESS
            link.told_cut = None
            link.reset_window()
            self.buffers[i].rewind(d)
        self._links_changed()

    def restore_secondaries(self) -> None:
        """5.3.2 at the active: stop forwarding to secondaries that reversed to us."""
        for row in self.links:
            if SEND in row[SEC].modes:
                row[SEC].modes = self.normal_modes[SEC]
                row[SEC].reset_window()
        self._links_changed()

    # -- catch-up (Figure 5, 3.3, 5.3) ------------------------------------------
    def on_avail(self, addr: Addr, version: int, only_if_dead: bool = False) -> None:
        """Figure 5 avail(dest): a standby will replace this dead consumer replica."""
        for i, d in self._where.get(addr, ()):
            link = self.links[i][d]
            if only_if_dead and link.status is not DEAD:
                continue
            if link.status is not DEAD:
                raise RemoteProtocolError(f"{self.addr}: avail for {addr}, which is {link.status.name}")
            link.status, link.expected = STDBY, version
            link.told_cut = None  # the new replica knows none of what the old one was told
            link.moves_crossed = 0  # nor has it said which move cuts it crossed
            self._links_changed()

    def on_pause(self, src: Addr, msg: Pause) -> List[Send]:
        """5.3.1: stop sending to the consumer; the pause-ack follows our last data."""
        i, d = self.locate(src, SEND)
        self.links[i][d].paused = True
        self._links_changed()
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
                dual.catching_up = True  # it will work off the pause's backlog: room stays
            self._links_changed()
            return []
        if link.expected != v:
            return []  # a stale standby's sync changes no role (3.4)
        if dual.ver != v:
            raise LocalProtocolError(f"{self.addr}: standby csync from {src} taken before "
                                     "the active's (its guard, DESIGN 4.4)")
        link.status, link.modes, link.ver = ACTIVE, self.normal_modes[d], v
        self._links_changed()
        link.sent_bound = NO_PROGRESS
        link.reset_window()
        return [FoldedIn(self.addr, src, v)]

    def _end_room(self, i: int) -> None:
        """An ack freed entries of partition i: a new replica back within the capacity
        has caught up, and its buffer's room ends."""
        row = self.links[i]
        if (row[0].catching_up or row[1].catching_up) and len(self.buffers[i]) <= self.capacity:
            row[0].catching_up = row[1].catching_up = False
            self._links_changed()

    def psyncs(self, version: int, forwards: bool = False) -> List[Send]:
        """5.3.2: tell every live consumer replica where this replica's output stands;
        ``forwards``: a secondary that reversed to us hears that we go on sending to it
        (docs/design/handback.md)."""
        return [
            Send(self.addr, link.peer,
                 PSync(version, forwards and d == SEC and SEND in link.modes))
            for row in self.links
            for d, link in enumerate(row)
            if link.status is ACTIVE
        ]

    def restore(self, src: Addr) -> None:
        """The hand-back's end (docs/design/handback.md): the secondary ``src`` that
        reversed to us has its own replica again, caught up; stop sending to it (it acks
        from now on). Nothing if we no longer send to it."""
        for i, d in self._where.get(src, ()):
            link = self.links[i][d]
            if d == SEC and link.status is ACTIVE and SEND in link.modes:
                link.modes = self.normal_modes[SEC]
                link.reset_window()
                self._links_changed()

    # -- state movement (5.3) -----------------------------------------------
    def to_state(self) -> list:
        """Every buffer with the status of its two destinations, msgpack-safe (its items
        as ``rows_to_state``)."""
        return [[b.to_state(rows_to_state), [link.status.value for link in row]]
                for b, row in zip(self.buffers, self.links)]

    def install_state(self, state: list, reverse: bool) -> None:
        """Install the active's buffers; ``reverse`` swaps PRIM and SEC, marks, cursors and
        statuses, because our primary consumers are the active's secondaries (5.3)."""
        if len(state) != len(self.buffers):
            raise RemoteProtocolError(
                f"{self.addr}: state for {len(state)} consumers, not {len(self.buffers)}")
        for i, (buffer_state, statuses) in enumerate(state):
            self.buffers[i] = self.buffer_factory.from_state(buffer_state, self.capacity, reverse,
                                                             rows_from_state)
            if reverse:
                statuses = list(reversed(statuses))
            for d in DESTS:
                link = self.links[i][d]
                link.status = Status(statuses[d])
                link.modes = self.normal_modes[d] if link.status is ACTIVE else NONE
                link.reset_window()
        self._links_changed()
