"""Deliberately broken protocol variants: proof that the oracle can fail.

Each is a one-rule change to the buffer, the segment, the host or the world's restart
(``WORLD_VARIANTS``: settings of ``WorldConfig``). The simulator must
report a violation for each, with a seed that reproduces it.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import List

from flux.protocol.buffer import PRIM, Buffer
from flux.addresses import S
from flux.data_messages import Batch, Credit, LogAck
from flux.effects import Send
from flux.protocol.egress import Egress
from flux.protocol.host import Host
from flux.protocol.epoch_ingress import EpochIngress
from flux.protocol.ingress import Ingress
from exchange.group_map import stage_moves
from exchange.routing import moved
from flux.protocol.ingress_pair import CUT, FOLLOWING, LEADING, EpochIngressReplica
from flux.protocol.segment import DRAINING, PROCESSING, STREAMING, Segment
from flux.protocol.sink_writer import SinkWriter
from flux.sequence import NO_PROGRESS
from flux.state_codec import pack_state, unpack_state
from statemover.mover import TERMINAL, StateMover


class BufferWithoutDuplicateFilter(Buffer):
    """Sends from its own cursor only, ignoring what the destination already holds."""

    def _next_index(self, dest: int) -> int:
        return bisect_right(self._sns, self.sent[dest], lo=self._head)


class BufferEvictingBeforeDualAck(Buffer):
    """Evicts a tuple once the primary holds it, without the secondary's ack (5.1 broken)."""

    def _evict(self) -> None:
        delete = self.delete
        self.delete = delete & {PRIM} or delete
        try:
            super()._evict()
        finally:
            self.delete = delete

    def check_invariants(self) -> None:
        pass  # its eviction rule is the bug under test, not a broken invariant


class BufferInstalledWithoutReversal(Buffer):
    """Installs the active's buffer as it is, not reversed (5.3 broken)."""

    @classmethod
    def from_state(cls, state, capacity, reverse=False, decode=lambda payload: payload):
        return super().from_state(state, capacity, False, decode)


class SegmentWithoutDrain(Segment):
    """Moves the final state once the bulk is handed over without pausing the sources
    and draining (5.3.1 broken)."""

    def _pause_sources(self):
        return self._checkpoint()


class SegmentWithoutDelta(Segment):
    """Two-phase catch-up that forgets phase 2's delta: the new replica keeps the
    keyed snapshot of sm_ready, missing what changed while the bulk moved."""

    def _moving_state(self):
        state = super()._moving_state()
        if "deltas" in state:
            state["deltas"] = [[i, {"set": [], "deleted": []}] for i, _ in state["deltas"]]
        return state


class SegmentWithLazyCredits(Segment):
    """Credits only every ``credit_every`` tuples taken, never when a feed's queue
    empties (the rule that keeps a full window from waiting for ever is gone)."""

    def _lazy(self):
        return [feed for feed in self.fcons.feeds
                if feed.data_from is not None and feed.owed >= self.fcons.credit_every]

    def credits_due(self) -> bool:
        return self.mode in (PROCESSING, STREAMING, DRAINING) and bool(self._lazy())

    def send_credits(self):
        effects = []
        for feed in self._lazy():
            effects.append(Send(self.addr, feed.data_source(), Credit(feed.taken)))
            feed.owed = 0
        return effects


class SegmentDroppingTheActivesLastData(Segment):
    """In a hand-back, drops all the active sent before our Restore reached it, instead
    of taking what is new of it (docs/design/handback.md broken): the active counts it
    delivered, so if our side dies before sending those items, they are lost."""

    def on_message(self, src, msg):
        if isinstance(msg, Batch):
            for feed in self.fcons.feeds:
                if feed.drain is not None and feed.replicas[feed.drain].addr == src:
                    return []
        return super().on_message(src, msg)


class SegmentSnapshottingLate(Segment):
    """Goes on processing past a checkpoint's cut before it snapshots (DESIGN 10 broken):
    the snapshot may hold inputs the restart will replay."""

    def can_process(self) -> bool:
        return (self.mode in (PROCESSING, STREAMING, DRAINING) and not self.fprod.out.full()
                and self.fcons.can_release())


class SegmentForgettingAChange(Segment):
    """Leaves the first changed key out of every incremental snapshot (DESIGN 10 broken):
    the chain rebuilds a state that never was."""

    def _changes(self, stores, keyed):
        changes = super()._changes(stores, keyed)
        for _, delta in changes:
            if delta["set"]:
                del delta["set"][0]
                break
            if delta["deleted"]:
                del delta["deleted"][0]
                break
        return changes


class IngressSendingBeforeTheLog(Ingress):
    """Sends items before their SNs are in the input log (DESIGN 10 broken): a restart
    may number them otherwise though outputs of theirs were committed."""

    def _waits_for_log(self, x: int) -> bool:
        return False

    def frontier(self):
        return (self.last_item,) if self.last_item else NO_PROGRESS


class IngressBoundingBeforeItsItem(EpochIngress):
    """Ends an epoch by sending the next epoch's bound before the item of the inputs it
    had pending (DESIGN 12 broken: the item leaves first): that item's SN lies below a
    bound stage 1's merges have trusted, and they may have released another ingress's
    later items before it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._late: list = []
        self._delaying = False

    def _put(self, x, subs) -> None:
        if self._delaying:
            self._late.append((x, subs))
        else:
            super()._put(x, subs)

    def advance_epoch(self, epoch: int) -> None:
        self._delaying = True
        try:
            return super().advance_epoch(epoch)
        finally:
            self._delaying = False

    def flush(self, i: int, d: int):
        sends = super().flush(i, d)
        late, self._late = self._late, []
        for x, subs in late:  # into the buffers only after a bound went out
            super()._put(x, subs)
        return sends

    def frontier(self):
        if self._late:  # the bound claims the new epoch though the item is still to go
            return (self.floor,)
        return super().frontier()

    def idle(self) -> bool:
        return not self._late and super().idle()


class IngressBoundingPastTheLog(EpochIngress):
    """Tells a bound past what the input log holds (DESIGN 12 broken): other ingresses'
    items below it are released and committed, and a restart may number a replayed
    input of this one under them."""

    def frontier(self):
        last = self.held[0][0] - 1 if self.held else max(self.last_item, self.floor)
        return (last,) if last else NO_PROGRESS


class IngressReplicaNotWaitingForItsTwin(EpochIngressReplica):
    """The leading replica of a pair of ingresses lets its items and bound go before its
    twin has their ends (docs/design/parallel_io.md broken): when it dies, a stage-1
    replica holds items its twin never heard of, which the twin cuts otherwise."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log_inputs = False


class IngressReplicaBoundingPastItsTwin(EpochIngressReplica):
    """The leading replica of a pair of ingresses tells a bound past the epochs its twin
    heard of (docs/design/parallel_io.md broken): when it dies, its twin's clock ends
    that epoch elsewhere and numbers an input under the bound the merges trusted."""

    def frontier(self):
        if self.role is not LEADING:
            return super().frontier()
        last = self.held[0][0] - 1 if self.held else max(self.last_item, self.floor)
        return (last,) if last else NO_PROGRESS


class IngressReplicaNotLoggingItsCuts(EpochIngressReplica):
    """The leading replica of a pair of ingresses stamps a checkpoint's cut on its own
    batches but does not log it to its twin (docs/design/parallel_io.md broken): the
    stage-1 replicas its twin feeds never learn the cut from it."""

    def cut_at_epoch(self, number: int, epoch: int, moves=()) -> None:
        if self.role is not LEADING:
            return super().cut_at_epoch(number, epoch, moves)
        EpochIngress.cut_at_epoch(self, number, epoch, moves)


class IngressReplicaReportingEarly(EpochIngressReplica):
    """The leading replica of a pair of ingresses reports passing a checkpoint's cut as
    it ends the cut's epoch, before its twin holds that epoch's start (docs/design/
    parallel_io.md broken): when it dies first, its twin ends the epoch at a count of
    its own, and a restart from that checkpoint reads the split from the leader's."""

    def _hold_reports(self, passed):
        return passed


class IngressReplicaSwitchingWhenTold(EpochIngressReplica):
    """A replica of a pair of ingresses switches its router for a cut's live moves when
    it is told the cut, not when it ends the cut's epoch (DESIGN 13 broken): the inputs
    it still numbers below the cut go to the new owner, which the old one's state never
    sees, while the old owner packs the range without them."""

    def cut_at_epoch(self, number: int, epoch: int, moves=()) -> None:
        known = self._knows_cut(number) or self.role is FOLLOWING
        super().cut_at_epoch(number, epoch, moves)
        if not known:
            self._switch_now(number)

    def _follow(self) -> int:
        cuts = [e[1] for e in self.to_follow if e[0] == CUT]
        last = super()._follow()
        for number in cuts:  # stamped now, if it could be
            if self._stamped(number):
                self._switch_now(number)
        return last

    def _switch_now(self, number: int) -> None:
        for i, (k, e, moves) in enumerate(self.cut_epochs):
            if k == number and moves:
                self.router = moved(self.router, stage_moves(moves, 1))
                self.cut_epochs[i] = (k, e, ())



class IngressReplicaMovingPastItsPending(EpochIngressReplica):
    """A replica of a pair of ingresses sends its state to its new twin numbered past the
    inputs it has pending (docs/design/parallel_io.md broken): the new replica reads on
    after them, and never holds them."""

    def sm_ready(self):
        pending, self.pending = self.pending, type(self.pending)()
        try:
            return super().sm_ready()
        finally:
            self.pending = pending


class IngressReplicaAckingUnwritten(EpochIngressReplica):
    """The follower of a pair of ingresses acks its leader's entries as it hears them,
    before they are in the split's log (docs/design/parallel_io.md broken): the leader's
    items leave, their outputs are committed, and when both replicas die before the
    write a restart numbers those inputs otherwise."""

    def _on_log(self, src, msg):
        effects = super()._on_log(src, msg)
        return effects + [Send(self.addr, self.dual, LogAck(self.seq))]

    def journal_written(self, upto: int):
        return [e for e in super().journal_written(upto)
                if not (isinstance(e, Send) and isinstance(e.msg, LogAck))]


class HostHearingTheDead(Host):
    """Acts on messages from an incarnation a view declared dead (DESIGN 4.4 broken):
    a zombie, declared dead while it runs, is heard by peers that applied that view."""

    def fenced(self, env) -> bool:
        dead, self.dead_incs = self.dead_incs, set()
        try:
            return super().fenced(env)
        finally:
            self.dead_incs = dead


class WriterAckingOnReceipt(SinkWriter):
    """Acks both replicas as outputs reach the sink, not once it committed them
    (docs/design/parallel_io.md broken): the replicas evict outputs the sink may still
    lose, and a writer started again after its node died finds them nowhere."""

    def released_items(self, items: int) -> List:
        return self.fcons.commit_acks() + super().released_items(items)


class HoldingNothing:
    """Lets the outputs past a move of its partition's last-stage groups go to the sink
    before a complete checkpoint covers the move (docs/design/rescaling.md broken): a
    restart from before it replays them to the other partition's sink, which committed
    them too, or drops them under this one's committed SN. Mixed into an egress."""

    def _hold_moves(self) -> None:
        super()._hold_moves()
        self.holds.clear()
        self._report_moves()


class EgressHoldingNothing(HoldingNothing, Egress):
    """``HoldingNothing`` as the driver's egress of one partition."""


class WriterHoldingNothing(HoldingNothing, SinkWriter):
    """``HoldingNothing`` as a sink's writer on a node."""


class StateMoverFailingOnLoss(StateMover):
    """Fails every live transfer with a peer whose messages were lost instead of asking
    for them again (the resend rule dropped, statemover/resend.py): an attempt then
    finishes only if each of its envelopes arrives, and on a lossy link a replica may
    never be rebuilt (a livelock the simulator reports as no quiescence)."""

    def link_lost(self, peer, why: str) -> list:
        self.lossy.add(peer)
        effects: list = []
        for transfer, t in self.transfers.items():
            if t.peer == peer and t.mode not in TERMINAL:
                effects += self._abort(transfer, t, why)
        return effects


class HostWithoutResends(Host):
    """A node whose StateMover fails its transfers on a lost envelope."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.mover is not None:
            self.mover = StateMoverFailingOnLoss(self.mover_addr, self.mover.chunk_size)


@dataclass
class DivergenceDraw:
    """Where a run's nondeterministic operator strikes: the S replica of ``stage``'s
    partition ``partition``, in the first item it takes after ``after`` records; once."""

    stage: int
    partition: int
    after: int
    done: bool = False

    def due(self, addr, taken: int) -> bool:
        return (not self.done and addr.replica == S and taken >= self.after
                and (addr.stage, addr.partition) == (self.stage, self.partition))


class SegmentDivergingOnce(Segment):
    """A nondeterministic operator (DESIGN 4.1 broken by the user, not by the protocol):
    once in a run, the S replica of one drawn partition leaves out the first record of an
    item once it has taken a drawn number of them, as an operator that iterates a set
    would take another path in one process. Its state and outputs differ from its
    twin's from there on; the pair's digests must find it at the next cut both cross
    (``diverge``: a ``DivergenceDraw``, set per world)."""

    diverge = DivergenceDraw(0, 0, 0, done=True)  # a world draws its own

    def _operators(self, rows):
        draw = self.diverge
        if not draw.due(self.addr, self.taken) or self.chain.columnar:
            return super()._operators(rows)
        draw.done = True
        return super()._operators(rows.sliced(1, len(rows)))  # outputs keep their SNs


class SegmentDivergingUndigested(SegmentDivergingOnce):
    """The nondeterministic operator, with digests that leave the states out (DESIGN 14
    broken): only the outputs since the cut before are compared, and a state that
    differs is found only where those outputs show it. The oracle, which compares the
    states themselves, must report the divergences missed."""

    def _digest(self, k: int, n: int, stores: list):
        digest = super()._digest(k, n, stores)
        return None if digest is None else replace(digest, states=(0,) * len(digest.states))


#: variants of the host, by name (the others use ``Host``)
HOST_VARIANTS = {"hear-the-dead": HostHearingTheDead, "no-resend": HostWithoutResends}
INGRESS_VARIANTS = {"unlogged-send": IngressSendingBeforeTheLog,
                    "epoch-bound-first": IngressBoundingBeforeItsItem,
                    "unlogged-epoch-bound": IngressBoundingPastTheLog,
                    "pair-eager-send": IngressReplicaNotWaitingForItsTwin,
                    "pair-bound-past-twin": IngressReplicaBoundingPastItsTwin,
                    "pair-rebuild-past-pending": IngressReplicaMovingPastItsPending,
                    "pair-cut-unlogged": IngressReplicaNotLoggingItsCuts,
                    "pair-ack-unwritten": IngressReplicaAckingUnwritten,
                    "pair-switch-when-told": IngressReplicaSwitchingWhenTold,
                    "pair-early-report": IngressReplicaReportingEarly}
#: variants of the world's own rules, as ``WorldConfig`` settings (DESIGN 10 broken).
#: restore-unverified: a restart takes the newest complete checkpoint without checking its
#: files' checksums: a damaged file restores a state that never was
WORLD_VARIANTS = {"restore-unverified": {"verify_restores": False},
                  # a restart at another count installs each old partition's state whole
                  # in the new partition of its number, unsplit (DESIGN 13)
                  "rescale-unsplit": {"split_rescaled": False},
                  # a drained rescale (a sink per partition) whose source goes on past the
                  # cut; one whose cut falls under what a sink committed (docs/design/
                  # rescaling.md)
                  "rescale-undrained": {"drain_stops_inputs": False},
                  "rescale-under-sinks": {"drain_past_sinks": False},
                  "eager-writer-acks": {"writer_class": WriterAckingOnReceipt},
                  "move-last-no-hold": {"egress_class": EgressHoldingNothing,
                                        "writer_class": WriterHoldingNothing},
                  "move-last-no-floor": {"move_last_without_floor": True},
                  # the cut giving joined pairs groups chosen before every process applied
                  # the join (docs/design/rescaling.md)
                  "join-cut-early": {"join_waits_for_views": False},
                  # pairs taken out leave once they crossed the cut, with what they sent
                  # not all acked; joined replicas route by the job's maps, not the
                  # maps in force (docs/design/rescaling.md)
                  "leave-unacked": {"leave_waits_for_acks": False},
                  "leave-no-cut": {"leave_tells_cut": False},
                  "join-stale-maps": {"join_with_maps": False}}

#: name -> (buffer class, segment class)
class SegmentNotWaitingForRange(Segment):
    """A live move's destination goes on past the move's cut before it installed the
    range (the routing switched before the range arrived, DESIGN 13 broken): the
    range's keys start again from nothing, and their later state is overwritten."""

    def awaiting_range(self) -> bool:
        return False


class SegmentMovingTheBulkOnly(Segment):
    """A live move in two phases whose source sends the bulk and, at the move's cut,
    none of the changes since (docs/design/rescaling.md broken): the destination
    installs the range as it was at the prepare."""

    def _take_range(self, number, move):
        over, data = super()._take_range(number, move)
        if over is None:
            return over, data
        return over, pack_state([[p[0], [], [], []] for p in unpack_state(data)])


class SegmentMovingNoDeletions(Segment):
    """A live move in two phases whose changes leave out the keys gone since the bulk
    (docs/design/rescaling.md broken): the destination keeps them with their bulk
    values (a session the source closed meanwhile lives on)."""

    def _take_range(self, number, move):
        over, data = super()._take_range(number, move)
        if over is None:
            return over, data
        return over, pack_state([p[:3] + [[]] for p in unpack_state(data)])


class SegmentWritingAlone(Segment):
    """At a cut that moves the last stage's groups with a sink per partition, one replica
    of a pair writes the snapshot, as at any other (docs/design/rescaling.md broken): a
    writer lost before its write leaves that checkpoint open for good, its rebuilt replica
    starting past the cut, and the outputs the egresses hold wait for a restart."""

    def both_replicas_write(self) -> bool:
        return False


class SegmentNotWaitingForJoined(Segment):
    """A replica that runs a joined partition's feed without waiting for its bound: the
    merge keeps the dormant feed's bound past everything (docs/design/rescaling.md
    broken), and releases what the joined partition's items should come before."""

    def on_join(self, partitions):
        effects = super().on_join(partitions)
        if self.addr.stage > 1:
            for j in partitions:
                if not self.fcons.merge.queued_from(j):
                    self.fcons.merge.sleep(j)
        return effects


VARIANTS = {
    "none": (Buffer, Segment),
    "no-dup-filter": (BufferWithoutDuplicateFilter, Segment),
    "early-evict": (BufferEvictingBeforeDualAck, Segment),
    "no-reversal": (BufferInstalledWithoutReversal, Segment),
    "no-drain": (Buffer, SegmentWithoutDrain),
    "nondeterministic": (Buffer, SegmentDivergingOnce),
    "nondeterministic-undigested": (Buffer, SegmentDivergingUndigested),
    "no-delta": (Buffer, SegmentWithoutDelta),
    "lazy-credit": (Buffer, SegmentWithLazyCredits),
    "handback-drop-last": (Buffer, SegmentDroppingTheActivesLastData),
    "hear-the-dead": (Buffer, Segment),
    "late-snapshot": (Buffer, SegmentSnapshottingLate),
    "forgotten-change": (Buffer, SegmentForgettingAChange),
    "unlogged-send": (Buffer, Segment),
    "epoch-bound-first": (Buffer, Segment),
    "unlogged-epoch-bound": (Buffer, Segment),
    "restore-unverified": (Buffer, Segment),
    "rescale-unsplit": (Buffer, Segment),
    "rescale-undrained": (Buffer, Segment),
    "rescale-under-sinks": (Buffer, Segment),
    "eager-writer-acks": (Buffer, Segment),
    "no-resend": (Buffer, Segment),
    "pair-eager-send": (Buffer, Segment),
    "pair-bound-past-twin": (Buffer, Segment),
    "pair-rebuild-past-pending": (Buffer, Segment),
    "pair-cut-unlogged": (Buffer, Segment),
    "pair-ack-unwritten": (Buffer, Segment),
    "move-before-install": (Buffer, SegmentNotWaitingForRange),
    "move-bulk-only": (Buffer, SegmentMovingTheBulkOnly),
    "move-no-deletions": (Buffer, SegmentMovingNoDeletions),
    "pair-switch-when-told": (Buffer, Segment),
    "pair-early-report": (Buffer, Segment),
    "move-last-no-hold": (Buffer, Segment),
    "move-last-no-floor": (Buffer, Segment),
    "move-last-one-writer": (Buffer, SegmentWritingAlone),
    "join-cut-early": (Buffer, Segment),
    "join-asleep": (Buffer, SegmentNotWaitingForJoined),
    "leave-unacked": (Buffer, Segment),
    "leave-no-cut": (Buffer, Segment),
    "join-stale-maps": (Buffer, Segment),
}
