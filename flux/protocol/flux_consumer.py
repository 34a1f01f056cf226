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
feed once ``credit_every`` tuples were taken since the last one, or once the
feed's queue is empty (so a full window never waits on a feed the merge does
not need). Credits are cumulative SNs: one lost in a change of roles costs
nothing, the next one covers it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from exchange.merge import OrderedMerge
from flux.addresses import Addr, other
from flux.control_messages import FoldedIn
from flux.data_messages import Ack, Batch, Credit, CSync, Item, Pause, PauseAck, PSync, Reverse
from flux.effects import Send
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.protocol.producer import ACTIVE, DEAD, STDBY, Status
from flux.sequence import NO_SN, SN


@dataclass(slots=True)
class Source:
    """One producer replica as this consumer sees it: its status (Figures 4, 5) and,
    for catch-up, its last sync version and the version a standby is expected with."""

    addr: Addr
    status: Status = ACTIVE
    ver: int = 0
    expected: int = 0


@dataclass(slots=True)
class Feed:
    """Producer partition j: its two replicas, the one we take data from (conn has RECV),
    the one we ack to (conn has ACK), and whether a pause-ack is awaited (5.3.1)."""

    replicas: Tuple[Source, Source]
    data_from: Optional[int]
    ack_to: Optional[int]
    awaiting_pause_ack: bool = False
    #: back-pressure: tuples taken from the merge since the last credit, the last one's SN
    owed: int = 0
    taken: SN = NO_SN

    def single(self) -> bool:
        """Both replicas are one process (the ingress): it never fails over."""
        return self.replicas[0].addr == self.replicas[1].addr

    def data_source(self) -> Optional[Addr]:
        return None if self.data_from is None else self.replicas[self.data_from].addr


class FluxConsumer:
    """Receives, acks and merges the streams of every producer partition."""

    def __init__(self, addr: Addr, producers: Sequence[Sequence[Addr]], absent: Set[Addr] = frozenset(),
                 credit_every: int = 1):
        """``producers[j]`` is (replica P, replica S) of producer partition j; ``absent``
        lists producer replicas that never exist (the baselines of DESIGN 7);
        ``credit_every``: tuples taken before a credit goes out (a fraction of the window)."""
        if credit_every < 1:
            raise ValueError(f"credit_every must be >= 1, got {credit_every}")
        r = addr.replica
        self.addr = addr
        self.credit_every = credit_every
        self.dual = Addr(addr.stage, addr.partition, other(r))
        #: feeds[j]: producer partition j; data from replica r, acks to replica 1-r (5.1)
        self.feeds: List[Feed] = [
            Feed((Source(pair[0]), Source(pair[1])), data_from=r, ack_to=other(r))
            for pair in producers
        ]
        self.merge = OrderedMerge(range(len(self.feeds)))
        self.p_fail = False
        if absent:
            self.mark_dead(set(absent))
            for feed in self.feeds:
                if feed.replicas[other(r)].status is DEAD:
                    feed.ack_to = None
        self._partition_of: Dict[Addr, int] = {}
        for j, feed in enumerate(self.feeds):
            for source in feed.replicas:
                self._partition_of[source.addr] = j

    def on_batch(self, src: Addr, msg: Batch) -> List[Send]:
        """Take a batch from our data source and ack it at once to the dual producer."""
        j = self._partition_of.get(src)
        if j is None or self.feeds[j].data_source() != src:
            raise RemoteProtocolError(f"{self.addr}: data from {src}, which is not a data source")
        feed = self.feeds[j]
        last = self.merge.push(j, msg.items, msg.bound)
        if msg.items and feed.ack_to is not None:
            return [Send(self.addr, feed.replicas[feed.ack_to].addr, Ack(last))]
        return []

    def on_fail(self, dead: Set[Addr]) -> List[Send]:
        """Figure 4 action 1, per producer partition; p_fail when our dual dies (5.2)."""
        effects: List[Send] = []
        if self.dual in dead:
            self.p_fail = True
        for j, feed in enumerate(self.feeds):
            if feed.single():
                continue
            newly = [x for x, s in enumerate(feed.replicas) if s.addr in dead and s.status is not DEAD]
            for x in newly:
                feed.replicas[x].status = DEAD
                if x == feed.ack_to:
                    feed.ack_to = None
            y_alive = [y for y, s in enumerate(feed.replicas) if s.status is ACTIVE]
            if newly and feed.data_from not in y_alive:
                # Our data source died, or a standby we were about to take data from
                # did: the survivor sends from what we hold (Figure 4 action 1).
                if y_alive:
                    y = y_alive[0]
                    effects.append(Send(self.addr, feed.replicas[y].addr, Reverse(self.merge.last[j])))
                    feed.data_from, feed.ack_to = y, None
                else:
                    feed.data_from = None  # both replicas lost: the job stops
                feed.awaiting_pause_ack = False
        return effects

    # -- the merge, for the segment and the egress (4.1) ----------------------
    def can_release(self) -> bool:
        """An input may leave the merge in SN order."""
        return self.merge.ready()

    def release(self) -> Item:
        """The next input in SN order; call only when ``can_release``."""
        j, item = self.merge.pop_from()
        feed = self.feeds[j]
        feed.owed += 1
        feed.taken = item[0]
        return item

    def release_run(self, limit: int) -> List[Tuple[int, Item]]:
        """Up to ``limit`` inputs that may leave the merge now, in SN order, each with its
        feed. The caller says which it ``took`` and may ``put_back`` the rest."""
        return self.merge.pop_ready_from(limit)

    def took(self, released: List[Tuple[int, Item]]) -> None:
        """Inputs of ``release_run`` were taken: count them for the credits."""
        feeds = self.feeds
        for j, item in released:
            feed = feeds[j]
            feed.owed += 1
            feed.taken = item[0]

    def put_back(self, released: List[Tuple[int, Item]]) -> None:
        """Inputs of ``release_run`` that were not taken: the merge's heads again."""
        self.merge.unpop(released)

    def release_ready(self) -> List[Item]:
        """Every input that may leave the merge now, in SN order."""
        released = self.merge.pop_ready_from()
        self.took(released)
        return [item for _, item in released]

    # -- back-pressure ---------------------------------------------------------
    def _credit_due(self, j: int) -> bool:
        feed = self.feeds[j]
        return feed.owed > 0 and feed.data_from is not None and (
            feed.owed >= self.credit_every or self.merge.queued_from(j) == 0)

    def credits_due(self) -> bool:
        return any(self._credit_due(j) for j in range(len(self.feeds)))

    def credits(self) -> List[Send]:
        """A credit to each data source owed one (see the module's docstring)."""
        effects = []
        for j, feed in enumerate(self.feeds):
            if self._credit_due(j):
                effects.append(Send(self.addr, feed.data_source(), Credit(feed.taken)))
                feed.owed = 0
        return effects

    def frontier(self) -> SN:
        """A bound on every SN the merge will still release (DESIGN 4.3)."""
        return self.merge.frontier()

    def queued(self) -> int:
        return self.merge.queued()

    # -- catch-up (3.3, 5.3) ------------------------------------------------
    def mark_dead(self, dead: Set[Addr]) -> None:
        """A new replica not yet installed only notes failures: it talks to nobody yet."""
        for feed in self.feeds:
            if not feed.single():
                for source in feed.replicas:
                    if source.addr in dead:
                        source.status = DEAD

    def reverse_dead_sources(self) -> List[Send]:
        """At install: where our same-side producer is dead, the other one must send to us.
        The reverse follows our csync on that connection, so it finds us ACTIVE."""
        effects = []
        r = self.addr.replica
        for j, feed in enumerate(self.feeds):
            if feed.single():
                continue
            mine, theirs = feed.replicas[r], feed.replicas[other(r)]
            if mine.status is DEAD and theirs.status is ACTIVE:
                feed.data_from, feed.ack_to = other(r), None
                effects.append(Send(self.addr, theirs.addr, Reverse(self.merge.last[j])))
            elif theirs.status is DEAD:
                feed.ack_to = None
        return effects

    def on_avail(self, addr: Addr, version: int) -> None:
        """Figure 5 avail(dest): a standby will replace this dead producer replica."""
        for feed in self.feeds:
            for source in feed.replicas:
                if source.addr == addr:
                    if source.status is not DEAD:
                        raise RemoteProtocolError(
                            f"{self.addr}: avail for {addr}, which is {source.status.name}")
                    source.status, source.expected = STDBY, version

    def pause(self, version: int) -> List[Send]:
        """5.3.1: ask every data source to stop; drain until each pause-ack arrives."""
        effects = []
        for feed in self.feeds:
            if feed.data_from is not None:
                effects.append(Send(self.addr, feed.data_source(), Pause(version)))
                feed.awaiting_pause_ack = True
        return effects

    def awaiting_pause_acks(self) -> bool:
        return any(feed.awaiting_pause_ack for feed in self.feeds)

    def on_pause_ack(self, src: Addr, msg: PauseAck) -> bool:
        """A data source paused after its last data; True once every source has."""
        j = self._partition_of.get(src)
        if j is None or not self.feeds[j].awaiting_pause_ack or self.feeds[j].data_source() != src:
            raise RemoteProtocolError(f"{self.addr}: unexpected pause-ack from {src}")
        self.feeds[j].awaiting_pause_ack = False
        return not self.awaiting_pause_acks()

    def cancel_pause(self) -> None:
        """The catch-up was aborted (3.4): stop waiting for pause-acks; late ones are ignored."""
        for feed in self.feeds:
            feed.awaiting_pause_ack = False

    def end_catchup(self) -> None:
        """5.3.2: our dual is whole again."""
        self.p_fail = False

    def csyncs(self, version: int) -> List[Send]:
        """5.3.2: csync to every live producer replica, after our acks on each connection."""
        sent, effects = set(), []
        for feed in self.feeds:
            for source in feed.replicas:
                if source.status is ACTIVE and source.addr not in sent:
                    sent.add(source.addr)
                    effects.append(Send(self.addr, source.addr, CSync(version)))
        return effects

    def _sync_roles(self, src: Addr, version: int):
        """(partition, replica of src, active replica, standby replica) for a psync, or None if stale."""
        j = self._partition_of.get(src)
        if j is None:
            raise RemoteProtocolError(f"{self.addr}: psync from {src}, not a producer of ours")
        feed = self.feeds[j]
        x = 0 if feed.replicas[0].addr == src else 1
        standby = next((y for y, s in enumerate(feed.replicas)
                        if s.status is STDBY and s.expected == version), None)
        if standby is None or feed.replicas[other(standby)].status is not ACTIVE:
            return None
        return j, x, other(standby), standby

    def ready_for(self, src: Addr, msg) -> bool:
        """5.3.2: the psync of the replica that will send us data waits for the other's,
        holding that replica's later data behind it."""
        if not isinstance(msg, PSync):
            return True
        roles = self._sync_roles(src, msg.version)
        if roles is None:
            return True
        j, x, active, standby = roles
        if x == self.addr.replica:  # src will be (or stay) our data source
            return self.feeds[j].replicas[other(x)].ver == msg.version
        return True

    def on_psync(self, src: Addr, msg: PSync) -> List:
        roles = self._sync_roles(src, msg.version)
        if roles is None:
            # A stale sync changes no role (3.4). But a reversed source stopped forwarding
            # to us at its psync, and its standby is gone: ask it to go on.
            j = self._partition_of[src]
            feed = self.feeds[j]
            x = 0 if feed.replicas[0].addr == src else 1
            if feed.data_from == x and x != self.addr.replica:
                return [Send(self.addr, src, Reverse(self.merge.last[j]))]
            return []
        j, x, active, standby = roles
        feed, v = self.feeds[j], msg.version
        if x == self.addr.replica and feed.replicas[other(x)].ver != v:
            raise LocalProtocolError(f"{self.addr}: psync from {src} taken before its replica's "
                                     "(its guard, DESIGN 4.4)")
        feed.replicas[x].ver = v
        if x == active and x != self.addr.replica:
            feed.data_from = None  # our reversed source stops here (5.3.2)
        if feed.replicas[other(x)].ver != v:
            return []
        # Both psyncs: data from our side, acks to the other, whoever was active (DESIGN 4.6).
        feed.replicas[standby].status = ACTIVE
        feed.data_from = self.addr.replica
        feed.ack_to = other(self.addr.replica)
        return [FoldedIn(self.addr, feed.replicas[standby].addr, v)]

    def get_state(self) -> list:
        return self.merge.to_state()

    def install_state(self, state: list) -> None:
        self.merge.install_state(state)

    def idle(self) -> bool:
        return self.merge.queued() == 0
