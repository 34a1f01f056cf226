"""A dataflow segment: F-Cons -> operator chain -> F-Prod (paper 3.1.1, 5).

One replica of one partition of one stage. The segment numbers outputs
(DESIGN 4.1: the k-th output of input ``s`` is ``s + (k,)``), routes each to
its consumer partition, computes the progress bound it may promise
downstream (DESIGN 4.3), and runs its side of catch-up (3.3, 5.3, Figure 5).
Its mode is in ``TRANSITIONS`` below; see docs/design/catchup.md.

Catch-up moves the state in two phases (DESIGN 9: pause only for what
changed). Phase 1 (STREAMING): at ``sm_ready`` the active, still processing,
takes a snapshot of every operator whose state is a ``KeyedState``, starts
dirty tracking, and hands the snapshot to the mover in parts (``SendPart``)
while it goes on processing; the new replica installs each part as it
arrives (``StatePart``). Phase 2: the distributed pause and drain of 5.3.1,
quiesce, and ``SendState`` with only the changes of those stores since the
snapshot, plus everything else whole (other operators, F-Prod buffers,
F-Cons merge), installed as before. Operators without a ``KeyedState``
simply move whole in phase 2 (their bulk is empty).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Set

from flux.addresses import Addr, other
from flux.control_messages import Avail, SegmentStats
from flux.data_messages import Ack, Batch, Credit, CSync, Pause, PauseAck, PSync, Reverse
from flux.cuts import Cuts
from flux.effects import Snapshot, SourcesPaused, SourcesResumed
from flux.errors import LocalProtocolError, OperatorError, RemoteProtocolError
from flux.flux_consumer import FluxConsumer
from flux.flux_producer import FluxProducer
from flux.operator import OperatorRaised, describe
from flux.snapshot_chain import delta_snapshot, full_snapshot
from flux.state_codec import StateCodecError, pack_part, pack_state, paused_gc, unpack_part, unpack_state
from statemover.messages import (
    CancelTransfer,
    RequestRecv,
    RequestSend,
    SendPart,
    SendState,
)


class SegmentMode(enum.Enum):
    PROCESSING = "processing"  # normal processing (and take-over)
    AWAITING_STATE = "awaiting state"  # a new replica on a standby, waiting for its state
    STREAMING = "streaming"  # phase 1: the active sends its keyed snapshot while it processes
    DRAINING = "draining"  # the active paused its sources and drains to the pause-acks (5.3.1)
    MOVING = "moving"  # quiesced (initTrans): the state is with the StateMover


PROCESSING = SegmentMode.PROCESSING
AWAITING_STATE = SegmentMode.AWAITING_STATE
STREAMING = SegmentMode.STREAMING
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
    SM_READY = "sm_ready"  # Figure 5 action 2: phase 1 starts
    SEND_PART = "send part"  # local work in phase 1: one bulk part to the mover
    PART_ACKED = "part acked"  # the new replica has one more part
    BULK_SENT = "bulk sent"  # the new replica has every bulk part: phase 2 (pause, drain)
    STATE_PART = "state part"  # a bulk part arrived at the new replica
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
#: state, or for the view that discards it). Two phases: PROCESSING -> STREAMING
#: (sm_ready: snapshot, bulk parts while processing) -> DRAINING (bulk handed over:
#: pause and drain) -> MOVING (the delta and the rest) -> PROCESSING.
TRANSITIONS = {
    **{(m, e): m for m in (PROCESSING, STREAMING, DRAINING)
       for e in (Event.MESSAGE, Event.PAUSE_ACK, Event.PROCESS, Event.FLUSH)},
    **{(m, e): m for m in SegmentMode for e in (Event.FAIL, Event.AVAIL)},
    (AWAITING_STATE, Event.EXPECT_STATE): AWAITING_STATE,
    (PROCESSING, Event.SM_READY): STREAMING,
    (AWAITING_STATE, Event.SM_READY): AWAITING_STATE,
    (STREAMING, Event.SEND_PART): STREAMING,
    (STREAMING, Event.PART_ACKED): STREAMING,
    (STREAMING, Event.BULK_SENT): DRAINING,
    (AWAITING_STATE, Event.STATE_PART): AWAITING_STATE,
    (DRAINING, Event.DRAINED): MOVING,
    (MOVING, Event.STATE_SENT): PROCESSING,
    (AWAITING_STATE, Event.STATE_RECEIVED): PROCESSING,
    (PROCESSING, Event.ABORT): PROCESSING,  # started, nothing paused yet: cancel only
    (STREAMING, Event.ABORT): PROCESSING,  # nothing paused yet: cancel, stop tracking
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

    #: keys (with their values) of keyed state per bulk part (phase 1)
    bulk_pairs: int = 8192
    #: bulk parts in flight (sent, not yet acknowledged by the new replica): the active
    #: never runs ahead of what the new replica installs, so phase 2's pause does not
    #: wait behind a backlog, and no more than this many parts are buffered on the way
    part_window: int = 4
    #: False: ``sm_ready`` hands the whole bulk to the mover at once, for a driver
    #: without the local step; True: one part per ``send_part`` step (``has_part``),
    #: interleaved with processing, as the runtime should drive it
    bulk_per_step: bool = False

    def __init__(
        self,
        addr: Addr,
        consumer: FluxConsumer,
        chain: Any,
        producer: FluxProducer,
        route: Callable[[Any], int],
        mode: SegmentMode = PROCESSING,
        full_every: int = 1,
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
        # phase 1 at the active: the stores tracked since the snapshot (operator index ->
        # store), the parts not yet handed over, the next one (peeked), how many went out
        self._tracked: dict = {}
        self._bulk: Optional[Iterator[tuple]] = None
        self._bulk_next: Optional[tuple] = None
        self._parts_sent = self._parts_acked = 0  # and how many the new replica has
        #: at the new replica: bulk parts installed so far
        self.parts_received = 0
        #: what the last install took (for counters): bulk parts, keyed deltas, delta keys
        self.installed: Optional[dict] = None
        #: monitoring: inputs taken from the merge and outputs produced here
        self.taken = self.emitted = 0
        #: checkpoint cuts learnt from the batches and not crossed yet (DESIGN 10)
        self.cuts = Cuts()
        #: one snapshot in ``full_every`` is whole, the others deltas (flux.snapshot_chain)
        self.full_every = full_every
        #: the checkpoint of this replica's last snapshot a delta may build on (None: the
        #: next one is whole), and how many deltas followed the last whole one
        self.chain_base: Optional[int] = None
        self.deltas_since_full = 0

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
            effects = self.fcons.on_batch(src, msg)
            self.cuts.learn(msg.cut)
            self.fprod.out.cut = self.cuts.latest  # downstream learns it with our next batch
            return effects
        if isinstance(msg, Ack):
            self.fprod.on_ack(src, msg)
            return []
        if isinstance(msg, Credit):
            self.fprod.on_credit(src, msg)
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
        effects = self.fcons.on_fail(dead) + self.fprod.on_fail(dead)  # as in PROCESSING
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
        self._end_tracking()
        cancel = [CancelTransfer(c.transfer(self.addr), "the standby is gone")]
        if mode in (PROCESSING, STREAMING):
            return cancel  # nothing paused yet
        if mode is MOVING:
            self.chain.end_trans()
        self.fcons.cancel_pause()
        return cancel + self.fcons.csyncs(c.version) + [SourcesResumed(c.transfer(self.addr))]

    def transfer_failed(self) -> List:
        if self.mode is AWAITING_STATE:
            self._next(Event.TRANSFER_FAILED)
            self._drop_parts()  # never keep a part of a failed attempt (the view discards us)
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
        """Action 2, phase 1: snapshot every keyed store, track its changes from here,
        and stream the snapshot while processing goes on; then phase 2 (``_pause_sources``)."""
        self.mode = self._next(Event.SM_READY)
        if self.mode is AWAITING_STATE:
            return []  # the standby just waits for the state (and its parts)
        self._parts_sent = self._parts_acked = 0
        parts = []
        for i, store in enumerate(self._stores()):
            if store is not None:
                parts.append(_tagged(i, store.parts(self.bulk_pairs)))  # the keys, now
                store.clear_dirty()  # the baseline of phase 2's delta: it fixes the rest
                self._tracked[i] = store
        self._bulk = (part for tagged in parts for part in tagged)
        self._bulk_next = next(self._bulk, None)
        return self._stream(0 if self.bulk_per_step else None)

    def has_part(self) -> bool:
        """May a bulk part go in a ``send_part`` step (phase 1, ``bulk_per_step``): one is
        waiting and the window has room?"""
        return (self.mode is STREAMING and self._bulk_next is not None
                and self._parts_sent - self._parts_acked < self.part_window)

    def send_part(self) -> List:
        """Local work in phase 1: hand the next bulk part to the mover; after the last,
        phase 2 begins."""
        self._next(Event.SEND_PART)
        if self._bulk_next is None:
            raise LocalProtocolError(f"{self.addr}: send part with no part left")
        return self._stream(1)

    def _stream(self, limit: Optional[int]) -> List:
        """Hand over up to ``limit`` parts (all if None); once the new replica has every
        part, pause the sources."""
        effects: List = []
        transfer = self.catchup.transfer(self.addr)
        while self._bulk_next is not None and (limit is None or len(effects) < limit):
            i, (keys, values) = self._bulk_next
            try:
                part = pack_part(i, keys, values)
            except Exception as exc:  # the user's values: as ``_packed`` says
                op = self.chain.operators[i]
                raise OperatorError(f"the state of operator {type(op).__name__} (taken for a "
                                    f"catch-up)", self.addr.stage, self.addr.partition,
                                    self.fcons.frontier(), f"cannot be encoded: "
                                    f"{describe(exc)}") from exc
            effects.append(SendPart(transfer, part))
            self._parts_sent += 1
            self._bulk_next = next(self._bulk, None)
        return effects + self._maybe_pause()

    def part_acked(self, part: int) -> List:
        """Phase 1: the new replica has part ``part`` (the mover checked the order)."""
        self._next(Event.PART_ACKED)
        self._parts_acked += 1
        return self._maybe_pause()

    def _maybe_pause(self) -> List:
        """Every part handed over and acknowledged: phase 2."""
        if self._bulk_next is not None or self._parts_acked < self._parts_sent:
            return []
        self.mode = self._next(Event.BULK_SENT)
        self._bulk = None
        return self._pause_sources()

    def _pause_sources(self) -> List:
        """Phase 2, distributed (5.3.1): pause the data sources, drain to their pause-acks."""
        effects = self.fcons.pause(self.catchup.version)
        effects.append(SourcesPaused(self.catchup.transfer(self.addr)))
        return effects if self.fcons.awaiting_pause_acks() else effects + self._checkpoint()

    def _checkpoint(self) -> List:
        """Actions 2-4: quiesce (initTrans) and hand the mover what phase 1 did not move:
        the keyed stores' changes since the snapshot, everything else whole."""
        self.mode = self._next(Event.DRAINED)
        self.chain.init_trans()
        # in slices, no collector pauses: liveness goes on
        data = self._packed(self._moving_state, "a catch-up", self.fcons.frontier())
        return [SendState(self.catchup.transfer(self.addr), data)]

    def _packed(self, state_of, when: str, sn) -> bytes:
        """``state_of()`` packed for the store or a new replica. A state the user's
        operator made that cannot be encoded (or whose ``get_state`` raises) is the
        operator's error, named with its stage, partition and the SN where the state was
        taken: its twin would fail alike, so failing over would not help."""
        try:
            with paused_gc():
                return pack_state(state_of())
        except Exception as exc:
            culprit = "an operator's state"
            for op in getattr(self.chain, "operators", ()):
                try:
                    pack_state(op.get_state())
                except Exception as own:
                    culprit, exc = f"the state of operator {type(op).__name__}", own
                    break
            raise OperatorError(f"{culprit} (taken for {when})", self.addr.stage,
                                self.addr.partition, sn, f"cannot be encoded: "
                                f"{describe(exc)}") from exc

    def _moving_state(self) -> dict:
        if not self._tracked:
            return self.get_state()  # no keyed store: today's single whole movement
        keyed = sorted(self._tracked)
        state = self.get_state(skip=keyed)
        state["deltas"] = [[i, self._tracked[i].delta()] for i in keyed]
        state["parts"] = self._parts_sent
        return state

    def _end_tracking(self) -> None:
        """The attempt is over (sent or aborted): stop recording changes, forget the bulk."""
        for store in self._tracked.values():
            store.stop_tracking()
        self._tracked = {}
        self._bulk = self._bulk_next = None

    def _stores(self) -> list:
        """Per operator of the chain, its ``KeyedState`` or None (``OperatorChain``)."""
        return self.chain.keyed_stores()

    def state_sent(self) -> List:
        """Action 5 at the active: endTrans, then csync below and psync above (5.3.2)."""
        self.mode = self._next(Event.STATE_SENT)
        v, transfer = self.catchup.version, self.catchup.transfer(self.addr)
        self.chain.end_trans()
        self._end_tracking()
        self.catchup = None
        self.fcons.end_catchup()
        return self.fcons.csyncs(v) + self.fprod.end_catchup(v) + [SourcesResumed(transfer)]

    # -- catch-up, standby side ----------------------------------------------------
    def expect_state(self, catchup: CatchUp) -> List:
        """The new replica asks its mover to receive (Figure 5 action 1, STDBY)."""
        self._next(Event.EXPECT_STATE)
        self.catchup = catchup
        self._drop_parts()  # a store its constructor filled: all of it comes from the active
        return [RequestRecv(catchup.transfer(self.addr), catchup.peer_mover)]

    def state_part(self, part: int, data: bytes) -> List:
        """Phase 1 at the new replica: install one bulk part; go on waiting."""
        self._next(Event.STATE_PART)
        if part != self.parts_received:
            raise RemoteProtocolError(f"{self.addr}: bulk part {part}, expected {self.parts_received}")
        try:
            with paused_gc():  # see _checkpoint
                i, keys, values = unpack_part(data)
        except StateCodecError as exc:
            raise RemoteProtocolError(f"{self.addr}: bulk part {part}: {exc}") from None
        stores = self._stores()
        if not (0 <= i < len(stores) and stores[i] is not None):
            raise RemoteProtocolError(f"{self.addr}: bulk part for operator {i!r}, which has no keyed store")
        stores[i].install_part(keys, values)
        self.parts_received += 1
        return []

    def _drop_parts(self) -> None:
        for store in self._stores():
            if store is not None:
                store.restore(None)
        self.parts_received = 0

    def state_received(self, data: bytes) -> List:
        """Actions 4-5 at the standby: install with the buffers reversed, then sync."""
        nxt = self._next(Event.STATE_RECEIVED)
        with paused_gc():  # see _checkpoint
            self._install_moved(unpack_state(data))
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
    def get_state(self, skip=()) -> dict:
        """The whole segment; the operators in ``skip`` have ``None`` (moved in pieces)."""
        ops = self.chain.get_state(skip) if skip else self.chain.get_state()
        state = {"operators": ops, "fcons": self.fcons.get_state(),
                 "fprod": self.fprod.get_state()}
        if self.cuts.latest is not None:  # checkpoints are taken (DESIGN 10)
            state["cuts"] = self.cuts.to_state()
        return state

    def install_state(self, state: dict, skip=()) -> None:
        """Install ``get_state(skip)`` with the buffers reversed; ``skip`` operators stay."""
        if skip:
            self.chain.install_state(state["operators"], skip)
        else:
            self.chain.install_state(state["operators"])
        self.fcons.install_state(state["fcons"])
        self.fprod.install_state(state["fprod"], reverse=True)
        if "cuts" in state:  # a cut the active has not crossed yet
            self.cuts.install_state(state["cuts"])
            self.fprod.out.cut = self.cuts.latest

    def _install_moved(self, state: dict) -> None:
        """Phase 2 at the new replica: the bulk parts are in; apply each keyed store's
        changes, install the rest whole (a state without deltas is a whole segment)."""
        deltas = state.get("deltas")
        if deltas is None:
            if self.parts_received:
                raise RemoteProtocolError(f"{self.addr}: a whole state after {self.parts_received} "
                                          f"bulk parts")
            self.install_state(state)
            self.installed = {"parts": 0, "deltas": 0}
            return
        if state.get("parts") != self.parts_received:
            raise RemoteProtocolError(f"{self.addr}: {self.parts_received} bulk parts installed, "
                                      f"the active sent {state.get('parts')!r}")
        stores = self._stores()
        keyed = [i for i, _ in deltas]
        if any(not (type(i) is int and 0 <= i < len(stores) and stores[i] is not None) for i in keyed):
            raise RemoteProtocolError(f"{self.addr}: deltas for operators {keyed} without a keyed store")
        self.install_state(state, skip=keyed)
        for i, delta in deltas:
            stores[i].apply_delta(delta)
        self.installed = {"parts": self.parts_received, "deltas": len(deltas),
                          "delta_keys": sum(len(d["set"]) + len(d["deleted"]) for _, d in deltas)}
        self.parts_received = 0

    # -- local work ------------------------------------------------------------
    def can_process(self) -> bool:
        """Figure 3 action 1's guard: running, room in the buffers, an input to release,
        and no checkpoint cut crossed but not yet snapshotted."""
        return (self.mode in (PROCESSING, STREAMING, DRAINING) and not self.fprod.full()
                and self.fcons.can_release() and not self.snapshot_due())

    # -- checkpoints (DESIGN 10, docs/design/checkpoints.md) ----------------------------------
    def snapshot_due(self) -> bool:
        """Has the merge passed a checkpoint's cut (nothing of inputs up to it can be
        released any more) that this replica has not snapshotted?"""
        return (bool(self.cuts.pending) and self.mode in (PROCESSING, STREAMING, DRAINING)
                and self.cuts.due(self.fcons.frontier()) is not None)

    def snapshot(self, keep: bool = True) -> List:
        """Local work: the operators' state after every input up to the cut, none beyond.
        ``keep`` False: cross the cut without packing it (its twin writes the checkpoint,
        DESIGN 10); ``data`` is then None. The state is whole, or the keyed stores' changes
        since this replica's last snapshot (``base``): whole the first time, once in
        ``full_every``, and after a crossing without packing or a lost write."""
        self._next(Event.PROCESS)
        due = self.cuts.due(self.fcons.frontier())
        if due is None:
            raise LocalProtocolError(f"{self.addr}: snapshot with no cut crossed")
        k, n = due
        self.cuts.crossed(k)
        stores = self._stores()
        keyed = [i for i, store in enumerate(stores) if store is not None]
        if not keep:
            self.snapshot_lost()
            return [Snapshot(k, n, self.addr, None)]
        base = self.chain_base
        incremental = (base is not None and keyed and self.deltas_since_full + 1 < self.full_every
                       and all(stores[i].records_changes for i in keyed))
        if incremental:
            data = self._packed(lambda: delta_snapshot(
                k, base, self.chain.get_state(skip=keyed), self._changes(stores, keyed)),
                f"checkpoint {k}", (n,))
        else:
            data = self._packed(lambda: full_snapshot(k, self.chain.get_state()),
                                f"checkpoint {k}", (n,))
        self.deltas_since_full = self.deltas_since_full + 1 if incremental else 0
        if keyed and self.full_every > 1:  # the baseline of the next delta
            for i in keyed:
                stores[i].start_changes()
            self.chain_base = k
        return [Snapshot(k, n, self.addr, data, base if incremental else None)]

    def _changes(self, stores: list, keyed: List[int]) -> list:
        """A delta's part: each keyed store's net changes since the last snapshot."""
        return [[i, stores[i].changes()] for i in keyed]

    def snapshot_lost(self) -> None:
        """Local event: a snapshot of this replica may not be in the store (its write
        failed, or it crossed a cut without packing): the next one is whole."""
        self.chain_base = None
        for store in self._stores():
            if store is not None:
                store.stop_changes()

    def process(self) -> int:
        """Run the next input through the operators; returns how many outputs it made."""
        self._next(Event.PROCESS)
        if not self.fcons.can_release():
            raise LocalProtocolError(f"{self.addr}: process with no input to release")
        sn, record = self.fcons.release()
        try:
            outputs = self.chain.process(record)
        except Exception as exc:
            raise self._operator_error(sn, exc) from getattr(exc, "error", exc)
        n = self._put(sn, outputs if type(outputs) is list else list(outputs))
        self.taken += 1
        self.emitted += n
        return n

    def process_ready(self, limit: int) -> int:
        """Local work: what ``process`` would do called while ``can_process`` holds, up to
        ``limit`` inputs, in one step: the merge releases the inputs by runs and
        a chain with a ``process_batch`` operator takes them as one batch. Returns how many
        inputs it took. Equal to the loop of ``process`` calls, to the SN: inputs leave
        the merge in the same order, the same buffer-full guard stops them (an input the
        guard would have held goes back to the merge), and with a checkpoint cut pending
        it runs input by input (the cut's guard depends on each input taken)."""
        self._next(Event.PROCESS)
        if self.cuts.pending or self.mode not in (PROCESSING, STREAMING, DRAINING):
            n = 0
            while n < limit and self.can_process():
                self.process()
                n += 1
            return n
        fprod = self.fprod
        room = fprod.input_room()
        pairs = self.fcons.release_run(min(limit, room))
        if not pairs:
            return 0
        if getattr(self.chain, "batched", bool)():  # room for one output per buffer and
            return self._process_batch(pairs)  # input: never overfills by more than a batch
        ops = getattr(self.chain, "operators", ())
        process = ops[0].process if len(ops) == 1 else self.chain.process  # one call less
        put, last = self._put, len(pairs)
        taken = emitted = 0
        for _, (sn, record) in pairs:
            try:
                outputs = process(record)
            except Exception as exc:
                raise self._operator_error(sn, exc) from getattr(exc, "error", exc)
            emitted += put(sn, outputs if type(outputs) is list else list(outputs))
            taken += 1
            # the buffer-full guard of the next input: no buffer can be full before
            # ``room`` tuples went in; an input it holds goes back, as if never released
            if emitted >= room and taken < last and fprod.full():
                break
        self.taken += taken
        self.emitted += emitted
        self.fcons.took(pairs[:taken] if taken < last else pairs)
        if taken < last:
            self.fcons.put_back(pairs[taken:])
        return taken

    def _process_batch(self, pairs: list) -> int:
        first, last = pairs[0][1][0], pairs[-1][1][0]
        try:
            outputs = self.chain.process_many([record for _, (_, record) in pairs])
        except OperatorRaised as raised:
            raise OperatorError(f"operator {type(raised.op).__name__} (in a batch of {len(pairs)} "
                                f"inputs up to SN {last})", self.addr.stage, self.addr.partition,
                                first, describe(raised.error)) from raised.error
        self.fcons.took(pairs)
        self.taken += len(pairs)
        for (_, (sn, _)), outs in zip(pairs, outputs):
            self.emitted += self._put(sn, outs)
        return len(pairs)

    def _operator_error(self, sn, exc: Exception) -> OperatorError:
        """What user code raised on the input ``sn``, naming the operator: OperatorChain
        says which (``OperatorRaised``); a lone operator called straight is that one."""
        if isinstance(exc, OperatorRaised):
            return OperatorError(f"operator {type(exc.op).__name__}", self.addr.stage,
                                 self.addr.partition, sn, describe(exc.error))
        ops = getattr(self.chain, "operators", ())
        what = f"operator {type(ops[0]).__name__}" if len(ops) == 1 else "the operator chain"
        return OperatorError(what, self.addr.stage, self.addr.partition, sn, describe(exc))

    def _put(self, sn, outputs: list) -> int:
        """Number, route and buffer one input's outputs (DESIGN 4.1: the k-th is sn + (k,));
        returns how many there were."""
        try:
            routes = [self.route(out) for out in outputs]
        except Exception as exc:
            raise OperatorError("the partition key of the next stage", self.addr.stage,
                                self.addr.partition, sn, describe(exc)) from exc
        self.fprod.put_outputs(sn, outputs, routes)
        return len(outputs)

    def flushable(self):
        if self.mode not in (PROCESSING, STREAMING, DRAINING):
            return []
        return self.fprod.flushable(self.fcons.frontier())

    def flush(self, i: int, d: int) -> List:
        self._next(Event.FLUSH)
        send = self.fprod.flush(i, d, self.fcons.frontier())
        return [send] if send else []

    def credits_due(self) -> bool:
        """Back-pressure: we took inputs our data sources may now replace."""
        return self.mode in (PROCESSING, STREAMING, DRAINING) and self.fcons.credits_due()

    def send_credits(self) -> List:
        self._next(Event.FLUSH)
        return self.fcons.credits()

    def idle(self) -> bool:
        return self.fcons.idle() and self.fprod.idle()

    def stats(self) -> SegmentStats:
        """Counters for monitoring."""
        in_flight, blocked = self.fprod.window_use()
        return SegmentStats(self.addr, self.taken, self.emitted, self.fcons.queued(),
                            self.fprod.buffered(), in_flight, blocked)

    def check_invariants(self) -> None:
        self.fprod.check_invariants()
        if self.mode in (PROCESSING, AWAITING_STATE):  # no attempt of ours is moving state
            assert not self._tracked and self._bulk is None, f"{self.addr}: bulk kept after the attempt"
            tracking = [i for i, st in enumerate(self._stores()) if st is not None and st.tracking]
            assert not tracking, f"{self.addr}: operators {tracking} still track changes"


def _tagged(i: int, slices) -> Iterator[tuple]:
    """Operator ``i``'s slices as bulk parts ``(i, (keys, values))``."""
    for part in slices:
        yield (i, part)


class StreamedSegment(Segment):
    """A segment whose phase-1 bulk goes out one part per local step (``send_part``),
    interleaved with processing: what the runtime drives (the simulator draws either)."""

    bulk_per_step = True
