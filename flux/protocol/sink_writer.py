"""A sink's writer: the egress of one last-stage partition, run on a node beside one of
that partition's replicas instead of in the driver (docs/design/parallel_io.md).

The last stage's replicas keep every output until the writer's sink has committed it:
the writer acks nothing on receipt, and acks both replicas only once its sink returns
from a commit (``committed``). So whichever replica survives the writer's node holds
everything the sink may still lose, and a writer started again on the survivor's node
(``resume``) reads back what its sink committed, reverses the survivor from there, and
the sink (which fenced the old writer and dropped what it had not committed) gets every
output once. Opening that sink may wait on its store for a long time (a Kafka sink
waits for transactions a crash left open), so the runtime opens it off the node's loop:
meanwhile the writer is held (``hold``): it takes no message, and the views' failures
and standbys it is told wait for ``resume``, which takes them after it, in order, as a
writer whose sink opened at once would have. It commits at the checkpoint cuts it
crosses, as any egress does, and whenever ``commit_every`` items went to the sink since
its last commit: its producers' buffers hold what it did not commit, so it must commit
before they fill.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, List, Optional

from flux.effects import SinkCommit
from flux.protocol.egress import Egress
from flux.sequence import SN


class SinkWriter(Egress):
    """The egress of last-stage partition ``partition``, acking at its sink's commits."""

    def __init__(self, stages: int, partitions: int, partition: int, commit_every: int,
                 credit_every: int = 1, batch_rows: int = 1024):
        """``commit_every``: items sent to the sink before it commits (at most the last
        stage's buffer capacity, or the buffers fill and nothing moves)."""
        if commit_every < 1:
            raise ValueError(f"commit_every must be >= 1 item, got {commit_every}")
        super().__init__(stages, partitions, credit_every=credit_every, batch_rows=batch_rows,
                         partition=partition, acks_at_commit=True)
        self.commit_every = commit_every
        self.uncommitted = 0  # items sent to the sink since its last commit
        #: while its sink opens: the views' events told meanwhile (None: not held)
        self._held: Optional[List[Callable[[], List]]] = None

    def hold(self) -> None:
        """Its sink is being opened: nothing is taken until ``resume``."""
        self._held = []

    def held(self) -> bool:
        return self._held is not None

    def ready_for(self, src, msg) -> bool:
        return self._held is None and super().ready_for(src, msg)

    def on_fail(self, dead) -> List:
        if self._held is not None:
            self._held.append(partial(super().on_fail, set(dead)))
            return []
        return super().on_fail(dead)

    def on_avail(self, avail, peer_mover=None) -> List:
        if self._held is not None:
            self._held.append(partial(super().on_avail, avail, peer_mover))
            return []
        return super().on_avail(avail, peer_mover)

    def on_join(self, partitions) -> List:
        if self._held is not None:
            self._held.append(partial(super().on_join, frozenset(partitions)))
            return []
        return super().on_join(partitions)

    def on_leave(self, partitions, cut: tuple = ()) -> List:
        if self._held is not None:
            self._held.append(partial(super().on_leave, frozenset(partitions), cut))
            return []
        return super().on_leave(partitions, cut)

    def commit(self, number: int, cut: int) -> SinkCommit:
        self.uncommitted = 0
        return SinkCommit(number, cut, self.partition, self.fcons.feeds[0].taken)

    def released_items(self, items: int) -> List:
        self.uncommitted += items
        if self.uncommitted >= self.commit_every:
            return [self.commit(0, 0)]
        return []

    def commit_now(self) -> List:
        """A commit between checkpoints (a timer's, or the sink's own choice)."""
        return [self.commit(0, 0)] if self.uncommitted else []

    def bounds(self) -> tuple:
        """(frontier, settled): how far its outputs got (``Egress.settled``); taken right
        after a commit, how far its sink's committed outputs got."""
        return tuple(self.fcons.frontier()), self.settled()

    def committed(self, through: Optional[SN] = None) -> List:
        """The sink returned from a commit: both replicas may evict what it covers (up to
        its ``SinkCommit.through``; None: everything taken, the commit made at once)."""
        return self.fcons.commit_acks(through)

    def resume(self, last_output: Optional[SN], dead) -> List:
        """Start again on another node (the old one died) after ``last_output``, the SN of
        the last output the sink committed (None: none), which every exactly-once sink
        reads back; ``dead`` are the replicas the views declared failed.

        An output's SN starts with its input's number n (DESIGN 4.1), and the sink
        commits whole items, each numbered by its last input: the item that held n, and
        every one before it, is committed, and items after it are numbered above n. So
        the survivor sends from after sub-item (n - 1, partition): the committed item
        again if it is numbered above n (the sink drops its outputs, none above
        ``last_output``), and everything after it. ``dead``: as when the view started
        it; what views told a held writer since is taken after, in order."""
        held, self._held = self._held or [], None
        self.fcons.mark_dead(set(dead))
        n = last_output[0] if last_output else 0
        self.released = max(n - 1, 0)
        effects = self.fcons.resume((n - 1, self.partition) if n else ())
        for event in held:
            effects.extend(event())
        return effects
