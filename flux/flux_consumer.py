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
from flux.messages import Ack, Addr, Batch, ProtocolError, Reverse, Send, other
from flux.producer import ACTIVE, DEAD


class FluxConsumer:
    """Receives, acks and merges the streams of every producer partition."""

    def __init__(self, addr: Addr, producers: Sequence[Sequence[Addr]]):
        """``producers[j]`` is (replica P, replica S) of producer partition j."""
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
            newly = [x for x in (0, 1) if pair[x] in dead and self.status[j][x] == ACTIVE]
            for x in newly:
                self.status[j][x] = DEAD
            for x in newly:
                if x == self.data_from[j]:
                    y = other(x)
                    if self.status[j][y] == ACTIVE:
                        # conn[p(dest)] := {RECV}: the survivor sends, nobody gets acks.
                        effects.append(Send(self.addr, pair[y], Reverse(self.merge.last[j])))
                        self.data_from[j] = y
                    else:
                        self.data_from[j] = None  # both replicas lost: the job stops
                    self.ack_to[j] = None
                elif x == self.ack_to[j]:
                    self.ack_to[j] = None
        return effects

    def idle(self) -> bool:
        return self.merge.queued() == 0
