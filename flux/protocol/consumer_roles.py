"""How a consumer's producer replicas change roles: take-over (Figure 4 action 1, 5.2)
and catch-up (Figure 5, 3.3, 5.3).

A part of ``flux.protocol.flux_consumer.FluxConsumer`` (its attributes are the
consumer's): the data path (batches, the merge, credits) lives there, the events that
change which replica of producer partition j we take data from (``data_from``) and ack
to (``ack_to``) live here.
"""
from __future__ import annotations

from typing import List, Set

from flux.addresses import Addr, other
from flux.control_messages import FoldedIn
from flux.data_messages import Ack, CSync, Pause, PauseAck, PSync, Stay
from flux.effects import Send
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.protocol.links import ACTIVE, DEAD, STDBY


class ConsumerRoles:
    """Take-over and catch-up events of a consumer; mixed into ``FluxConsumer``."""

    # -- take-over (Figure 4 action 1, 5.2) --------------------------------------
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
            if newly and feed.in_handback():
                effects += self._handback_fail(j, set(newly))
            if newly and feed.data_from not in y_alive:
                # Our data source died, or a standby we were about to take data from
                # did: the survivor sends from what we hold (Figure 4 action 1).
                if y_alive:
                    y = y_alive[0]
                    effects.append(self.reverse_to(j, y))
                    feed.data_from, feed.ack_to = y, None
                else:
                    feed.data_from = None  # both replicas lost: the job stops
                feed.awaiting_pause_ack = False
        return effects

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
                effects.append(self.reverse_to(j, other(r)))
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
                if msg.forwards:  # it never stopped: we stay with it (docs/design/handback.md)
                    return [Send(self.addr, src, Stay(msg.version))]
                return [self.reverse_to(j, x)]
            return []
        j, x, active, standby = roles
        feed, v = self.feeds[j], msg.version
        if x == self.addr.replica and feed.replicas[other(x)].ver != v:
            raise LocalProtocolError(f"{self.addr}: psync from {src} taken before its replica's "
                                     "(its guard, DESIGN 4.4)")
        feed.replicas[x].ver = v
        if x == active and x != self.addr.replica:
            if msg.forwards:  # it goes on until we hand back (docs/design/handback.md)
                feed.forwarded = v
            else:
                feed.data_from = None  # our reversed source stops here (5.3.2)
        if feed.replicas[other(x)].ver != v:
            return []
        # Both psyncs: data from our side, acks to the other, whoever was active (DESIGN 4.6).
        feed.replicas[standby].status = ACTIVE
        fold = FoldedIn(self.addr, feed.replicas[standby].addr, v)
        if self._begin_handback(j, standby, fold):
            return []  # the active feeds us until the new replica catches up
        feed.data_from = self.addr.replica
        feed.ack_to = other(self.addr.replica)
        effects = [fold]
        if self.acks_at_commit and feed.committed:
            # a sink's writer: the new replica's buffer is the active's at its snapshot,
            # our commits since acked only the active, and none of them between its psync
            # and this one (no data source then) (docs/design/parallel_io.md)
            effects += [Send(self.addr, replica.addr, Ack(feed.committed, self.moves_crossed))
                        for replica in feed.replicas]
        return effects
