"""F-Cons: the bottom of a segment, and the egress's input (paper 5.1, 5.2).

Replica r of consumer partition i takes data from replica r of every producer
partition j and acks each batch, *before* the tuples are processed, to the
dual producer (replica 1-r): that ack is what lets the dual evict the same
tuples, and what it filters duplicates with after a failure (5.1).

Take-over is the egress's rule of Figure 4 action 1: when the producer
replica we take data from dies, send ``reverse`` (with everything we hold)
to the survivor and take data from it, acking nobody. When the replica we
ack dies, stop acking. The death of our own dual only matters for catch-up
(``p_fail``).

The ingress is a producer partition whose two replicas are one process: we
take data from it and ack to it.

Back-pressure (docs/design/backpressure.md): acks say what we *hold*, credits what we
*took* from the merge to process. A credit goes to the data source of that
feed once ``credit_every`` sub-items were taken since the last one, or once the
feed's queue is empty (so a full window never waits on a feed the merge does
not need). Credits are cumulative SNs: one lost in a change of roles costs
nothing, the next one covers it.

Take-over and catch-up, the events that change which replica of a producer partition
we take data from and ack to, are in ``flux.protocol.consumer_roles``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from exchange.merge import OrderedMerge
from exchange.row_states import rows_from_state, rows_to_state
from exchange.rows import NumberedRows, merge as merge_rows
from flux.addresses import Addr, other
from flux.data_messages import Ack, Batch, Credit, Reverse
from flux.effects import Send
from flux.errors import RemoteProtocolError
from flux.control_messages import FoldedIn
from flux.protocol.consumer_handback import HandBack
from flux.protocol.consumer_roles import ConsumerRoles
from flux.protocol.links import ACTIVE, DEAD, Status
from flux.sequence import NO_SN, SN


@dataclass(slots=True)
class ProducerReplica:
    """One producer replica as this consumer sees it: its status (Figures 4, 5) and,
    for catch-up, its last sync version and the version a standby is expected with."""

    addr: Addr
    status: Status = ACTIVE
    ver: int = 0
    expected: int = 0


@dataclass(slots=True)
class ProducerPair:
    """Producer partition j: its two replicas, the one we take data from (conn has RECV),
    the one we ack to (conn has ACK), and whether a pause-ack is awaited (5.3.1)."""

    replicas: Tuple[ProducerReplica, ProducerReplica]
    data_from: Optional[int]
    ack_to: Optional[int]
    awaiting_pause_ack: bool = False
    #: back-pressure: tuples taken from the merge since the last credit, the last one's SN
    owed: int = 0
    taken: SN = NO_SN
    #: a sink's writer: the last SN its sink committed, acked to both replicas
    committed: SN = NO_SN
    #: the newest move cut crossed that its replicas were told (DESIGN 13)
    moves_told: Optional[int] = 0
    #: a partition not running yet: it sends nothing, the merge waits for nothing of it
    #: (docs/design/rescaling.md)
    dormant: bool = False
    #: the hand-back (flux.protocol.consumer_handback): the active goes on sending to us
    #: after its psync; the new replica we drop data of until it reaches what we hold;
    #: the active whose last data we take only where new, until its Restored; the
    #: fold-in report held until then
    forwarded: Optional[int] = None  # the version of the active's psync that said so
    listen: Optional[int] = None
    drain: Optional[int] = None
    fold: Optional[FoldedIn] = None
    #: ... and our side, the data source again, may still send items we hold; how far
    #: it has sent (its last item, or past its bound)
    behind: bool = False
    reached: tuple = ()

    def in_handback(self) -> bool:
        return (self.forwarded is not None or self.listen is not None
                or self.drain is not None or self.behind)

    def single(self) -> bool:
        """Both replicas are one process (the ingress): it never fails over."""
        return self.replicas[0].addr == self.replicas[1].addr

    def data_source(self) -> Optional[Addr]:
        return None if self.data_from is None else self.replicas[self.data_from].addr


class FluxConsumer(ConsumerRoles, HandBack):
    """Receives, acks and merges the streams of every producer partition."""

    def __init__(self, addr: Addr, producers: Sequence[Sequence[Addr]], absent: Set[Addr] = frozenset(),
                 credit_every: int = 1, acks_at_commit: bool = False,
                 dormant: Iterable[int] = ()):
        """``producers[j]`` is (replica P, replica S) of producer partition j; ``absent``
        lists producer replicas that never exist (the baselines of DESIGN 7); ``dormant``:
        producer partitions not running yet (``join`` turns one on);
        ``credit_every``: tuples taken before a credit goes out (a fraction of the window);
        ``acks_at_commit``: a sink's writer, which acks nothing on receipt and both
        replicas at its sink's commits (``commit_acks``, docs/design/parallel_io.md)."""
        self.acks_at_commit = acks_at_commit
        if credit_every < 1:
            raise ValueError(f"credit_every must be >= 1, got {credit_every}")
        r = addr.replica
        self.addr = addr
        self.credit_every = credit_every
        self.dual = Addr(addr.stage, addr.partition, other(r))
        #: feeds[j]: producer partition j; data from replica r, acks to replica 1-r (5.1)
        self.feeds: List[ProducerPair] = [
            ProducerPair((ProducerReplica(pair[0]), ProducerReplica(pair[1])), data_from=r,
                         ack_to=other(r))
            for pair in producers
        ]
        self.merge = OrderedMerge(range(len(self.feeds)))
        self.p_fail = False
        #: the newest move cut its segment crossed, told in every ack and credit so the
        #: producers forget what every consumer crossed (None: it keeps no moves, an
        #: egress; DESIGN 13)
        self.moves_crossed: Optional[int] = 0
        if absent:
            self.mark_dead(set(absent))
            for feed in self.feeds:
                if feed.replicas[other(r)].status is DEAD:
                    feed.ack_to = None
        self._partition_of: Dict[Addr, int] = {}
        for j, feed in enumerate(self.feeds):
            for source in feed.replicas:
                self._partition_of[source.addr] = j
        for j in dormant:
            feed = self.feeds[j]
            feed.dormant, feed.data_from, feed.ack_to = True, None, None
            for source in feed.replicas:
                source.status = DEAD
            self.merge.sleep(j)

    def join(self, j: int) -> None:
        """Dormant producer partition ``j`` runs from now: data from our side, acks to the
        other, its bound none yet (docs/design/rescaling.md: nothing we released can lie
        above what it will send). A join applied again is nothing."""
        feed = self.feeds[j]
        self.merge.rejoin(j)  # (an installed state may have it dormant still)
        if not feed.dormant:
            return
        r = self.addr.replica
        feed.dormant, feed.data_from, feed.ack_to = False, r, other(r)
        for source in feed.replicas:
            source.status = ACTIVE

    def leave(self, j: int) -> None:
        """Producer partition ``j`` left (docs/design/rescaling.md): both its replicas
        crossed the cut that took its last groups and every consumer acked all they sent,
        so the feed sends nothing more and the merge waits for no bound of it. A leave
        applied again (or over a state that had it) is nothing."""
        feed = self.feeds[j]
        self.merge.leave(j)
        if feed.dormant:
            return
        feed.dormant, feed.data_from, feed.ack_to = True, None, None
        feed.awaiting_pause_ack = False
        feed.forwarded = feed.listen = feed.drain = feed.fold = None
        feed.behind, feed.reached = False, ()
        for source in feed.replicas:
            source.status = DEAD

    def on_batch(self, src: Addr, msg: Batch) -> List[Send]:
        """Take a batch from our data source and ack it at once to the dual producer."""
        j = self._partition_of.get(src)
        feed = None if j is None else self.feeds[j]
        effects = []
        if feed is not None and feed.in_handback():
            msg, effects = self._handback_batch(j, src, msg)
            if msg is None:
                return effects
        elif feed is None or feed.data_source() != src:
            raise RemoteProtocolError(f"{self.addr}: data from {src}, which is not a data source")
        last = self.merge.push(j, msg.items, msg.bound)
        news = feed.moves_told != self.moves_crossed  # told even while no data comes
        if (msg.items or news) and feed.ack_to is not None and not self.acks_at_commit:
            effects.append(Send(self.addr, feed.replicas[feed.ack_to].addr,
                                Ack(last, self.moves_crossed)))
        if news and not msg.items:  # (with items, their credit tells it)
            effects.append(Send(self.addr, src, Credit(feed.taken, self.moves_crossed)))
        feed.moves_told = self.moves_crossed
        return effects

    def keeps_no_moves(self) -> None:
        """An egress routes nothing: move cuts are not for it, and its producers need
        not keep them for it (DESIGN 13)."""
        self.moves_crossed = None
        for feed in self.feeds:
            feed.moves_told = None

    # -- a sink's writer (docs/design/parallel_io.md) ------------------------------
    def commit_acks(self, through: Optional[SN] = None) -> List[Send]:
        """The sink committed everything released (up to ``through``, where the commit ran
        while more was released: a runtime's sink commits off its loop): both replicas may
        evict it now."""
        effects = []
        for feed in self.feeds:
            upto = feed.taken if through is None else through
            if upto <= feed.committed:
                continue
            feed.committed = upto
            for y in {feed.data_from, feed.ack_to} - {None}:
                effects.append(Send(self.addr, feed.replicas[y].addr,
                                    Ack(feed.committed, self.moves_crossed)))
        return effects

    def reverse_to(self, j: int, y: int) -> Send:
        """Figure 4 action 1's reverse, to replica y of producer partition j: send from
        after what we hold; a writer lets the producer evict only what its sink committed."""
        feed = self.feeds[j]
        held = self.merge.last[j]
        msg = Reverse(feed.committed, held) if self.acks_at_commit else Reverse(held)
        return Send(self.addr, feed.replicas[y].addr, msg)

    def resume(self, committed: SN) -> List[Send]:
        """A sink's writer started again (its old node died) from what the sink committed
        of its one producer partition: data from a live replica (ours first), acks to the
        other if it lives, and a reverse that tells the data source where to start."""
        feed = self.feeds[0]
        alive = [y for y in (self.addr.replica, other(self.addr.replica))
                 if feed.replicas[y].status is ACTIVE]
        if not alive:
            feed.data_from = feed.ack_to = None
            return []
        feed.data_from = alive[0]
        feed.ack_to = alive[1] if len(alive) > 1 else None
        feed.committed = feed.taken = committed
        self.merge.resume_after(0, committed)
        return [self.reverse_to(0, alive[0])]

    # -- the merge, for the segment and the egress (4.1, DESIGN 11) --------------
    def can_release(self) -> bool:
        """An item may leave the merge whole, in SN order."""
        return self.merge.ready()

    def next_item(self) -> Optional[SN]:
        """The SN of the item ``release`` would give next (None: none queued)."""
        head = self.merge.head()
        return None if head is None else head[1][:-1]

    def release(self) -> Tuple[SN, NumberedRows]:
        """The next item in SN order, its sub-items merged by row SN; call only when
        ``can_release``. Each sub-item taken counts toward its feed's credit."""
        released = self.merge.pop_item()
        feeds = self.feeds
        for j, (sn, _) in released:
            feed = feeds[j]
            feed.owed += 1
            feed.taken = sn
        return released[0][1][0][:-1], merge_rows([rows for _, (_, rows) in released])

    # -- back-pressure ---------------------------------------------------------
    def _credit_due(self, j: int) -> bool:
        feed = self.feeds[j]
        return feed.owed > 0 and feed.data_from is not None and (
            feed.owed >= self.credit_every or self.merge.queued_from(j) == 0)

    def credits_due(self) -> bool:
        for j, feed in enumerate(self.feeds):
            if feed.owed > 0 and self._credit_due(j):
                return True
        return False

    def credits(self) -> List[Send]:
        """A credit to each data source owed one (see the module's docstring)."""
        effects = []
        for j, feed in enumerate(self.feeds):
            if self._credit_due(j):
                credit = Credit(feed.taken, self.moves_crossed)
                effects.append(Send(self.addr, feed.data_source(), credit))
                effects += self._listen_credits(j, credit)
                feed.owed = 0
        return effects

    def frontier(self) -> SN:
        """A bound on every SN the merge will still release (DESIGN 4.3)."""
        return self.merge.frontier()

    def queued(self) -> int:
        return self.merge.queued()

    def get_state(self) -> list:
        return self.merge.to_state(rows_to_state)

    def install_state(self, state: list) -> None:
        self.merge.install_state(state, rows_from_state)

    def idle(self) -> bool:
        return self.merge.queued() == 0
