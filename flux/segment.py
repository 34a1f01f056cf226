"""A dataflow segment: F-Cons -> operator chain -> F-Prod (paper 3.1.1, 5).

One replica of one partition of one stage. The segment numbers outputs
(DESIGN 4.1: the k-th output of input ``s`` is ``s + (k,)``), routes each to
its consumer partition, computes the progress bound it may promise
downstream (DESIGN 4.3), and runs its side of catch-up (3.3, 5.3):

=========  =================================================================
mode       meaning
=========  =================================================================
ACTIVE     normal processing
STDBY      a new replica on a standby, waiting for its state
DRAINING   the active replica paused its sources and drains to the pause-acks
MOVING     quiesced (initTrans): the state is with the StateMover
=========  =================================================================

The active replica A starts once its dual's standby X is announced
(``avail``) and its own F-Prod finished take-over. See docs/catchup.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Set

import msgpack

from flux.addresses import Addr, other
from flux.control_messages import Avail
from flux.data_messages import Ack, Batch, CSync, Pause, PauseAck, PSync, Reverse
from flux.errors import OperatorError, ProtocolError
from flux.flux_consumer import FluxConsumer
from flux.flux_producer import FluxProducer
from flux.operator import OperatorRaised, describe
from flux.sequence import output_sn

ACTIVE = "ACTIVE"
STDBY = "STDBY"
DRAINING = "DRAINING"
MOVING = "MOVING"


@dataclass(frozen=True, slots=True)
class MoverCall:
    """Local effect: call ``method(transfer, arg)`` on this node's StateMover."""

    method: str
    transfer: tuple
    arg: Any


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
        mode: str = ACTIVE,
    ):
        self.addr = addr
        self.dual = Addr(addr.stage, addr.partition, other(addr.replica))
        self.fcons = consumer
        self.chain = chain
        self.fprod = producer
        self.route = route
        self.mode = mode
        self.catchup: Optional[CatchUp] = None
        #: views applied while STDBY, replayed over the installed state (it may be older)
        self.missed: List[tuple] = []

    # -- messages ------------------------------------------------------------
    def ready_for(self, src: Addr, msg) -> bool:
        """Guards of DESIGN 4.4: a message that may not be taken yet waits at the head
        of its connection. A quiesced or not yet installed segment takes nothing."""
        if self.mode in (MOVING, STDBY):
            return False
        if isinstance(msg, PSync):
            return self.fcons.ready_for(src, msg)
        if isinstance(msg, CSync):
            return self.fprod.out.can_accept_csync(src, msg)
        return True

    def on_message(self, src: Addr, msg) -> List:
        if isinstance(msg, Batch):
            return self.fcons.on_batch(src, msg)
        if isinstance(msg, Ack):
            self.fprod.on_ack(src, msg)
            return []
        if isinstance(msg, Reverse):
            return self.fprod.on_reverse(src, msg) + self._maybe_start()
        if isinstance(msg, Pause):
            return self.fprod.out.on_pause(src, msg)
        if isinstance(msg, PauseAck):
            if self.mode != DRAINING or msg.version != self.catchup.version:
                return []  # the pause of an aborted attempt: our csync already resumed it
            return self._checkpoint() if self.fcons.on_pause_ack(src, msg) else []
        if isinstance(msg, CSync):
            return self.fprod.out.on_csync(src, msg)
        if isinstance(msg, PSync):
            return self.fcons.on_psync(src, msg)
        raise ProtocolError(f"{self.addr}: unexpected {type(msg).__name__} from {src}")

    def on_fail(self, dead: Set[Addr]) -> List:
        if self.mode == STDBY:
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
        self.catchup = None
        if not c.started:
            return []
        cancel = [MoverCall("cancel", c.transfer(self.addr), "the standby is gone")]
        if mode not in (DRAINING, MOVING):
            return cancel
        if mode == MOVING:
            self.chain.end_trans()
        self.mode = ACTIVE
        self.fcons.awaiting_pause_ack.clear()
        return cancel + self.fcons.csyncs(c.version)

    def transfer_failed(self) -> List:
        return self.abort_catchup() if self.mode != STDBY else []

    def on_avail(self, avail: Avail, peer_mover: Any) -> List:
        """Figure 5 avail(): a standby exists for a neighbour, or for our own dual."""
        if self.mode == STDBY:
            self.fcons.on_avail(avail.addr, avail.version)
            self.missed.append(("avail", avail))
            return []
        self.fcons.on_avail(avail.addr, avail.version)
        self.fprod.out.on_avail(avail.addr, avail.version)
        if avail.addr == self.dual:
            self.catchup = CatchUp(avail.version, peer_mover)
        return self._maybe_start()

    # -- catch-up, active side (Figure 5 actions 1-5) --------------------------
    def _maybe_start(self) -> List:
        """Action 1: avail seen and take-over of our F-Prod complete (5.3)."""
        c = self.catchup
        if c is None or c.started or self.mode != ACTIVE or not self.fprod.takeover_done():
            return []
        self.catchup = CatchUp(c.version, c.peer_mover, started=True)
        return [MoverCall("request_send", c.transfer(self.addr), c.peer_mover)]

    def sm_ready(self) -> List:
        """Action 2, distributed (5.3.1): pause the data sources, drain to their pause-acks."""
        if self.mode == STDBY:
            return []  # the standby just waits for the state
        self.mode = DRAINING
        effects = self.fcons.pause(self.catchup.version)
        return effects if self.fcons.awaiting_pause_ack else effects + self._checkpoint()

    def _checkpoint(self) -> List:
        """Actions 2-4: quiesce (initTrans) and hand the whole segment to the mover."""
        self.chain.init_trans()
        self.mode = MOVING
        data = msgpack.packb(self.get_state(), use_bin_type=True)
        return [MoverCall("send", self.catchup.transfer(self.addr), data)]

    def state_sent(self) -> List:
        """Action 5 at the active: endTrans, then csync below and psync above (5.3.2)."""
        v = self.catchup.version
        self.chain.end_trans()
        self.mode = ACTIVE
        self.catchup = None
        self.fcons.p_fail = False
        return self.fcons.csyncs(v) + self.fprod.end_catchup(v)

    # -- catch-up, standby side ----------------------------------------------------
    def expect_state(self, catchup: CatchUp) -> List:
        """The new replica asks its mover to receive (Figure 5 action 1, STDBY)."""
        self.catchup = catchup
        return [MoverCall("request_recv", catchup.transfer(self.addr), catchup.peer_mover)]

    def state_received(self, data: bytes) -> List:
        """Actions 4-5 at the standby: install with the buffers reversed, then sync."""
        if self.mode != STDBY:
            raise ProtocolError(f"{self.addr}: state received while {self.mode}")
        state = msgpack.unpackb(data, raw=False, strict_map_key=False)
        self.install_state(state)
        for kind, what in self.missed:  # what happened since the snapshot was taken
            if kind == "fail":
                self.fprod.out.fail_addresses(what)
            else:
                self.fprod.out.on_avail(what.addr, what.version, only_if_dead=True)
        self.missed = []
        v = self.catchup.version
        self.mode = ACTIVE
        self.catchup = None
        return self.fcons.csyncs(v) + self.fcons.reverse_dead_sources() + self.fprod.out.psyncs(v)

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
        return (self.mode in (ACTIVE, DRAINING) and not self.fprod.full()
                and self.fcons.merge.ready())

    def process(self) -> int:
        """Run the next input through the operators; returns how many outputs it made."""
        sn, record = self.fcons.merge.pop()
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
        if self.mode not in (ACTIVE, DRAINING):
            return []
        return self.fprod.flushable(self.fcons.merge.frontier())

    def flush(self, i: int, d: int) -> List:
        send = self.fprod.flush(i, d, self.fcons.merge.frontier())
        return [send] if send else []

    def idle(self) -> bool:
        return self.fcons.idle() and self.fprod.idle()

    def check_invariants(self) -> None:
        self.fprod.check_invariants()
