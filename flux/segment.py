"""A dataflow segment: F-Cons -> operator chain -> F-Prod (paper 3.1.1, 5).

One replica of one partition of one stage. The segment numbers outputs
(DESIGN 4.1: the k-th output of input ``s`` is ``s + (k,)``), routes each to
its consumer partition, computes the progress bound it may promise
downstream (DESIGN 4.3), and runs its side of catch-up (3.3, 5.3, Figure 5).
Its mode is in ``TRANSITIONS`` below; see docs/catchup.md.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Set

from flux.addresses import Addr, other
from flux.control_messages import Avail
from flux.data_messages import Ack, Batch, CSync, Pause, PauseAck, PSync, Reverse
from flux.errors import LocalProtocolError, OperatorError, RemoteProtocolError
from flux.flux_consumer import FluxConsumer
from flux.flux_producer import FluxProducer
from flux.operator import OperatorRaised, describe
from flux.sequence import output_sn
from flux.state_codec import pack_state, paused_gc, unpack_state
from statemover.messages import CancelTransfer, RequestRecv, RequestSend, SendState


class SegmentMode(enum.Enum):
    PROCESSING = "processing"  # normal processing (and take-over)
    AWAITING_STATE = "awaiting state"  # a new replica on a standby, waiting for its state
    DRAINING = "draining"  # the active paused its sources and drains to the pause-acks (5.3.1)
    MOVING = "moving"  # quiesced (initTrans): the state is with the StateMover


PROCESSING = SegmentMode.PROCESSING
AWAITING_STATE = SegmentMode.AWAITING_STATE
DRAINING = SegmentMode.DRAINING
MOVING = SegmentMode.MOVING


class Event(enum.Enum):
    MESSAGE = "message"  # a data or sync message from a neighbour (not a pause-ack)
    PAUSE_ACK = "pause-ack"
    FAIL = "fail"  # a view's fail()
    AVAIL = "avail"  # a view's avail()
    PROCESS = "process"  # local work: one input through the operators
    FLUSH = "flush"  # local work: one batch out
    EXPECT_STATE = "expect state"  # Figure 5 action 1 at the new replica
    SM_READY = "sm_ready"  # Figure 5 action 2
    DRAINED = "drained"  # the last pause-ack: checkpoint (actions 2-4)
    STATE_SENT = "state sent"  # action 5 at the active
    STATE_RECEIVED = "state received"  # actions 4-5 at the new replica
    ABORT = "abort"  # the standby died or the transfer failed (3.4)
    TRANSFER_FAILED = "transfer failed"


#: (mode, event) -> next mode; an event not listed is a LocalProtocolError, since the
#: host asks ``ready_for`` and ``can_process``/``flushable`` first. Harmless late events,
#: listed on purpose: a pause-ack while PROCESSING is that of an aborted attempt (our
#: csync already resumed the source), as is one of another version while DRAINING;
#: sm_ready and a failed transfer at a new replica change nothing (it waits for its
#: state, or for the view that discards it).
TRANSITIONS = {
    **{(m, e): m for m in (PROCESSING, DRAINING)
       for e in (Event.MESSAGE, Event.PAUSE_ACK, Event.PROCESS, Event.FLUSH)},
    **{(m, e): m for m in SegmentMode for e in (Event.FAIL, Event.AVAIL)},
    (AWAITING_STATE, Event.EXPECT_STATE): AWAITING_STATE,
    (PROCESSING, Event.SM_READY): DRAINING,
    (AWAITING_STATE, Event.SM_READY): AWAITING_STATE,
    (DRAINING, Event.DRAINED): MOVING,
    (MOVING, Event.STATE_SENT): PROCESSING,
    (AWAITING_STATE, Event.STATE_RECEIVED): PROCESSING,
    (PROCESSING, Event.ABORT): PROCESSING,  # started, nothing paused yet: cancel only
    (DRAINING, Event.ABORT): PROCESSING,
    (MOVING, Event.ABORT): PROCESSING,
    (AWAITING_STATE, Event.TRANSFER_FAILED): AWAITING_STATE,
}


@dataclass(frozen=True, slots=True)
class CatchUp:
    """The catch-up this replica takes part in: version and the peer's StateMover."""

    version: int
    peer_mover: Any
    started: bool = False

    def transfer(self, addr: Addr) -> tuple:
        return (addr.stage, addr.partition, self.version)


class Segment:
    """The machines and operators of one partition replica of one stage."""

    def __init__(
        self,
        addr: Addr,
        consumer: FluxConsumer,
        chain: Any,
        producer: FluxProducer,
        route: Callable[[Any], int],
        mode: SegmentMode = PROCESSING,
    ):
        self.addr = addr
        self.dual = Addr(addr.stage, addr.partition, other(addr.replica))
        self.fcons = consumer
        self.chain = chain
        self.fprod = producer
        self.route = route
        self.mode = SegmentMode(mode)
        self.catchup: Optional[CatchUp] = None
        #: views applied while AWAITING_STATE, replayed over the installed state (it may be older)
        self.missed: List[tuple] = []

    def _next(self, event: Event) -> SegmentMode:
        """The guard of every event: the mode it leads to, or a LocalProtocolError."""
        nxt = TRANSITIONS.get((self.mode, event))
        if nxt is None:
            raise LocalProtocolError(f"{self.addr}: {event.value} while {self.mode.name}")
        return nxt

    def in_transfer(self, transfer: tuple) -> bool:
        """Is ``transfer`` the catch-up attempt this segment takes part in now?"""
        return self.catchup is not None and self.catchup.transfer(self.addr) == transfer

    # -- messages ------------------------------------------------------------
    def ready_for(self, src: Addr, msg) -> bool:
        """Guards of DESIGN 4.4: a message that may not be taken yet waits at the head
        of its connection. A quiesced or not yet installed segment takes nothing."""
        if self.mode in (MOVING, AWAITING_STATE):
            return False
        if isinstance(msg, PSync):
            return self.fcons.ready_for(src, msg)
        if isinstance(msg, CSync):
            return self.fprod.ready_for_csync(src, msg)
        return True

    def on_message(self, src: Addr, msg) -> List:
        if isinstance(msg, PauseAck):
            return self.on_pause_ack(src, msg)
        self._next(Event.MESSAGE)
        if isinstance(msg, Batch):
            return self.fcons.on_batch(src, msg)
        if isinstance(msg, Ack):
            self.fprod.on_ack(src, msg)
            return []
        if isinstance(msg, Reverse):
            return self.fprod.on_reverse(src, msg) + self._maybe_start()
        if isinstance(msg, Pause):
            return self.fprod.on_pause(src, msg)
        if isinstance(msg, CSync):
            return self.fprod.on_csync(src, msg)
        if isinstance(msg, PSync):
            return self.fcons.on_psync(src, msg)
        raise RemoteProtocolError(f"{self.addr}: unexpected {type(msg).__name__} from {src}")

    def on_pause_ack(self, src: Addr, msg: PauseAck) -> List:
        """5.3.1: a source paused after its last data; at the last one, checkpoint."""
        self._next(Event.PAUSE_ACK)
        if self.mode is not DRAINING or msg.version != self.catchup.version:
            return []  # the pause of an aborted attempt: our csync already resumed it
        return self._checkpoint() if self.fcons.on_pause_ack(src, msg) else []

    def on_fail(self, dead: Set[Addr]) -> List:
        self._next(Event.FAIL)
        if self.mode is AWAITING_STATE:
            self.fcons.mark_dead(dead)
            self.missed.append(("fail", set(dead)))
            return []
        effects = self.fcons.on_fail(dead) + self.fprod.on_fail(dead)
        if self.catchup is not None and self.dual in dead:
            effects += self.abort_catchup()
        return effects + self._maybe_start()

    def abort_catchup(self) -> List:
        """The standby died or its transfer failed (3.4): resume as if movement had
        finished, unpausing our sources, but keep forwarding: there is no new replica."""
        c, mode = self.catchup, self.mode
        nxt = self._next(Event.ABORT) if c.started else mode
        self.catchup = None
        if not c.started:
            return []  # never asked the mover: nothing to cancel, nothing paused
        self.mode = nxt
        cancel = [CancelTransfer(c.transfer(self.addr), "the standby is gone")]
        if mode is PROCESSING:
            return cancel
        if mode is MOVING:
            self.chain.end_trans()
        self.fcons.cancel_pause()
        return cancel + self.fcons.csyncs(c.version)

    def transfer_failed(self) -> List:
        if self.mode is AWAITING_STATE:
            self._next(Event.TRANSFER_FAILED)
            return []
        return self.abort_catchup()

    def on_avail(self, avail: Avail, peer_mover: Any) -> List:
        """Figure 5 avail(): a standby exists for a neighbour, or for our own dual."""
        self._next(Event.AVAIL)
        self.fcons.on_avail(avail.addr, avail.version)
        if self.mode is AWAITING_STATE:
            self.missed.append(("avail", avail))
            return []
        self.fprod.on_avail(avail)
        if avail.addr == self.dual:
            self.catchup = CatchUp(avail.version, peer_mover)
        return self._maybe_start()

    # -- catch-up, active side (Figure 5 actions 1-5) --------------------------
    def _maybe_start(self) -> List:
        """Action 1: avail seen and take-over of our F-Prod complete (5.3)."""
        c = self.catchup
        if c is None or c.started or self.mode is not PROCESSING or not self.fprod.takeover_done():
            return []
        self.catchup = CatchUp(c.version, c.peer_mover, started=True)
        return [RequestSend(c.transfer(self.addr), c.peer_mover)]

    def sm_ready(self) -> List:
        """Action 2, distributed (5.3.1): pause the data sources, drain to their pause-acks."""
        self.mode = self._next(Event.SM_READY)
        if self.mode is AWAITING_STATE:
            return []  # the standby just waits for the state
        effects = self.fcons.pause(self.catchup.version)
        return effects if self.fcons.awaiting_pause_acks() else effects + self._checkpoint()

    def _checkpoint(self) -> List:
        """Actions 2-4: quiesce (initTrans) and hand the whole segment to the mover."""
        self.mode = self._next(Event.DRAINED)
        self.chain.init_trans()
        with paused_gc():  # in slices, no collector pauses: liveness goes on (issue 11)
            data = pack_state(self.get_state())
        return [SendState(self.catchup.transfer(self.addr), data)]

    def state_sent(self) -> List:
        """Action 5 at the active: endTrans, then csync below and psync above (5.3.2)."""
        self.mode = self._next(Event.STATE_SENT)
        v = self.catchup.version
        self.chain.end_trans()
        self.catchup = None
        self.fcons.end_catchup()
        return self.fcons.csyncs(v) + self.fprod.end_catchup(v)

    # -- catch-up, standby side ----------------------------------------------------
    def expect_state(self, catchup: CatchUp) -> List:
        """The new replica asks its mover to receive (Figure 5 action 1, STDBY)."""
        self._next(Event.EXPECT_STATE)
        self.catchup = catchup
        return [RequestRecv(catchup.transfer(self.addr), catchup.peer_mover)]

    def state_received(self, data: bytes) -> List:
        """Actions 4-5 at the standby: install with the buffers reversed, then sync."""
        nxt = self._next(Event.STATE_RECEIVED)
        with paused_gc():  # see _checkpoint
            self.install_state(unpack_state(data))
        for kind, what in self.missed:  # what happened since the snapshot was taken
            if kind == "fail":
                self.fprod.replay_fail(what)
            else:
                self.fprod.replay_avail(what)
        self.missed = []
        v = self.catchup.version
        self.mode = nxt
        self.catchup = None
        return self.fcons.csyncs(v) + self.fcons.reverse_dead_sources() + self.fprod.psyncs(v)

    # -- the whole segment's state (DESIGN 4.6) --------------------------------------
    def get_state(self) -> dict:
        return {"operators": self.chain.get_state(), "fcons": self.fcons.get_state(),
                "fprod": self.fprod.get_state()}

    def install_state(self, state: dict) -> None:
        self.chain.install_state(state["operators"])
        self.fcons.install_state(state["fcons"])
        self.fprod.install_state(state["fprod"], reverse=True)

    # -- local work ------------------------------------------------------------
    def can_process(self) -> bool:
        """Figure 3 action 1's guard: running, room in the buffers, and an input to release."""
        return (self.mode in (PROCESSING, DRAINING) and not self.fprod.full()
                and self.fcons.can_release())

    def process(self) -> int:
        """Run the next input through the operators; returns how many outputs it made."""
        self._next(Event.PROCESS)
        if not self.fcons.can_release():
            raise LocalProtocolError(f"{self.addr}: process with no input to release")
        sn, record = self.fcons.release()
        stage, partition = self.addr.stage, self.addr.partition
        try:
            outputs = self.chain.process(record)
        except OperatorRaised as raised:
            raise OperatorError(f"operator {type(raised.op).__name__}", stage, partition, sn,
                                describe(raised.error)) from raised.error
        except Exception as exc:  # a chain other than OperatorChain
            raise OperatorError("the operator chain", stage, partition, sn, describe(exc)) from exc
        try:
            routes = [self.route(out) for out in outputs]
        except Exception as exc:
            raise OperatorError("the partition key of the next stage", stage, partition, sn,
                                describe(exc)) from exc
        for k, (out, route) in enumerate(zip(outputs, routes), 1):
            self.fprod.put(route, output_sn(sn, k), out)
        return len(outputs)

    def flushable(self):
        if self.mode not in (PROCESSING, DRAINING):
            return []
        return self.fprod.flushable(self.fcons.frontier())

    def flush(self, i: int, d: int) -> List:
        self._next(Event.FLUSH)
        send = self.fprod.flush(i, d, self.fcons.frontier())
        return [send] if send else []

    def idle(self) -> bool:
        return self.fcons.idle() and self.fprod.idle()

    def check_invariants(self) -> None:
        self.fprod.check_invariants()
