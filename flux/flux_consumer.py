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
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set

from exchange.merge import OrderedMerge
from flux.addresses import Addr, other
from flux.control_messages import FoldedIn
from flux.data_messages import Ack, Batch, CSync, Pause, PauseAck, PSync, Reverse
from flux.effects import Send
from flux.errors import ProtocolError
from flux.producer import ACTIVE, DEAD, STDBY


class FluxConsumer:
    """Receives, acks and merges the streams of every producer partition."""

    def __init__(self, addr: Addr, producers: Sequence[Sequence[Addr]], absent: Set[Addr] = frozenset()):
        """``producers[j]`` is (replica P, replica S) of producer partition j; ``absent``
        lists producer replicas that never exist (the baselines of DESIGN 7)."""
        r = addr.replica
        self.addr = addr
        self.dual = Addr(addr.stage, addr.partition, other(r))
        self.sources: List[Sequence[Addr]] = [tuple(pair) for pair in producers]
        self.status = [[ACTIVE, ACTIVE] for _ in self.sources]
        #: data_from[j]: the replica of producer j we take data from (conn has RECV).
        self.data_from: List[Optional[int]] = [r] * len(self.sources)
        #: ack_to[j]: the replica of producer j we ack to (conn has ACK), or None.
        self.ack_to: List[Optional[int]] = [other(r)] * len(self.sources)
        self.merge = OrderedMerge(range(len(self.sources)))
        self.p_fail = False
        #: catch-up: sync versions seen and expected per producer replica; pauses in flight
        self.ver = [[0, 0] for _ in self.sources]
        self.expected = [[0, 0] for _ in self.sources]
        self.awaiting_pause_ack: Set[int] = set()
        if absent:
            self.mark_dead(set(absent))
            for j in range(len(self.sources)):
                if self.status[j][other(r)] == DEAD:
                    self.ack_to[j] = None
        self._partition_of: Dict[Addr, int] = {}
        for j, pair in enumerate(self.sources):
            for a in pair:
                self._partition_of[a] = j

    def on_batch(self, src: Addr, msg: Batch) -> List[Send]:
        """Take a batch from our data source and ack it at once to the dual producer."""
        j = self._partition_of.get(src)
        if j is None or self.data_from[j] is None or self.sources[j][self.data_from[j]] != src:
            raise ProtocolError(f"{self.addr}: data from {src}, which is not a data source")
        last = self.merge.push(j, msg.items, msg.bound)
        if msg.items and self.ack_to[j] is not None:
            return [Send(self.addr, self.sources[j][self.ack_to[j]], Ack(last))]
        return []

    def on_fail(self, dead: Set[Addr]) -> List[Send]:
        """Figure 4 action 1, per producer partition; p_fail when our dual dies (5.2)."""
        effects: List[Send] = []
        if self.dual in dead:
            self.p_fail = True
        for j, pair in enumerate(self.sources):
            newly = [x for x in (0, 1) if pair[x] in dead and self.status[j][x] != DEAD
                     and pair[x] != pair[other(x)]]
            for x in newly:
                self.status[j][x] = DEAD
            for x in newly:
                if x == self.ack_to[j]:
                    self.ack_to[j] = None
            y_alive = [y for y in (0, 1) if self.status[j][y] == ACTIVE]
            if newly and self.data_from[j] not in y_alive:
                # Our data source died, or a standby we were about to take data from
                # did: the survivor sends from what we hold (Figure 4 action 1).
                if y_alive:
                    y = y_alive[0]
                    effects.append(Send(self.addr, pair[y], Reverse(self.merge.last[j])))
                    self.data_from[j] = y
                    self.ack_to[j] = None
                else:
                    self.data_from[j] = None  # both replicas lost: the job stops
                self.awaiting_pause_ack.discard(j)
        return effects

    # -- catch-up (3.3, 5.3) ------------------------------------------------
    def mark_dead(self, dead: Set[Addr]) -> None:
        """A new replica not yet installed only notes failures: it talks to nobody yet."""
        for j, pair in enumerate(self.sources):
            for x in (0, 1):
                if pair[x] in dead and pair[x] != pair[other(x)]:
                    self.status[j][x] = DEAD

    def reverse_dead_sources(self) -> List[Send]:
        """At install: where our same-side producer is dead, the other one must send to us.
        The reverse follows our csync on that connection, so it finds us ACTIVE."""
        effects = []
        for j, pair in enumerate(self.sources):
            if pair[0] == pair[1]:
                continue
            r = self.addr.replica
            if self.status[j][r] == DEAD and self.status[j][other(r)] == ACTIVE:
                self.data_from[j] = other(r)
                self.ack_to[j] = None
                effects.append(Send(self.addr, pair[other(r)], Reverse(self.merge.last[j])))
            elif self.status[j][other(r)] == DEAD:
                self.ack_to[j] = None
        return effects

    def on_avail(self, addr: Addr, version: int) -> None:
        """Figure 5 avail(dest): a standby will replace this dead producer replica."""
        for j, pair in enumerate(self.sources):
            for x in (0, 1):
                if pair[x] == addr:
                    if self.status[j][x] != DEAD:
                        raise ProtocolError(f"{self.addr}: avail for {addr}, which is {self.status[j][x]}")
                    self.status[j][x] = STDBY
                    self.expected[j][x] = version

    def pause(self, version: int) -> List[Send]:
        """5.3.1: ask every data source to stop; drain until each pause-ack arrives."""
        effects = []
        for j, pair in enumerate(self.sources):
            if self.data_from[j] is not None:
                effects.append(Send(self.addr, pair[self.data_from[j]], Pause(version)))
                self.awaiting_pause_ack.add(j)
        return effects

    def on_pause_ack(self, src: Addr, msg: PauseAck) -> bool:
        """A data source paused after its last data; True once every source has."""
        j = self._partition_of.get(src)
        if j not in self.awaiting_pause_ack or self.sources[j][self.data_from[j]] != src:
            raise ProtocolError(f"{self.addr}: unexpected pause-ack from {src}")
        self.awaiting_pause_ack.discard(j)
        return not self.awaiting_pause_ack

    def csyncs(self, version: int) -> List[Send]:
        """5.3.2: csync to every live producer replica, after our acks on each connection."""
        sent, effects = set(), []
        for j, pair in enumerate(self.sources):
            for x in (0, 1):
                if self.status[j][x] == ACTIVE and pair[x] not in sent:
                    sent.add(pair[x])
                    effects.append(Send(self.addr, pair[x], CSync(version)))
        return effects

    def _sync_roles(self, src: Addr, version: int):
        """(partition, replica of src, active replica, standby replica) for a psync, or None if stale."""
        j = self._partition_of.get(src)
        if j is None:
            raise ProtocolError(f"{self.addr}: psync from {src}, not a producer of ours")
        x = self.sources[j].index(src)
        standby = next((y for y in (0, 1) if self.status[j][y] == STDBY
                        and self.expected[j][y] == version), None)
        if standby is None or self.status[j][other(standby)] != ACTIVE:
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
        mine = self.addr.replica
        if x == mine:  # src will be (or stay) our data source
            return self.ver[j][other(x)] == msg.version
        return True

    def on_psync(self, src: Addr, msg: PSync) -> List:
        roles = self._sync_roles(src, msg.version)
        if roles is None:
            # A stale sync changes no role (3.4). But a reversed source stopped forwarding
            # to us at its psync, and its standby is gone: ask it to go on.
            j = self._partition_of[src]
            x = self.sources[j].index(src)
            if self.data_from[j] == x and x != self.addr.replica:
                return [Send(self.addr, src, Reverse(self.merge.last[j]))]
            return []
        j, x, active, standby = roles
        v = msg.version
        if x == self.addr.replica and self.ver[j][other(x)] != v:
            raise ProtocolError(f"{self.addr}: psync from {src} before its replica's")
        self.ver[j][x] = v
        if x == active and x != self.addr.replica:
            self.data_from[j] = None  # our reversed source stops here (5.3.2)
        if self.ver[j][other(x)] != v:
            return []
        # Both psyncs: data from our side, acks to the other, whoever was active (DESIGN 4.6).
        self.status[j][standby] = ACTIVE
        self.data_from[j] = self.addr.replica
        self.ack_to[j] = other(self.addr.replica)
        return [FoldedIn(self.addr, self.sources[j][standby], v)]

    def get_state(self) -> list:
        return self.merge.to_state()

    def install_state(self, state: list) -> None:
        self.merge.install_state(state)

    def idle(self) -> bool:
        return self.merge.queued() == 0
