"""Who talks: protocol endpoints, whole processes, StateMovers, and replica labels.

Pure data (DESIGN 3). An ``Addr`` names one replica of one partition of one
stage; a ``ProcAddr`` a whole process (the endpoint of views, heartbeats and
reports); a ``MoverAddr`` the StateMover of one node process.
"""
from __future__ import annotations

import enum
from typing import NamedTuple


class Replica(enum.IntEnum):
    """The two replicas of a pair. Chained declustering puts replica P of partition k
    on node k and replica S on node k+1 (paper 5.4)."""

    P = 0
    S = 1


P = Replica.P
S = Replica.S


def other(replica: int) -> Replica:
    """The other replica of a pair (the paper's ``p(dest)``)."""
    return Replica(1 - replica)


class Addr(NamedTuple):
    """A protocol endpoint: one replica of one partition of one stage.

    The ingress is stage 0 and the egress is stage ``stages + 1``; both have a
    single partition 0 and are replica P.
    """

    stage: int
    partition: int
    replica: int

    def __str__(self) -> str:
        return f"{self.stage}.{self.partition}{'PS'[self.replica]}"

    @property
    def twin(self) -> "Addr":
        """The other replica of the same partition."""
        return Addr(self.stage, self.partition, other(self.replica))


class ProcAddr(NamedTuple):
    """A whole process (a node, a standby, the ingress, the egress, the controller)."""

    name: str

    def __str__(self) -> str:
        return f"@{self.name}"


class MoverAddr(NamedTuple):
    """The StateMover of one node process (one per incarnation)."""

    node: str

    def __str__(self) -> str:
        return f"sm@{self.node}"


CONTROLLER = ProcAddr("controller")
