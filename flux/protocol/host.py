"""The protocol machines of one process, and the view they have applied.

A node process hosts segments and a StateMover; the ingress and the egress
are processes of their own. The host applies controller views in order,
holds a message from a later view until that view is applied, holds a
guarded control message at the head of its connection until its guard holds,
and drops every message from an incarnation a view declared dead (fencing,
DESIGN 4.4). On ``avail`` for one of its own addresses it creates the new
replica. Sans-I/O: it returns envelopes to send; the simulator or the runtime
carries them.

It is where a machine is registered: what local work each does
(``flux.protocol.machine.LocalWork``) is learnt as it is taken in and kept
beside it, for the drivers that schedule that work.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

from flux.addresses import Addr, MoverAddr
from flux.control_messages import View
from flux.effects import Send, StateInstalled
from flux.envelope import Envelope
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.protocol.machine import LocalWork, Machine
from flux.protocol.segment import CatchUp
from statemover.messages import (
    MOVER_CALLS,
    CancelTransfer,
    PartAcked,
    RequestRecv,
    RequestSend,
    SendPart,
    SendState,
    SmReady,
    StatePart,
    StateReceived,
    StateSent,
    TransferFailed,
)
from statemover.mover import StateMover


class Host:
    """Dispatches envelopes and views to the machines of one process."""

    def __init__(self, name: str, machines: Dict[Addr, Machine], inc: int = 0,
                 segment_factory: Optional[Callable[[Addr], Machine]] = None,
                 chunk_size: int = 1 << 20, peer_incs: Optional[Dict[Addr, int]] = None,
                 view: int = 0, dead_incs: Iterable[int] = (),
                 writer_factory: Optional[Callable[[Addr, Set[Addr]], Tuple[Machine, List]]] = None,
                 joined_factory: Optional[Callable[[Addr, tuple, int, tuple], Machine]] = None,
                 joined: Iterable[int] = (), left: Iterable[int] = ()):
        """``view`` and ``dead_incs``: where a process joining a running job starts (the
        controller's welcome), not from view 0. ``writer_factory(addr, dead)``: a sink's
        writer started again here, and its first effects (docs/design/parallel_io.md).
        ``joined_factory(addr, groups, moves_seen, cut)``: a fresh replica of a dormant
        partition that joins here, where the view says it starts (``Joined``,
        docs/design/rescaling.md); ``joined`` and ``left``: the dormant partitions joined
        and the partitions taken out before this process joined the running job (the
        controller's welcome)."""
        self.joined_factory = joined_factory
        #: the dormant partitions joined so far: a machine made here later (built as
        #: the job started) is told them at once
        self.joined: Set[int] = set(joined)
        #: the partitions taken out since (a live rescale to fewer), told to a machine
        #: made here later after the joins; a partition is in one of the two at most
        self.left: Set[int] = set(left)
        self.writer_factory = writer_factory
        self.name = name
        self.inc = inc
        #: the incarnation of every endpoint as this host's views say (DESIGN 4.4)
        self.peer_incs: Dict[Addr, int] = dict(peer_incs or {})
        self.machines: Dict[Addr, Machine] = dict(machines)
        #: address -> the local work its machine does, in the order of ``machines``
        self.work: Dict[Addr, LocalWork] = {a: LocalWork.of(m) for a, m in machines.items()}
        self.view = view
        self.dead: Set[Addr] = set()
        self.dead_incs: Set[int] = set(dead_incs)
        #: (address, incarnation) -> the first view whose messages count: a replica
        #: killed alone (an aborted catch-up) and maybe rebuilt on the same process
        self.valid_from: Dict[Tuple[Addr, int], float] = {}
        #: address -> the view that created the machine now there (older mail was not for it)
        self.created_at: Dict[Addr, int] = {}
        self.segment_factory = segment_factory
        self.mover_addr = MoverAddr(name)
        self.mover = StateMover(self.mover_addr, chunk_size) if segment_factory else None

    def addresses(self):
        yield from self.machines
        if self.mover is not None:
            yield self.mover_addr

    def _for_mover(self, dst) -> bool:
        """Is ``dst`` this host's StateMover? By type too: named tuples compare as tuples,
        and ``ProcAddr(name) == MoverAddr(name)`` (a message for the process is not the
        mover's)."""
        return type(dst) is MoverAddr and dst == self.mover_addr

    def fenced(self, env: Envelope) -> bool:
        """From an incarnation a view declared dead, or meant for an earlier incarnation
        of the destination: dropped, never acted on."""
        if env.inc in self.dead_incs or (env.dst_inc is not None and env.dst_inc != self.inc):
            return True
        if env.view < self.valid_from.get((env.src, env.inc), 0):
            return True
        return env.view < self.created_at.get(env.dst, 0) or (
            env.dst not in self.machines and env.dst in self.dead)

    def accepts(self, env: Envelope) -> bool:
        """May the message at the head of its connection be taken now? (DESIGN 4.4)"""
        if env.view > self.view:
            return False
        if self.fenced(env):
            return True  # it will be dropped
        if self._for_mover(env.dst):
            return True  # the StateMover takes every message in order
        machine = self.machines.get(env.dst)
        return machine is None or machine.ready_for(env.src, env.msg)

    def on_envelope(self, env: Envelope) -> Tuple[List[Envelope], List]:
        """Deliver one message; returns (envelopes to send, other effects). The checks of
        ``accepts`` in its order, each asked once (a delivery is the commonest step)."""
        if env.view > self.view:
            raise LocalProtocolError(f"{self.name}: {env.msg!r} from {env.src} taken before it may be")
        if self.fenced(env):
            return [], []  # a dead incarnation can never act
        if self._for_mover(env.dst) and self.mover is not None:
            return self._run(self.mover.on_message(env.src, env.msg))
        machine = self.machines.get(env.dst)
        if machine is None:
            raise RemoteProtocolError(f"{self.name}: no endpoint {env.dst} here (from {env.src})")
        if not machine.ready_for(env.src, env.msg):
            raise LocalProtocolError(f"{self.name}: {env.msg!r} from {env.src} taken before it may be")
        return self._run(machine.on_message(env.src, env.msg))

    def on_view(self, view: View) -> Tuple[List[Envelope], List]:
        """Apply a view completely: fail() everywhere, then avail() (3.2.1, 3.3)."""
        if view.number != self.view + 1:
            raise RemoteProtocolError(f"{self.name}: view {view.number} after view {self.view}")
        self.view = view.number
        self.dead |= set(view.failed)
        self.dead_incs |= set(view.failed_incs)
        effects: List = []
        for addr in view.failed:
            inc = self.peer_incs.get(addr)
            if inc is not None and inc not in view.failed_incs:
                self.valid_from[(addr, inc)] = float("inf")  # killed alone: fence it
            if addr in self.machines and self.inc not in view.failed_incs:
                self._discard(addr)  # an aborted new replica here
        if view.failed:
            failed = set(view.failed)
            for addr, machine in list(self.machines.items()):
                if addr not in failed:
                    effects.extend(machine.on_fail(failed))
            if self.mover is not None:
                effects.extend(self.mover.on_fail(a for a in failed if isinstance(a, MoverAddr)))
        for avail in view.avail:
            self.peer_incs[avail.addr] = avail.inc
            self.valid_from[(avail.addr, avail.inc)] = view.number
            if avail.node == self.name:
                seg = self.segment_factory(avail.addr)
                self._take(avail.addr, seg, view.number)
                effects.extend(self._since_start(seg))
                effects.extend(seg.expect_state(CatchUp(avail.version, MoverAddr(avail.active_node))))
            self.dead.discard(avail.addr)
            for addr, machine in self.machines.items():
                if addr != avail.addr:
                    effects.extend(machine.on_avail(avail, MoverAddr(avail.node)))
        for move in view.writers:
            effects.extend(self._writer_moved(move, view.number))
        if view.joined:
            effects.extend(self._joined(view))
        if view.left:
            effects.extend(self._left(view))
        return self._run(effects)

    def _since_start(self, machine: Machine) -> List:
        """A machine made here, built as the job started: the joins and leaves since."""
        effects: List = []
        if self.joined:
            effects.extend(machine.on_join(frozenset(self.joined)))
        if self.left:
            effects.extend(machine.on_leave(frozenset(self.left)))
        return effects

    def _left(self, view: View) -> List:
        """Partitions a live rescale took out (docs/design/rescaling.md): their replicas
        here stop, whatever they still send is dropped (as a replica killed alone), and
        every other machine ends its links and feeds to them."""
        parts = frozenset(a.partition for a in view.left)
        for addr in view.left:
            inc = self.peer_incs.get(addr)
            if inc is not None:
                self.valid_from[(addr, inc)] = float("inf")
            self.dead.add(addr)
            if addr in self.machines:
                self._discard(addr)
        self.joined -= parts
        self.left |= parts
        effects: List = []
        for machine in self.machines.values():
            effects.extend(machine.on_leave(parts, view.left_cut))
        return effects

    def _joined(self, view: View) -> List:
        """Dormant partitions start (docs/design/rescaling.md): their replicas placed here
        are made, fresh, and every machine runs its links and feeds to them from now."""
        parts = frozenset(j.addr.partition for j in view.joined)
        effects: List = []
        made = set()
        for j in view.joined:
            self.peer_incs[j.addr] = j.inc
            self.valid_from[(j.addr, j.inc)] = view.number
            self.dead.discard(j.addr)
            if j.node == self.name:
                machine = self.joined_factory(j.addr, j.groups, j.moves_seen, j.cut)
                self._take(j.addr, machine, view.number)
                made.add(j.addr)
        self.joined |= parts
        self.left -= parts
        for addr, machine in self.machines.items():  # one made now: the leaves too
            effects.extend(self._since_start(machine) if addr in made
                           else machine.on_join(self.joined))
        return effects

    def _take(self, addr: Addr, machine: Machine, view: int) -> None:
        self.machines[addr] = machine
        self.work[addr] = LocalWork.of(machine)
        self.created_at[addr] = view

    def _discard(self, addr: Addr) -> None:
        del self.machines[addr]
        del self.work[addr]

    def _writer_moved(self, move, view: int) -> List:
        """A sink's writer starts again on ``move.node``: there it is created; everywhere
        the last stage stops sending to it until its reverse (DESIGN 4.4: what the old
        one was sent before this view is fenced at the new one)."""
        self.peer_incs[move.addr] = move.inc
        self.valid_from[(move.addr, move.inc)] = view
        effects: List = []
        for addr, work in self.work.items():
            if addr != move.addr and work.feeds_writers is not None:
                effects.extend(work.feeds_writers.on_writer_moved(move.addr))
        if move.node == self.name:
            writer, first = self.writer_factory(move.addr, set(self.dead))
            self._take(move.addr, writer, view)
            effects.extend(first)
            effects.extend(self._since_start(writer))
        elif move.addr in self.machines:  # the old writer, on a process that lives on
            self._discard(move.addr)
        return effects

    def run_local(self, effects) -> Tuple[List[Envelope], List]:
        """Carry out effects of a local step (a process, a flush, or a segment's
        ``send_part`` in phase 1 of catch-up)."""
        return self._run(effects)

    def _run(self, effects) -> Tuple[List[Envelope], List]:
        """Wrap sends; hand mover calls to the mover and its signals to the segment."""
        sends, others = [], []
        pending = list(effects)
        while pending:
            e = pending.pop(0)
            if isinstance(e, Send):
                sends.append(Envelope(e.src, e.dst, self.view, e.msg, self.inc,
                                      self.peer_incs.get(e.dst)))
            elif isinstance(e, MOVER_CALLS):
                pending.extend(self._call_mover(e))
            elif isinstance(e, (SmReady, StatePart, PartAcked, StateSent, StateReceived,
                                TransferFailed)):
                seg = self.segment_of(e.transfer)
                if seg is None or not seg.in_transfer(e.transfer):
                    continue  # about an attempt this host already gave up
                elif isinstance(e, SmReady):
                    others.append(e)  # the movement starts (the runtime times it)
                    pending.extend(seg.sm_ready())
                elif isinstance(e, StatePart):
                    pending.extend(seg.state_part(e.part, e.data))  # phase 1 at the standby
                    others.append(StateInstalled(e.transfer, len(e.data), complete=False))
                elif isinstance(e, PartAcked):
                    pending.extend(seg.part_acked(e.part))  # phase 1 at the active
                elif isinstance(e, StateSent):
                    pending.extend(seg.state_sent())
                elif isinstance(e, StateReceived):
                    pending.extend(seg.state_received(e.data))
                    others.append(StateInstalled(e.transfer, len(e.data)))
                else:
                    others.append(e)
                    pending.extend(seg.transfer_failed())
            else:
                others.append(e)  # reports for the controller, deliveries, failed transfers
        return sends, others

    def _call_mover(self, call) -> list:
        """A segment's call to this node's StateMover (Figure 5), by its type."""
        if isinstance(call, RequestSend):
            return self.mover.request_send(call.transfer, call.peer)
        if isinstance(call, RequestRecv):
            return self.mover.request_recv(call.transfer, call.peer)
        if isinstance(call, SendPart):
            return self.mover.send_part(call.transfer, call.data)
        if isinstance(call, SendState):
            return self.mover.send(call.transfer, call.data)
        if isinstance(call, CancelTransfer):
            return self.mover.cancel(call.transfer, call.reason)
        raise LocalProtocolError(f"{self.name}: no mover call {call!r}")

    def segment_of(self, transfer: tuple):
        stage, partition, _ = transfer
        for addr, machine in self.machines.items():
            if addr.stage == stage and addr.partition == partition:
                return machine
        return None
