"""Builds the machines of a dataflow: every segment replica, the ingress, the egress.

One place decides who feeds whom (DESIGN 4.7): stage 1 reads from the ingress,
stage s from both replicas of every stage s-1 partition; the last stage writes
to the egress, a consumer with no replica S. The simulator and the runtime both
build their machines here, so they run the same wiring.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from exchange.partitioner import KEY_GROUPS
from exchange.group_map import GroupMap, maps_from_config
from exchange.routing import ToOne, router_for
from flux.addresses import Addr, P, S
from flux.protocol.buffer import Buffer
from flux.protocol.egress import Egress, egress_addr
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.flux_producer import FluxProducer
from flux.protocol.producer import PAUSE_ROOM
from flux.protocol.epoch_ingress import EpochIngress
from flux.protocol.ingress import Ingress, ingress_addr
from flux.protocol.ingress_pair import EpochIngressReplica
from flux.protocol.sink_writer import SinkWriter
from flux.protocol.segment import AWAITING_STATE, PROCESSING, Segment, SegmentMode

#: DESIGN 7: partition pairs; one replica, no acks; two replica sets joined only at the ends
REPLICATIONS = ("flux", "none", "cluster-pairs")


class MachineBuilder:
    """Factory of the protocol machines for ``dataflow`` over ``partitions`` partitions."""

    def __init__(self, dataflow, partitions: int, capacity: int, batch_size: int,
                 ingress_capacity: int = None, buffer_factory=Buffer, segment_class=Segment,
                 replication: str = "flux", spare_chains: dict = None,
                 window: int = None, full_every: int = 1, batch_rows: int = 1024,
                 ordered_output: bool = True, pause_room: int = PAUSE_ROOM,
                 writers_on_nodes: bool = False, ingresses: int = 1, digests: bool = True,
                 key_groups: Optional[int] = KEY_GROUPS, ingress_pairs: bool = False):
        """``window``: sub-items a consumer may hold untaken per connection (back-pressure,
        docs/design/backpressure.md); None is no limit (the protocol without credits).
        ``full_every``: a replica's checkpoint snapshots are whole once in this many, the
        others the changes of its keyed stores since its last one (DESIGN 10).
        ``batch_rows``: the most inputs the ingress puts in one item (DESIGN 11).
        ``ordered_output``: one egress merging every partition into one order; False: an
        egress per last-stage partition (docs/design/parallel_io.md). ``pause_room``: how
        many times the capacity a partition paused for its catch-up may hold at each of
        its producers (``flux.protocol.producer``). ``writers_on_nodes``: each partition's
        egress is a sink's writer on a node, acked at its commits (``SinkWriter``).
        ``ingresses``: how many ingresses feed stage 1, each numbering in epochs (DESIGN 12).
        ``digests``: segments digest their states and outputs at the cuts, for the
        comparison of each pair (DESIGN 14; without cuts there is nothing to compare).
        ``key_groups``: how many key groups keys hash to, a partition owning a range of
        them (DESIGN 13); None: ``hash % partitions``, the routing before key groups.
        ``ingress_pairs``: each ingress is a pair of replicas, a producer pair as a stage's
        (``flux.protocol.ingress_pair``)."""
        if ingress_pairs and (replication != "flux" or ingresses < 2):
            raise ValueError("pairs of ingresses are several ingresses (numbering in epochs) "
                             "under replication 'flux'")
        self.ingress_pairs = ingress_pairs
        self.digests = digests
        self.key_groups = key_groups
        #: stage (from 1) -> its group map where live moves changed it (DESIGN 13): a job
        #: started again from a checkpoint routes by the map at its cut
        self.groups: Dict[int, GroupMap] = {}
        #: partitions not running as the job (or its restart) starts: they own no group,
        #: and have no process until they join (docs/design/rescaling.md)
        self.dormant: frozenset = frozenset()
        if ingresses < 1:
            raise ValueError(f"ingresses must be >= 1, got {ingresses}")
        self.ingresses = ingresses
        if writers_on_nodes and ordered_output:
            raise ValueError("writers on the nodes need an egress per partition "
                             "(ordered_output=False)")
        self.writers_on_nodes = writers_on_nodes
        self.ordered_output = ordered_output
        self.pause_room = pause_room
        if replication not in REPLICATIONS:
            raise ValueError(f"replication must be one of {REPLICATIONS}, got {replication!r}")
        self.replication = replication
        self.dataflow = dataflow
        self.stages = len(dataflow.stages)
        self.partitions = partitions
        self.capacity = capacity
        self.ingress_capacity = ingress_capacity or capacity
        self.batch_size = batch_size
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 sub-item, got {window}")
        self.window = window
        if full_every < 1:
            raise ValueError(f"full_every must be >= 1 snapshot, got {full_every}")
        self.full_every = full_every
        self.batch_rows = batch_rows
        #: a credit per half window: the producer never idles while a credit is on its way
        self.credit_every = max(1, window // 2) if window else 1
        self.buffer_factory = buffer_factory
        self.segment_class = segment_class
        #: stage -> operator chains built ahead (fresh, never used): a segment takes one
        #: before building its own, so a standby does not build its operators (maybe big,
        #: a model loaded, a table filled) while its catch-up waits
        self.spare_chains = {s: list(chains) for s, chains in (spare_chains or {}).items()}

    def joined_segment(self, a: Addr, groups: tuple = (), moves_seen: int = 0,
                       cut: tuple = ()) -> Segment:
        """A fresh replica of a dormant partition started at a live rescale: it routes by
        the maps in force when the controller placed it (``((stage, owners), ...)``, the
        moves of cuts up to ``moves_seen``; none: the job's), which its producers may
        have forgotten telling (docs/design/rescaling.md); later move cuts come in band.
        It writes no snapshot of a checkpoint cut up to ``cut``, chosen before it."""
        maps = maps_from_config(groups, self.partitions) if groups else None
        seg = self.segment(a, groups=maps)
        seg.cuts.seen_up_to(moves_seen, cut)
        return seg

    def segment(self, a: Addr, mode: SegmentMode = PROCESSING,
                groups: Optional[Dict[int, GroupMap]] = None) -> Segment:
        """``groups``: the maps its router starts from (None: the job's, ``self.groups``)."""
        s, K, n = a.stage, self.stages, self.partitions
        other_set = 1 - a.replica
        if s == 1 and self.ingress_pairs:
            producers = [(Addr(0, i, P), Addr(0, i, S)) for i in range(self.ingresses)]
            absent_in = frozenset()
        elif s == 1:
            producers = [(ingress_addr(i), ingress_addr(i)) for i in range(self.ingresses)]
            absent_in = frozenset()
        else:
            producers = [(Addr(s - 1, j, P), Addr(s - 1, j, S)) for j in range(n)]
            absent_in = frozenset(p[other_set] for p in producers) if self.replication != "flux" \
                else frozenset()
        if s < K:
            consumers = [(Addr(s + 1, i, P), Addr(s + 1, i, S)) for i in range(n)]
            # the baselines have plain exchanges inside a replica set: no dual to ack
            absent = frozenset(c[other_set] for c in consumers) if self.replication != "flux" \
                else frozenset()
            router = self.router(s, groups)
        else:
            to = 0 if self.ordered_output else a.partition
            ghost = Addr(K + 1, to, S)  # the egress has no replica S
            consumers = [(egress_addr(K, to), ghost)]
            absent = frozenset({ghost})
            router = ToOne()
        fprod = FluxProducer(a, consumers, self.capacity, self.batch_size, absent,
                             self.buffer_factory, self.window, self.pause_room,
                             to_writer=s == K and self.writers_on_nodes,
                             dormant=self.dormant if s < K else (), partitioned=s < K)
        spares = self.spare_chains.get(s)
        chain = spares.pop() if spares else self.dataflow.stages[s - 1].build_chain()
        fcons = FluxConsumer(a, producers, absent_in, self.credit_every,
                             dormant=self.dormant if s > 1 else ())
        return self.segment_class(a, fcons, chain, fprod, router, mode,
                                  full_every=self.full_every, digests=self.digests,
                                  stage_spec=self.dataflow.stages[s - 1],
                                  key_groups=self.key_groups,
                                  both_write_stage=None if self.ordered_output else K)

    def router(self, stage: int, maps: Optional[Dict[int, GroupMap]] = None) -> Any:
        """Routes to the partitions of stage ``stage + 1`` (0-based ``stage``) by its key,
        in the form it takes (columns of its ``schema``, if it has one)."""
        target = self.dataflow.stages[stage]
        router = router_for(target.key, self.partitions, target.schema, self.key_groups)
        groups = (self.groups if maps is None else maps).get(stage + 1)
        return router if groups is None else router.regrouped(groups)

    def standby_segment(self, a: Addr) -> Segment:
        """A new replica on a standby, waiting for its state (an ingress's, at stage 0)."""
        if a.stage == 0:
            replica = self.ingress(index=a.partition, replica=a.replica)
            replica.await_state()
            return replica
        return self.segment(a, AWAITING_STATE)

    def absent_replicas(self, stage: int):
        """The S replicas of a stage that never exist (replication "none")."""
        if self.replication != "none":
            return set()
        return {Addr(stage, i, S) for i in range(self.partitions)}

    def ingress(self, log_inputs: bool = False, ingress_class: Optional[type] = None,
                index: int = 0, replica: int = P) -> Ingress:
        """``log_inputs``: the source interleaves partitions of its own, inputs leave
        once their SNs are in the input log (DESIGN 10); ``index``: which of the
        ``ingresses`` (several number in epochs: ``EpochIngress``); ``replica``: which of
        its pair (``ingress_pairs``)."""
        several = {"index": index, "ingresses": self.ingresses} if self.ingresses > 1 else {}
        if self.ingress_pairs:
            several["replica"] = replica
            cls = ingress_class or EpochIngressReplica
        else:
            cls = ingress_class or (EpochIngress if several else Ingress)
        return cls(self.partitions, self.router(0), self.ingress_capacity, self.batch_size,
                   self.buffer_factory, absent=self.absent_replicas(1), window=self.window,
                   log_inputs=log_inputs, batch_rows=self.batch_rows,
                   pause_room=self.pause_room, dormant=self.dormant, **several)

    def egress(self) -> Egress:
        """The one egress of ordered output."""
        if not self.ordered_output:
            raise ValueError("an egress per partition: ask for egresses()")
        return self.egresses()[0]

    def egresses(self, egress_class: type = Egress) -> List[Egress]:
        """The egress, or one per last-stage partition (``ordered_output=False``);
        ``egress_class``: a simulated variant's."""
        partitions = [None] if self.ordered_output else range(self.partitions)
        return [egress_class(self.stages, self.partitions,
                             absent=self.absent_replicas(self.stages),
                             credit_every=self.credit_every, batch_rows=self.batch_rows,
                             partition=p, dormant=self.dormant) for p in partitions]

    def writer(self, partition: int, commit_every: Optional[int] = None) -> SinkWriter:
        """Last-stage partition ``partition``'s sink writer; it commits at least every
        ``commit_every`` items (default: the last stage's buffer capacity, which is as
        long as its replicas can wait for a commit)."""
        return SinkWriter(self.stages, self.partitions, partition,
                          commit_every or self.capacity, self.credit_every, self.batch_rows)

    @property
    def egress_addr(self) -> Any:
        return egress_addr(self.stages)
