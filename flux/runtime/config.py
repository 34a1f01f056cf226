"""What a node process is told when it starts: one frozen, typed record.

A Spark task captures only plain configuration (SPARK_NOTES), so this record
holds the dataflow pickled and nothing that refers to the driver's objects.
The same record configures the driver's own loops, so both sides agree.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Tuple

from controller.placement import Placement, placement_for
from flux.runtime.network import check_port_range, local_host
from flux.runtime.transport import job_keys
from controller.topology import Topology
from exchange.partitioner import KEY_GROUPS
from flux.protocol.producer import PAUSE_ROOM


@dataclass(frozen=True)
class NodeConfig:
    """Settings of every process of one job (DESIGN 6)."""

    #: the ``Dataflow``, pickled with cloudpickle (unpickled on the executor)
    dataflow: bytes
    stages: int
    partitions: int
    replication: str = "flux"
    #: the pairs that run from the start; those from ``running`` to ``partitions`` are
    #: dormant (no process, no group) until a live rescale starts them on standbys
    #: (docs/design/rescaling.md); 0: every pair runs
    running: int = 0
    #: how many key groups keys hash to (DESIGN 13); None: ``hash % partitions``, the
    #: routing of a checkpoint written before key groups, restored as it was
    key_groups: Optional[int] = KEY_GROUPS
    #: each stage whose key groups are not contiguous ranges over its partitions (live
    #: moves, DESIGN 13): ``((stage, owner of each group), ...)``, the restored
    #: checkpoint's map after its cut (``flux.runtime.restore.routing_maps``)
    group_maps: Tuple[Tuple[int, Tuple[int, ...]], ...] = ()
    #: the most inputs in one item (DESIGN 11); capacity and batch_size count sub-items
    batch_rows: int = 1024
    capacity: int = 16
    batch_size: int = 4
    #: back-pressure: sub-items a consumer may hold untaken per connection (credits)
    window: int = 16
    #: how many times ``capacity`` a paused partition's buffer holds (``flux.protocol.producer``)
    pause_room: int = PAUSE_ROOM
    #: seconds between a node's heartbeats, and without the controller's before it stops
    heartbeat: float = 0.05
    lease: float = 3.0
    chunk_size: int = 1 << 20
    flush_delay: float = 0.002
    #: seconds an item waits for more inputs before the ingress lets it go unfilled
    item_delay: float = 0.005
    #: seconds between a node's reports of its segments' counters (monitoring)
    stats_every: float = 1.0
    register_timeout: float = 60.0
    #: the job's secret: authenticates registrations and derives the CURVE keys
    secret: str = ""
    curve: bool = True
    #: where the controller listens (known once the driver's sockets exist)
    controller: str = ""
    #: the range (low, high) every socket's port is taken from, for firewalls; None: any
    ports: Optional[Tuple[int, int]] = None
    #: the checkpoint store's URL ("": no checkpoints), and the complete checkpoint the
    #: nodes start from (-1: none, the operators start empty; DESIGN 10)
    checkpoint: str = ""
    restore: int = -1
    #: a replica's snapshots are whole once in this many, else its keyed stores' changes
    checkpoint_full_every: int = 10
    #: replicas digest their states and outputs at the checkpoints' cuts, for the
    #: comparison of each pair (DESIGN 14; on_divergence="off": they do not)
    digests: bool = True
    #: one egress of one order, or one per last-stage partition (in the driver)
    ordered_output: bool = True
    #: the egresses as sinks' writers on the nodes: the job's ``SinkPerPartition``,
    #: pickled, which each node opens for the partitions whose writer it runs (b"": the
    #: egresses run in the driver; docs/design/parallel_io.md)
    writers_sink: bytes = b""
    #: seconds a writer's outputs wait for its sink's commit at most
    commit_interval: float = 0.1

    #: a ``SplitSource``, pickled: each split read by a pair of ingresses on the nodes
    #: (b"": the driver's ingress reads the job's source; docs/design/parallel_io.md)
    split_source: bytes = b""
    splits: int = 0
    #: the ingresses on the nodes end an epoch this often, and epoch e begins at
    #: ``epoch_origin + e * epoch_interval`` (wall-clock seconds): every ingress numbers
    #: by the same clock, and an output's latency is read from its SN
    epoch_interval: float = 0.01
    epoch_origin: float = 0.0
    #: with checkpoints, this run's folder in each split's durable log
    #: (``flux.runtime.split_log``), and what a restart's pairs follow of those logs:
    #: pickled ``(cut, {split: (its count at the cut, the entries past it, the log's
    #: last place)}, {split: (a count at or before the cut, where the split's source
    #: stood then)})`` (b"": a first start, nothing logged)
    split_attempt: int = 0
    split_resume: bytes = b""

    def __post_init__(self) -> None:
        check_port_range(self.ports)
        if not 0 <= self.running <= self.partitions:
            raise ValueError(f"running must be from 0 to partitions ({self.partitions}), "
                             f"got {self.running}")
        for name in ("heartbeat", "lease", "flush_delay", "item_delay", "register_timeout",
                     "stats_every", "commit_interval", "epoch_interval"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.epoch_interval > 0:
            raise ValueError(f"epoch_interval must be > 0, got {self.epoch_interval}")
        for name in ("batch_rows", "capacity", "batch_size", "window", "chunk_size", "partitions", "stages",
                     "checkpoint_full_every", "pause_room"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def keys(self) -> Optional[Tuple[bytes, bytes]]:
        """The job's CURVE key pair, or None without authentication."""
        return job_keys(self.secret) if self.curve else None

    def bind_host(self) -> str:
        """The address this machine's sockets bind and advertise."""
        return local_host("", self.controller)

    def placement(self) -> Placement:
        """Where the running pairs' replicas start (the dormant ones have no process)."""
        return placement_for(self.replication, self.stages, self.running or self.partitions)

    @property
    def dormant(self) -> frozenset:
        """The partitions with no process at the start (``MachineBuilder.dormant``)."""
        return frozenset(range(self.running, self.partitions)) if self.running else frozenset()

    @property
    def egresses(self) -> int:
        """One egress of one order, or one per last-stage partition."""
        return 1 if self.ordered_output else self.partitions

    def topology(self, incarnations=None, standbys=()) -> Topology:
        """Who hosts what, with the incarnations known so far."""
        return Topology(self.placement(), self.stages, self.partitions, incarnations or {},
                        standbys, self.egresses, writers=bool(self.writers_sink),
                        ingress_pairs=self.splits)

    def with_controller(self, address: str) -> "NodeConfig":
        return replace(self, controller=address)

    def restoring(self, checkpoint: int) -> "NodeConfig":
        return replace(self, restore=checkpoint)
