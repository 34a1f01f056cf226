"""Where replicas live (paper 5.4, DESIGN 6-7).

A placement maps node index -> the segment addresses it hosts. The only
constraint (5.0): no two replicas of a partition on one node.
"""
from __future__ import annotations

from typing import Dict, List

from flux.addresses import Addr, P, S


class Placement:
    """Segments per node, with the pair-independence check."""

    #: a lost replica is rebuilt on a standby, one segment at a time (3.3)
    rebuilds = True
    #: how the machines are wired (``MachineBuilder``'s ``replication``)
    replication = "flux"
    #: a node's failure fails every node of its replica set (cluster pairs)
    fails_by_set = False

    def failure_group(self, node: int) -> List[int]:
        """The nodes that fail when ``node`` fails: just itself, for partition pairs."""
        return [node]

    def __init__(self, nodes: Dict[int, List[Addr]]):
        self.nodes = {n: list(addrs) for n, addrs in nodes.items()}
        self.node_of: Dict[Addr, int] = {}
        for n, addrs in self.nodes.items():
            for a in addrs:
                if a in self.node_of:
                    raise ValueError(f"segment {a} placed twice")
                self.node_of[a] = n
        for a, n in self.node_of.items():
            twin = Addr(a.stage, a.partition, 1 - a.replica)
            if self.node_of.get(twin) == n:
                raise ValueError(f"both replicas of {a.stage}.{a.partition} on node {n}")

    def lost_pairs(self, dead_nodes) -> List[Addr]:
        """Replica-P addresses of the pairs whose both replicas are on dead nodes."""
        dead = set(dead_nodes)
        return sorted(
            a
            for a, n in self.node_of.items()
            if a.replica == P and n in dead and self.node_of[Addr(a.stage, a.partition, S)] in dead
        )


class ChainedDeclustering(Placement):
    """Node k holds replica P of partition k and replica S of partition k-1, every stage."""

    def __init__(self, stages: int, partitions: int):
        if partitions < 2:
            raise ValueError(f"chained declustering needs >= 2 partitions, got {partitions}")
        super().__init__(
            {
                k: [Addr(s, k, P) for s in range(1, stages + 1)]
                + [Addr(s, (k - 1) % partitions, S) for s in range(1, stages + 1)]
                for k in range(partitions)
            }
        )


class OneSegmentPerNode(Placement):
    """Every segment replica on its own node: lets a test kill exactly one segment."""

    def __init__(self, stages: int, partitions: int):
        addrs = [Addr(s, i, r) for s in range(1, stages + 1) for i in range(partitions) for r in (P, S)]
        super().__init__({n: [a] for n, a in enumerate(addrs)})


class ClusterPairs(Placement):
    """Paper 4.2: half the nodes run a whole replica (all P), the other half the other (all S).

    Partition i's P replica is on node i mod (N/2), its S replica on node N/2 + i mod (N/2),
    for every stage, so each half is a complete replica set.
    """

    def __init__(self, stages: int, partitions: int, nodes: int):
        if nodes < 2 or nodes % 2:
            raise ValueError(f"cluster pairs need an even number of nodes >= 2, got {nodes}")
        half = nodes // 2
        layout = {k: [] for k in range(nodes)}
        for s in range(1, stages + 1):
            for i in range(partitions):
                layout[i % half].append(Addr(s, i, P))
                layout[half + i % half].append(Addr(s, i, S))
        super().__init__(layout)

    #: a lost set is not rebuilt replica by replica (Flux's catch-up cannot: see
    #: docs/design/divergence.md): with checkpoints the job restarts from a checkpoint
    #: cut after the loss (``Recovery.lost_set``), the paper's stall (4.2, DESIGN 7)
    rebuilds = False
    replication = "cluster-pairs"
    fails_by_set = True

    def replica_set(self, node: int) -> int:
        """P (0) for the first half of the nodes, S (1) for the second."""
        return P if node < len(self.nodes) // 2 else S

    def failure_group(self, node: int) -> List[int]:
        """Inside a set the exchanges are plain: one node lost fails its whole set (4.2)."""
        return [k for k in self.nodes if self.replica_set(k) == self.replica_set(node)]


class Unreplicated(Placement):
    """Replication "none" (DESIGN 7): node k holds the only replica (P) of partition k."""

    replication = "none"

    def __init__(self, stages: int, partitions: int):
        super().__init__({k: [Addr(s, k, P) for s in range(1, stages + 1)]
                          for k in range(partitions)})


def placement_for(replication: str, stages: int, partitions: int) -> Placement:
    """One node per partition in every mode, so the modes compare on equal hardware."""
    if replication == "flux":
        return ChainedDeclustering(stages, partitions)
    if replication == "none":
        return Unreplicated(stages, partitions)
    if replication == "cluster-pairs":
        return ClusterPairs(stages, partitions, partitions)
    raise ValueError(f"unknown replication {replication!r}")
