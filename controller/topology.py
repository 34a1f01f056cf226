"""Who hosts what: the one map from processes to protocol endpoints (DESIGN 2, 6).

Built once from a placement, the process names and their incarnations, and
used by the simulator, the thread cluster and Spark alike, so all three wire
the same cluster. Names are data: a node's name is looked up here, never
parsed back into a number. Pure (DESIGN 3).

Processes: ``controller``, ``ingress``, ``egress`` (the driver side), the
nodes of the placement (``node0`` ...) and the standbys, which start empty
and receive the replicas a failed node held (3.3).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from controller.placement import Placement
from flux.addresses import Addr, P, S

CONTROLLER_PROCESS = "controller"
INGRESS_PROCESS = "ingress"
EGRESS_PROCESS = "egress"
#: the driver side's processes, assumed always available (paper 3.1.1)
DRIVER_PROCESSES = (CONTROLLER_PROCESS, INGRESS_PROCESS, EGRESS_PROCESS)


def node_name(index: int) -> str:
    """The name of the node that holds placement index ``index``."""
    return f"node{index}"


def standby_name(key: int) -> str:
    """The name of a standby; ``key`` is anything unique (a counter, an incarnation)."""
    return f"standby{key}"


class Topology:
    """Processes, the endpoints each one hosts at the start, and their incarnations."""

    def __init__(self, placement: Placement, stages: int, partitions: int,
                 incarnations: Mapping[str, int], standbys: Sequence[str] = (),
                 egresses: int = 1, writers: bool = False, ingress_pairs: int = 0,
                 ingresses: int = 1):
        """``egresses``: 1 (one ordered egress), or one per last-stage partition, all in
        the egress process, or (``writers``) each a sink's writer on the node of its
        partition's P replica (docs/design/parallel_io.md). ``ingress_pairs``: that many
        ingresses, each a pair of replicas on the nodes (replica r of ingress i beside
        replica r of stage-1 partition ``i % partitions``), instead of the driver's;
        else ``ingresses`` of them in the driver's ingress process (the simulator's
        ``--ingresses K``), each a producer every stage-1 replica hears from."""
        self.placement = placement
        self.stages, self.partitions = stages, partitions
        self.ingress = Addr(0, 0, P)
        self.egress = Addr(stages + 1, 0, P)
        self.egresses = tuple(Addr(stages + 1, p, P) for p in range(egresses))
        #: node name <-> placement index: the only place a node's number is kept
        self.index_of: Dict[str, int] = {node_name(k): k for k in placement.nodes}
        self.nodes: Tuple[str, ...] = tuple(self.index_of)
        self.standbys: Tuple[str, ...] = tuple(standbys)
        self.incarnations: Dict[str, int] = dict(incarnations)
        self.hosted: Dict[str, Tuple[Addr, ...]] = {
            node_name(k): tuple(addrs) for k, addrs in placement.nodes.items()}
        self.hosted.update({s: () for s in self.standbys})
        #: where every endpoint lives at the start (catch-up moves replicas to standbys)
        self.where: Dict[Addr, str] = {a: name for name, addrs in self.hosted.items()
                                       for a in addrs}
        #: the ingress replicas on the nodes (pairs), none in the driver's ingress process
        self.ingress_pairs = ingress_pairs
        if ingress_pairs:
            for i in range(ingress_pairs):
                for r in (P, S):
                    node = self.where[Addr(1, i % partitions, r)]
                    self.hosted[node] += (Addr(0, i, r),)
                    self.where[Addr(0, i, r)] = node
        else:
            self.where.update((Addr(0, i, P), INGRESS_PROCESS) for i in range(ingresses))
        self.ingresses = ingresses
        self.writers = writers
        self.where.update((e, self.where[Addr(stages, e.partition, P)] if writers
                           else EGRESS_PROCESS) for e in self.egresses)

    @classmethod
    def numbered(cls, placement: Placement, stages: int, partitions: int,
                 standbys: int = 0, egresses: int = 1, writers: bool = False,
                 ingress_pairs: int = 0, ingresses: int = 1) -> "Topology":
        """Every process known in advance (the simulator, the thread cluster): incarnations
        1, 2, 3, ... in the order controller, ingress, egress, nodes, standbys."""
        names = list(DRIVER_PROCESSES) + [node_name(k) for k in placement.nodes] + [
            standby_name(k) for k in range(standbys)]
        return cls(placement, stages, partitions, {n: i for i, n in enumerate(names, 1)},
                   [standby_name(k) for k in range(standbys)], egresses, writers, ingress_pairs,
                   ingresses)

    # -- who is who -------------------------------------------------------------------
    @property
    def workers(self) -> Tuple[str, ...]:
        """The processes that host segments now or may later: nodes and standbys."""
        return self.nodes + self.standbys

    @property
    def processes(self) -> Tuple[str, ...]:
        return DRIVER_PROCESSES + self.workers

    def is_worker(self, name: str) -> bool:
        return name in self.index_of or name in self.standbys

    def failure_group(self, name: str) -> List[str]:
        """``name`` and the nodes that fail with it (its replica set under cluster pairs,
        paper 4.2); a standby fails alone."""
        index = self.index_of.get(name)
        if index is None:
            return [name]
        return [node_name(k) for k in self.placement.failure_group(index)]

    @property
    def stage1_producers(self) -> Tuple[Addr, ...]:
        """Who feeds stage 1: the driver's ingresses, or every replica of the pairs of
        ingresses on the nodes. A catch-up of a stage-1 replica is done only once each
        has folded the new replica in (5.3.2): left out, one whose active died before
        its csync arrived would hold the new replica's csync, and all behind it, forever
        (the simulator found it with two ingresses)."""
        if not self.ingress_pairs:
            return tuple(Addr(0, i, P) for i in range(self.ingresses))
        return tuple(Addr(0, i, r) for i in range(self.ingress_pairs) for r in (P, S))

    def endpoints_of(self, name: str) -> Tuple[Addr, ...]:
        """The segment replicas ``name`` hosts at the start (none for a standby)."""
        return self.hosted.get(name, ())

    # -- incarnations -------------------------------------------------------------------
    def peer_incs(self, where: Optional[Mapping[Addr, str]] = None) -> Dict[Addr, int]:
        """The incarnation of every endpoint's process (DESIGN 4.4), for ``where`` (default:
        the start; a late joiner passes where endpoints live by now)."""
        where = self.where if where is None else where
        return {a: self.incarnations[p] for a, p in where.items() if p in self.incarnations}
