"""A producer's consumer partitions that start and leave at live rescales
(docs/design/rescaling.md).

A part of ``flux.protocol.producer.Producer`` (its attributes are the producer's): a
dormant consumer partition's links are as an absent replica's (nothing is routed to it,
it owns no group) until it joins; a partition that leaves was routed nothing past the
cut that took its groups, and both its replicas crossed that cut.
"""
from __future__ import annotations

from typing import Iterable

from flux.errors import LocalProtocolError
from flux.protocol.buffer import DESTS
from flux.protocol.links import ACTIVE, DEAD, SEND, Link


class PartitionMembership:
    """Dormant, joining and leaving consumer partitions; mixed into ``Producer``."""

    def sleep(self, partitions: Iterable[int]) -> None:
        """Consumer partitions not running yet: as absent until they ``join``."""
        for i in partitions:
            self.dormant.add(i)
            for d in DESTS:
                self.fail_destination(i, d)

    def join(self, i: int) -> None:
        """Dormant consumer partition ``i`` runs from now: its links as new ones, in the
        normal modes (nothing told, nothing sent; nothing was routed to it). A join
        applied again, or over an installed state that had it, is nothing."""
        if i not in self.dormant:
            return
        self.dormant.discard(i)
        if any(link.status is not DEAD for link in self.links[i]):
            return  # an installed state (a new replica's) had it joined already
        if len(self.buffers[i]):
            raise LocalProtocolError(f"{self.addr}: {len(self.buffers[i])} tuples for "
                                     f"dormant partition {i}, which owns no group")
        self.buffers[i] = self.buffer_factory(self.capacity)
        self.links[i] = tuple(Link(link.peer, self.normal_modes[d])
                              for d, link in zip(DESTS, self.links[i]))
        self._links_changed()

    def leave(self, i: int) -> None:
        """Consumer partition ``i`` left (docs/design/rescaling.md): both its replicas
        crossed the cut that took its last groups, so they hold everything routed to it;
        what the buffer keeps for it waits only for acks still in flight, and goes. An
        entry never sent would be lost: a protocol error. Applied again, nothing."""
        if i in self.dormant or not self.partitioned:
            return
        buffer = self.buffers[i]
        for d, link in zip(DESTS, self.links[i]):
            if link.status is ACTIVE and SEND in link.modes and \
                    buffer.first_unsent(d) is not None:
                raise LocalProtocolError(
                    f"{self.addr}: consumer partition {i} left, and "
                    f"{buffer.first_unsent(d)} was never sent to its replica {d}")
        self.buffers[i] = self.buffer_factory(self.capacity)
        self.sleep((i,))

