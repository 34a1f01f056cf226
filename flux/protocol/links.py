"""One connection as a producer sees it (Figures 3-5): its status, its modes, and what
catch-up and back-pressure add. A record, with the two rules that only touch it.

``Status`` is also what a consumer knows of each producer replica
(``flux.protocol.flux_consumer.ProducerReplica``).
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Tuple

from flux.addresses import Addr
from flux.sequence import NO_PROGRESS, SN


class Status(enum.Enum):
    """What a machine knows of one replica at the other end of a connection (Figures 4, 5)."""

    ACTIVE = "ACTIVE"
    DEAD = "DEAD"
    STDBY = "STDBY"  # announced by avail(), folds in at its sync (3.3)


ACTIVE = Status.ACTIVE
DEAD = Status.DEAD
STDBY = Status.STDBY


class ConnMode(enum.Flag):
    """A connection's modes, the paper's ``conn_i[d]``: data flows on SEND, acks on ACK."""

    NONE = 0
    SEND = enum.auto()
    ACK = enum.auto()


NONE = ConnMode.NONE
SEND = ConnMode.SEND
ACK = ConnMode.ACK


@dataclass(slots=True)
class Link:
    """A producer's connection with destination ``d`` of consumer partition ``i``.

    Its producer keeps the list of the open ones (``Producer._open``): whoever changes
    ``status``, ``modes`` or ``paused`` tells it (``Producer._links_changed``)."""

    peer: Addr
    modes: ConnMode = NONE
    status: Status = ACTIVE
    #: the strongest progress bound sent on this connection (DESIGN 4.3)
    sent_bound: SN = NO_PROGRESS
    #: catch-up: paused by the consumer (5.3.1), its last sync version, the one expected
    paused: bool = False
    #: a new replica working off what piled up during its pause: its buffer keeps the
    #: pause's room until it is back within its capacity (``Producer``)
    catching_up: bool = False
    ver: int = 0
    expected: int = 0
    #: back-pressure: the batches sent and not yet credited, as (last SN, tuples), and
    #: their tuples in all; a new sending episode starts from nothing (``reset_window``)
    in_flight: deque = field(default_factory=deque)
    in_flight_tuples: int = 0
    #: the newest checkpoint cut stamped on a batch of this connection (DESIGN 10)
    told_cut: Optional[Tuple[int, int]] = None
    #: the newest move cut the consumer said it crossed (None: it keeps no moves)
    moves_crossed: Optional[int] = 0

    def is_open(self) -> bool:
        """Figure 3 action 2's first guard: data may flow on this connection now."""
        return self.status is ACTIVE and SEND in self.modes and not self.paused

    def reset_window(self) -> None:
        """The consumer's merge holds nothing of ours that it still owes a credit for."""
        self.in_flight.clear()
        self.in_flight_tuples = 0

    def credit(self, sn: SN) -> None:
        """The consumer took every tuple <= ``sn``: free the batches that ends."""
        q = self.in_flight
        while q and q[0][0] <= sn:
            self.in_flight_tuples -= q.popleft()[1]


__all__ = ["Link", "Status", "ConnMode", "SEND", "ACK", "NONE", "ACTIVE", "DEAD", "STDBY"]
