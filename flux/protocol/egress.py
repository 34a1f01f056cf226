"""The egress: the base-case consumer (paper 3.1.2, Figure 4 action 1).

It merges the last stage's partitions by SN into one totally ordered output (or,
one egress per last-stage partition, that partition's output in SN order:
``docs/design/parallel_io.md``),
takes data from the P replicas and acks to the S replicas; when a P replica
dies it reverses that partition to the S replica. Output leaves only in SN
order, item by item, each item's rows merged by row SN (DESIGN 11), so a run
with failures delivers exactly the failure-free sequence, SN for SN.

It has no local work (``flux.protocol.machine``): outputs and their credits
leave as the merge releases them, in ``on_message``, and it only acks.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Set

from exchange.group_map import owner_changes
from flux.addresses import Addr, P, S
from flux.control_messages import CheckpointDone, SegmentStats
from flux.data_messages import Batch, PSync, Restored
from flux.protocol.cuts import Cuts
from flux.effects import Deliver, SinkCommit
from flux.errors import RemoteProtocolError
from flux.protocol.flux_consumer import FluxConsumer
from flux.sequence import INF, item_bound


def egress_addr(stages: int, partition: int = 0) -> Addr:
    return Addr(stages + 1, partition, P)


class Egress:
    """Ordered output of a dataflow with ``stages`` stages of ``partitions`` partitions."""

    def __init__(self, stages: int, partitions: int, absent: Iterable[Addr] = (),
                 credit_every: int = 1, batch_rows: int = 1024,
                 partition: Optional[int] = None, acks_at_commit: bool = False,
                 dormant: Iterable[int] = ()):
        """``absent``: last-stage replicas that never exist (replication "none", DESIGN 7);
        the egress acks nobody where they would be. ``credit_every``: see FluxConsumer.
        ``batch_rows``: the most inputs an item holds (the ingress's). ``partition``: the
        one last-stage partition this egress delivers (None: all of them, merged).
        ``dormant``: last-stage partitions not running yet (docs/design/rescaling.md)."""
        self.partition = partition
        self.addr = egress_addr(stages, partition or 0)
        among = range(partitions) if partition is None else (partition,)
        producers = [(Addr(stages, j, P), Addr(stages, j, S)) for j in among]
        self.fcons = FluxConsumer(self.addr, producers, frozenset(absent), credit_every,
                                  acks_at_commit,
                                  dormant=[j for j, p in enumerate(among) if p in dormant])
        self.delivered = 0
        self.batch_rows = batch_rows
        self.released = 0  # the number of the last item released (its last input)
        #: checkpoints whose cut the output has not passed yet; an egress of one partition
        #: keeps the move cuts too: one that moves the last stage's groups from or to its
        #: partition holds the output past it (``holds``)
        self.cuts = Cuts(moves=partition is not None)
        if partition is None:
            self.fcons.keeps_no_moves()
        #: move cut number -> its cut: a move of the last stage's groups from or to this
        #: partition whose cut no complete checkpoint covers yet. Nothing numbered past the
        #: oldest leaves for the sink until one does: a restart from before it would send
        #: those keys' outputs to the other partition's sink (docs/design/rescaling.md)
        self.holds: Dict[int, int] = {}
        #: the cut of the newest complete checkpoint it knows of: a move cut at or below
        #: it holds nothing (a restart never goes back before it)
        self.covered = 0
        self.stages = stages

    def finished(self, accepted: int) -> bool:
        """Every output of the first ``accepted`` inputs was delivered: every item is
        numbered by its last input, so none of them is above ``accepted``, and the merge's
        frontier covers them all (DESIGN 4.3, 11)."""
        return accepted == 0 or self.fcons.frontier() + (INF,) >= (accepted, INF)

    def settled(self) -> int:
        """A largest n known such that every output of inputs 1..n was delivered: the
        last item released (numbered by its last input); or, from the frontier, every item
        up to a bound b is out, and an item holds at most ``batch_rows`` inputs, so the
        last of them is numbered above b - batch_rows (DESIGN 4.3, 11). A bound is no
        input count itself: b may lie inside an item that is still to come."""
        bound = item_bound(self.fcons.frontier())
        covered = bound[0] - self.batch_rows if bound and bound[0] != INF else 0
        return max(self.released, covered, 0)

    def stats(self) -> SegmentStats:
        """Counters for monitoring, as a segment's: outputs delivered and the
        tuples its merge holds."""
        return SegmentStats(self.addr, self.delivered, self.delivered, self.fcons.queued(),
                            0, 0, 0)

    def ready_for(self, src: Addr, msg) -> bool:
        return self.fcons.ready_for(src, msg)

    def on_message(self, src: Addr, msg) -> List:
        if isinstance(msg, PSync):
            effects = self.fcons.on_psync(src, msg)
        elif isinstance(msg, Restored):
            effects = self.fcons.on_restored(src, msg)
        elif isinstance(msg, Batch):
            effects = self.fcons.on_batch(src, msg)
            self.cuts.learn(msg.cut)
            self._hold_moves()
        elif isinstance(msg, CheckpointDone):
            return self.checkpoint_complete(msg.number, msg.cut)
        else:
            raise RemoteProtocolError(f"{self.addr}: unexpected {type(msg).__name__} from {src}")
        return effects + self._release()

    def checkpoint_complete(self, number: int, cut: int) -> List:
        """Checkpoint ``number``, cut at ``cut``, is complete (told at its start too: the
        newest when it was made): the moves of cuts up to it hold nothing any more (a
        restart never goes back before it)."""
        self.covered = max(self.covered, cut)
        for k, n in list(self.holds.items()):
            if n <= cut:
                del self.holds[k]
        self._report_moves()
        return self._release()

    def _release(self) -> List:
        effects, out, items = [], [], 0
        while self.fcons.can_release() and not self._held_back():
            item, rows = self.fcons.release()
            self.released = item[0]
            out.extend(rows.pairs())
            items += 1
        if out:
            self.delivered += len(out)
            effects.append(Deliver(tuple(out), self.partition or 0))
        if self.fcons.credits_due():
            # credited as handed to the sink: the runtime takes the next message only
            # once the sink returned, so a slow sink slows the last stage (back-pressure)
            effects.extend(self.fcons.credits())
        while self.cuts.pending and (due := self.cuts.due(self.fcons.frontier())) is not None:
            self.cuts.crossed(due[0])  # every output of inputs up to the cut is out
            effects.append(self.commit(*due))
        return effects + self.released_items(items)

    def _hold_moves(self) -> None:
        """Move cuts learned: one that moves the last stage's groups from or to this
        partition holds the output past it; every one is crossed at once (an egress
        routes nothing)."""
        if not self.cuts.keeps_moves:
            return
        for k in sorted(self.cuts.moves):
            n, moves = self.cuts.moves[k]
            if n > self.covered and any(m.stage == self.stages
                                        and self.partition in (m.source, m.dest)
                                        for m in owner_changes(moves)):
                self.holds[k] = n
            self.cuts.cross_moves(k)
        self._report_moves()

    def _report_moves(self) -> None:
        """The move cut its acks and credits say it crossed: below every one it holds
        for, so its producers keep telling those until a checkpoint covers them (a
        writer started again learns them again: DESIGN 13's forgetting)."""
        if self.cuts.keeps_moves:
            held = min(self.holds, default=None)
            crossed = self.cuts.moves_crossed
            self.fcons.moves_crossed = crossed if held is None else min(crossed, held - 1)

    def _held_back(self) -> bool:
        """The next item is numbered past a cut this partition holds for."""
        if not self.holds:
            return False
        head = self.fcons.next_item()
        return head is not None and head[0] > min(self.holds.values())

    def commit(self, number: int, cut: int) -> SinkCommit:
        """The sink commits what it holds, for checkpoint ``number`` (DESIGN 10)."""
        return SinkCommit(number, cut, self.partition or 0)

    def released_items(self, items: int) -> List:
        """``items`` more items went to the sink (a sink's writer counts them)."""
        return []

    def on_fail(self, dead: Set[Addr]) -> List:
        return self.fcons.on_fail(dead)

    def on_avail(self, avail, peer_mover=None) -> List:
        self.fcons.on_avail(avail.addr, avail.version)
        return []

    def on_join(self, partitions) -> List:
        """Dormant last-stage partitions run from now (docs/design/rescaling.md)."""
        for p in partitions:
            if self.partition is None:  # its feeds are the partitions, in order
                self.fcons.join(p)
            elif p == self.partition:  # its one feed
                self.fcons.join(0)
        return []

    def on_leave(self, partitions, cut: tuple = ()) -> List:
        """Last-stage partitions left (docs/design/rescaling.md): the merge waits for
        them no more, so what it holds may go now. An egress of one of them learns the
        cut that took their last groups (``cut``): every output of theirs is here, and no
        stamp of theirs may have brought it, so its sink commits there now (else that
        checkpoint, which their snapshots complete, would wait for the commit for good)."""
        for p in partitions:
            if self.partition is None:
                self.fcons.leave(p)
            elif p == self.partition:
                self.fcons.leave(0)
                self.cuts.learn(cut or None)
        return self._release()

    def idle(self) -> bool:
        return self.fcons.idle()

    def check_invariants(self) -> None:
        pass
