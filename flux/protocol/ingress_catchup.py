"""A lost replica of a pair of ingresses, rebuilt on a standby (paper 3.3, 5.3; Figure 5),
while the survivor goes on (docs/design/parallel_io.md).

A segment's catch-up pauses and drains its sources before it moves its state; an
ingress has no sources in the dataflow, only its source partition, so the survivor
simply stops taking inputs for as long as its state is on its way. That state is what
makes the new replica cut the same items as it: its numbering (epoch, the last input
and item), its producer's buffers (installed reversed at the new replica, as a
segment's F-Prod is), how far it read its source partition (``inputs``: the new
replica reads on from there; the runtime keeps the source's position beside it), the
entries of a dead leader it has still to follow and the checkpoints' cuts it stamped
and has still to pass. No row moves: the new replica
reads the inputs pending for an item again, its numbering set back before them. Then
both replicas
psync every stage-1 replica (5.3.2), the survivor leads again and the new replica
follows, hearing the survivor's decisions from the first after the state.

A part of ``flux.protocol.ingress_pair.PairedIngress`` (its attributes are the pair's).
"""
from __future__ import annotations

from enum import Enum
from typing import Any, List, Optional, Tuple

from exchange.group_map import GroupMap, moves_from_wire
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.protocol.segment_mode import CatchUp
from flux.state_codec import pack_state, unpack_state
from statemover.messages import CancelTransfer, RequestRecv, RequestSend, SendState


class IngressMode(Enum):
    RUNNING = "running"  # takes inputs and messages
    MOVING = "moving"  # its state is on its way to its new twin: takes nothing
    AWAITING_STATE = "awaiting state"  # a new replica: takes nothing until installed


RUNNING, MOVING, AWAITING_STATE = IngressMode.RUNNING, IngressMode.MOVING, IngressMode.AWAITING_STATE


class IngressCatchUp:
    """The catch-up events of a replica of a pair of ingresses; mixed into ``PairedIngress``."""

    mode: IngressMode = RUNNING
    catchup: Optional[CatchUp] = None

    def await_state(self) -> None:
        """A new replica on a standby: it takes nothing until its state is installed; the
        views it sees meanwhile are applied over that state."""
        self.mode = AWAITING_STATE
        self.missed: List[tuple] = []

    def running(self) -> bool:
        return self.mode is RUNNING

    def _may_take(self) -> bool:
        """May it take inputs and decide? Not once it asked to send its state: the state
        goes with every entry of its own written (``_maybe_start``)."""
        return self.mode is RUNNING and (self.catchup is None or not self.catchup.started)

    def in_transfer(self, transfer: tuple) -> bool:
        return self.catchup is not None and self.catchup.transfer(self.addr) == transfer

    # -- the survivor's side -------------------------------------------------------
    def _maybe_start(self) -> List:
        """A standby exists for its dual, its take-over is complete (5.3) and its split's
        log holds every entry of its own (the new twin writes on after them): ask the
        mover to send (the entries it has still to follow go with its state). From here it
        takes no input and decides nothing until the state is sent."""
        c = self.catchup
        if c is None or c.started or self.mode is not RUNNING or not self.fprod.takeover_done() \
                or self.journal:
            return []
        self.catchup = CatchUp(c.version, c.peer_mover, started=True)
        return [RequestSend(c.transfer(self.addr), c.peer_mover)]

    def _routing_state(self) -> list:
        """Where its router sends each key group now (None: the job's start map) and the
        move cuts it tells its connections (DESIGN 13): a twin rebuilt from this state
        routes as it does, and switches at the same epochs (``cut_epochs``)."""
        groups = self.router.groups
        return [None if groups is None else groups.owners.tolist(),
                [[k, n, [m.to_wire() for m in moves]] for k, n, moves in self.out.move_cuts]]

    def _install_routing(self, state: list) -> None:
        owners, move_cuts = state
        if owners is not None:
            self.router = self.router.regrouped(GroupMap(owners, self.router.partitions))
        self.out.move_cuts = tuple((k, n, moves_from_wire(moves)) for k, n, moves in move_cuts)

    def mark_source(self, count: int, position: Any) -> None:
        """The runtime: its split's source goes on at ``position`` after ``count`` inputs
        (opaque here; a twin rebuilt from this state seeks there)."""
        if not self.source_marks or self.source_marks[-1][0] != count:
            self.source_marks.append((count, position))

    def source_mark(self, count: int) -> Optional[Tuple[int, Any]]:
        """The newest mark at or before ``count`` inputs, or None."""
        return next((m for m in reversed(self.source_marks) if m[0] <= count), None)

    def sm_ready(self) -> List:
        """The movers are connected: the state goes whole (there are no bulk parts), and
        the survivor takes nothing until it is sent."""
        if self.mode is AWAITING_STATE:
            return []  # the new replica just waits for the state
        if self.mode is not RUNNING:
            raise LocalProtocolError(f"{self.addr}: movers ready while {self.mode.value}")
        self.mode = MOVING
        pending = len(self.pending)  # read again by the new replica
        if self.journal or self.held:
            raise LocalProtocolError(f"{self.addr}: its state asked for with entries unwritten")
        state = {"numbering": [self.epoch, self.accepted - pending, self.last_item,
                               self.inputs - pending],
                 "log": self.seq,
                 "follow": [list(e) for e in self.to_follow],
                 "cuts": [list(self.out.cut) if self.out.cut else None,
                          [[k, e, [m.to_wire() for m in moves]]
                           for k, e, moves in self.cut_epochs]],
                 "moves": self._routing_state(),
                 "fprod": self.fprod.get_state(),
                 "mark": self.source_mark(self.inputs - pending)}
        return [SendState(self.catchup.transfer(self.addr), pack_state(state))]

    def state_sent(self) -> List:
        """Action 5: the new replica has the state: psync every stage-1 replica, and lead
        it from the next decision on."""
        if self.mode is not MOVING:
            raise LocalProtocolError(f"{self.addr}: state sent while {self.mode.value}")
        v = self.catchup.version
        self.catchup, self.mode = None, RUNNING
        self.lead_again()
        return self.fprod.end_catchup(v)

    def part_acked(self, part: int) -> List:
        raise LocalProtocolError(f"{self.addr}: an ingress sends no bulk parts")

    def abort_catchup(self) -> List:
        """The new replica died or its transfer failed (3.4): go on alone."""
        c, self.catchup = self.catchup, None
        if c is None or not c.started:
            return []
        self.mode = RUNNING
        return [CancelTransfer(c.transfer(self.addr), "the standby is gone")]

    def transfer_failed(self) -> List:
        if self.mode is AWAITING_STATE:
            return []  # the view that follows discards this replica
        return self.abort_catchup()

    # -- the new replica's side -------------------------------------------------------
    def expect_state(self, catchup: CatchUp) -> List:
        if self.mode is not AWAITING_STATE:
            raise LocalProtocolError(f"{self.addr}: expects a state while {self.mode.value}")
        self.catchup = catchup
        return [RequestRecv(catchup.transfer(self.addr), catchup.peer_mover)]

    def state_part(self, part: int, data: bytes) -> List:
        raise RemoteProtocolError(f"{self.addr}: an ingress takes no bulk parts")

    def state_received(self, data: bytes) -> List:
        """Install the survivor's numbering and buffers (reversed), apply the views seen
        meanwhile, psync every stage-1 replica; then follow."""
        if self.mode is not AWAITING_STATE:
            raise LocalProtocolError(f"{self.addr}: a state while {self.mode.value}")
        state = unpack_state(data)
        epoch, accepted, last_item, inputs = state["numbering"]
        self.install_numbering(epoch, accepted, last_item, inputs)
        self.seq = self.told = state["log"]  # it writes the split's log on from there
        self.to_follow.extend(tuple(e) for e in state["follow"])
        self._logged_upto(max([0] + [self._position(e) for e in self.to_follow]))
        self.fprod.install_state(state["fprod"], reverse=True)
        if state["mark"] is not None:  # where it reads its split from (the runtime's)
            self.mark_source(*state["mark"])
        cut, cut_epochs = state["cuts"]  # the checkpoints it stamps and has still to pass
        self.out.cut = tuple(cut) if cut else None
        self.cut_epochs = [(k, e, moves_from_wire(moves)) for k, e, moves in cut_epochs]
        self._install_routing(state["moves"])
        for kind, what in self.missed:
            if kind == "fail":
                self.fprod.replay_fail(what)
            else:
                self.fprod.replay_avail(what)
        self.missed = []
        v = self.catchup.version
        self.catchup, self.mode = None, RUNNING
        return self.fprod.out.psyncs(v)
