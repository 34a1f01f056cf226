"""A dataflow segment: F-Cons -> operator chain -> F-Prod (paper 3.1.1, 5).

One replica of one partition of one stage. The segment numbers outputs
(DESIGN 4.1: the k-th output of input ``s`` is ``s + (k,)``), routes each to
its consumer partition, computes the progress bound it may promise
downstream (DESIGN 4.3), and runs its side of catch-up (3.3, 5.3, Figure 5).
Its mode is in ``flux.protocol.segment_mode.TRANSITIONS``; see docs/design/catchup.md.

The segment is split along its seams, one file each: its local work
(``flux.protocol.segment_processing``), its side of catch-up (``flux.protocol.segment_catchup``:
the two-phase movement, both sides) and its checkpoint snapshots
(``flux.protocol.segment_snapshots``); this file holds what they share: the record of the
segment, its guard, the messages of its neighbours and the views.
"""
from __future__ import annotations

from typing import Any, Iterator, List, Optional, Set

from exchange.group_load import GroupLoad
from exchange.partitioner import KEY_GROUPS
from flux.addresses import Addr, other
from flux.control_messages import Avail, InstallRange, SegmentStats
from flux.protocol.cuts import Cuts
from flux.digests import OutputDigest
from flux.data_messages import (Ack, Batch, Credit, CSync, Pause, PauseAck, PSync, Restore,
                                 Restored, Reverse, Stay)
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.flux_producer import FluxProducer
from flux.protocol.segment_catchup import CatchUpSide
from flux.protocol.segment_mode import (  # noqa: F401 (the segment's vocabulary, imported from here)
    AWAITING_STATE,
    DRAINING,
    MOVING,
    PROCESSING,
    STREAMING,
    TRANSITIONS,
    CatchUp,
    Event,
    SegmentMode,
)
from flux.protocol.segment_moves import MoveSide
from flux.protocol.segment_processing import ProcessingSide
from flux.protocol.segment_snapshots import CheckpointSide


class Segment(ProcessingSide, CatchUpSide, CheckpointSide, MoveSide):
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
    #: a keyed store's digest is a whole pass at every this many checkpoints (numbers),
    #: else kept from its changed keys (flux.protocol.segment_snapshots)
    digest_whole_every: int = 10
    #: cuts a keyed store records no changes for its digest after most of its keys
    #: changed between two cuts (flux.protocol.segment_snapshots)
    digest_hot_skip: int = 4

    def __init__(
        self,
        addr: Addr,
        consumer: FluxConsumer,
        chain: Any,
        producer: FluxProducer,
        router: Any,
        mode: SegmentMode = PROCESSING,
        full_every: int = 1,
        digests: bool = True,
        stage_spec: Any = None,
        key_groups: Optional[int] = KEY_GROUPS,
        both_write_stage: Optional[int] = None,
    ):
        self.addr = addr
        #: a cut that moves this stage's key groups is written by both replicas of each
        #: pair (``both_replicas_write``); None: never
        self.both_write_stage = both_write_stage
        #: this stage's ``Stage`` (its key hashes a key to its group) and how many groups
        #: there are: a live move takes the keys of its groups (DESIGN 13)
        self.stage_spec, self.key_groups = stage_spec, key_groups
        self._init_moves()
        self.dual = Addr(addr.stage, addr.partition, other(addr.replica))
        self.fcons = consumer
        self.chain = chain
        self.fprod = producer
        #: the next stage's key and input form (``exchange.routing``)
        self.router = router
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
        #: monitoring: inputs taken from the merge and outputs produced here, and the
        #: outputs routed per key group of the next stage (the rebalancing policy's load)
        self.taken = self.emitted = 0
        self.routed = GroupLoad()
        #: checkpoint cuts learnt from the batches and not crossed yet (DESIGN 10)
        self.cuts = Cuts()
        #: one snapshot in ``full_every`` is whole, the others deltas (flux.snapshot_chain)
        self.full_every = full_every
        #: the checkpoint of this replica's last snapshot a delta may build on (None: the
        #: next one is whole), and how many deltas followed the last whole one
        self.chain_base: Optional[int] = None
        self.deltas_since_full = 0
        #: the outputs made since the last cut crossed, digested for the comparison with
        #: the twin's at the next (DESIGN 14); None: this segment does not digest
        self.outputs: Optional[OutputDigest] = OutputDigest() if digests else None
        #: operator index -> its keyed store's digest at the last cut (flux.digests), and
        #: how many cuts to go without recording its changes (a store mostly rewritten)
        self.state_sums: dict = {}
        self.untracked: dict = {}
        #: ``(checkpoint, cut, inputs taken)`` at the last digest: ``probe_keys`` answers
        #: for that cut
        self.digest_cut: Optional[tuple] = None

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
            return self.fprod.out.can_accept_csync(src, msg)
        return True

    def on_message(self, src: Addr, msg) -> List:
        if isinstance(msg, PauseAck):
            return self.on_pause_ack(src, msg)
        self._next(Event.MESSAGE)
        if isinstance(msg, Batch):
            effects = self.fcons.on_batch(src, msg)
            self.cuts.learn(msg.cut)
            out = self.fprod.out  # downstream learns them with our next batch
            out.cut, out.move_cuts = self.cuts.latest, self.cuts.move_cuts
            return effects
        if isinstance(msg, Ack):
            self.fprod.out.on_ack(src, msg)
            return self._forget_moves()
        if isinstance(msg, Credit):
            self.fprod.out.on_credit(src, msg)
            return self._forget_moves()
        if isinstance(msg, Reverse):
            return self.fprod.on_reverse(src, msg) + self._maybe_start()
        if isinstance(msg, Pause):
            return self.fprod.out.on_pause(src, msg)
        if isinstance(msg, CSync):
            return self.fprod.out.on_csync(src, msg)
        if isinstance(msg, PSync):
            return self.fcons.on_psync(src, msg)
        if isinstance(msg, Restore):
            return self.fprod.on_restore(src, msg)
        if isinstance(msg, Stay):
            return self.fprod.on_stay(src, msg) + self._maybe_start()
        if isinstance(msg, Restored):
            return self.fcons.on_restored(src, msg)
        if isinstance(msg, InstallRange):
            return self.on_install_range(msg)
        raise RemoteProtocolError(f"{self.addr}: unexpected {type(msg).__name__} from {src}")

    def _forget_moves(self) -> List:
        """The move cuts every consumer crossed are told no more (DESIGN 13)."""
        out = self.fprod.out
        if out.move_cuts:
            self.cuts.forget(out.moves_forgettable())
            out.move_cuts = self.cuts.move_cuts
        return []

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

    def on_writer_moved(self, writer: Addr) -> List:
        """A view moved a sink's writer (docs/design/parallel_io.md): a last stage keeps
        for it, from its next reverse, what it did not ack."""
        self._next(Event.WRITER)
        if self.mode is AWAITING_STATE:
            self.missed.append(("writer", writer))
            return []
        self.fprod.on_writer_moved(writer)
        return []

    def on_join(self, partitions) -> List:
        """A view started dormant partitions (docs/design/rescaling.md): our feeds from them
        (stage s - 1) and our links to them (stage s + 1) run from now. A new replica
        joins its feeds now and its links over the state it installs (``missed``)."""
        self._next(Event.JOIN)
        return self._membership("join", frozenset(partitions))

    def on_leave(self, partitions, cut: tuple = ()) -> List:
        """A view took partitions out (a live rescale to fewer, docs/design/rescaling.md):
        our feeds from them and our links to them end, as ``on_join`` began them (the cut
        that took their groups came in band from our other producers too)."""
        self._next(Event.LEAVE)
        return self._membership("leave", frozenset(partitions))

    def _membership(self, kind: str, parts) -> List:
        if self.mode is AWAITING_STATE:
            self._join(parts, links=False, leave=kind == "leave")
            self.missed.append((kind, parts))
            return []
        self._join(parts, leave=kind == "leave")
        return []

    def _join(self, parts, links: bool = True, leave: bool = False) -> None:
        """Our feeds from ``parts`` (stage s - 1; stage 1's are the ingresses) and, with
        ``links``, our links to them (stage s + 1; the egress is never dormant) begin,
        or with ``leave`` end."""
        if self.addr.stage > 1:
            for j in parts:
                (self.fcons.leave if leave else self.fcons.join)(j)
        for i in parts if links else ():
            (self.fprod.out.leave if leave else self.fprod.out.join)(i)

    def idle(self) -> bool:
        return self.fcons.idle() and self.fprod.out.idle()

    def stats(self) -> SegmentStats:
        """Counters for monitoring."""
        in_flight, blocked = self.fprod.out.window_use()
        return SegmentStats(self.addr, self.taken, self.emitted, self.fcons.queued(),
                            self.fprod.out.buffered(), in_flight, blocked,
                            self.routed.totals(), self.cuts.moves_crossed, self.idle())

    def check_invariants(self) -> None:
        self.fprod.out.check_invariants()
        if self.mode in (PROCESSING, AWAITING_STATE):  # no attempt of ours is moving state
            assert not self._tracked and self._bulk is None, f"{self.addr}: bulk kept after the attempt"
            tracking = [i for i, st in enumerate(self._stores()) if st is not None and st.tracking]
            assert not tracking, f"{self.addr}: operators {tracking} still track changes"


class StreamedSegment(Segment):
    """A segment whose phase-1 bulk goes out one part per local step (``send_part``),
    interleaved with processing: what the runtime drives (the simulator draws either)."""

    bulk_per_step = True
