"""What a ``FluxJob`` is asked to do: its keyword arguments as one frozen record, grouped.

``FluxJob(spark, dataflow, source, **kwargs)`` keeps its flat keyword arguments (the
documented API); they are checked and grouped here once, so every part of the job reads
the group it needs (replication, network, checkpoints, tuning) instead of a bag of
attributes, and no part can change them while the job runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, Optional, Tuple

from exchange.partitioner import KEY_GROUPS, check_key_groups
from flux.connector_api import SinkPerPartition, is_exactly_once
from controller.autoscale import Autoscale
from controller.rebalance import Rebalance
from flux.protocol.builder import REPLICATIONS
from flux.protocol.producer import PAUSE_ROOM
from flux.runtime.controller_divergence import ON_DIVERGENCE


@dataclass(frozen=True)
class Replication:
    """How many pairs, their spares and where they may run (DESIGN 6, 7)."""

    mode: str = "flux"  # "flux", "cluster-pairs" or "none"
    nodes: int = 4
    standbys: int = 1
    #: the most pairs ``rescale`` may grow the job to while it runs: the pairs past
    #: ``nodes`` are dormant (no process, no key) until a rescale starts them on standbys
    #: (docs/design/rescaling.md); None: ``nodes``
    max_nodes: Optional[int] = None
    #: no pair on one machine; None: decided at start (False on a local master)
    distinct_hosts: Optional[bool] = None
    #: keys hash to this many key groups, each partition owning a range of them: the most
    #: nodes a checkpoint of this job can be rescaled to (DESIGN 13)
    key_groups: int = KEY_GROUPS
    #: the metric-driven policy that moves key groups off hot partitions while the job
    #: runs (``flux.Rebalance``); None: off
    rebalance: Optional[Rebalance] = None
    #: the metric-driven policy that starts and stops pairs by the input rate, up to
    #: ``max_nodes`` (``flux.Autoscale``); None: off
    autoscale: Optional[Autoscale] = None

    def __post_init__(self) -> None:
        if self.rebalance is not None and not isinstance(self.rebalance, Rebalance):
            raise TypeError(f"rebalance must be a flux.Rebalance(...) or None, got "
                            f"{type(self.rebalance).__name__}")
        if self.autoscale is not None and not isinstance(self.autoscale, Autoscale):
            raise TypeError(f"autoscale must be a flux.Autoscale(...) or None, got "
                            f"{type(self.autoscale).__name__}")
        if self.nodes < 2:
            raise ValueError(f"Flux needs at least 2 nodes (a pair per partition), "
                             f"got {self.nodes}")
        if self.key_groups is None:  # the routing before key groups: a restore's, not a choice
            raise ValueError("key_groups must be an int (256 by default)")
        check_key_groups(self.key_groups, self.nodes)
        if self.max_nodes is not None:
            if not isinstance(self.max_nodes, int) or isinstance(self.max_nodes, bool) or \
                    self.max_nodes < self.nodes:
                raise ValueError(f"max_nodes must be an int >= nodes ({self.nodes}), got "
                                 f"{self.max_nodes!r}")
            check_key_groups(self.key_groups, self.max_nodes)
        if self.standbys < 0:
            raise ValueError(f"standbys must be >= 0, got {self.standbys}")
        if self.mode not in REPLICATIONS:
            raise ValueError(f"replication must be one of {REPLICATIONS}, got {self.mode!r}")

    @property
    def partitions(self) -> int:
        """The job's partitions: every pair it may run, dormant ones included."""
        return self.max_nodes or self.nodes


@dataclass(frozen=True)
class Network:
    """Addresses, liveness and the endpoints the driver serves (DESIGN 4.4, 6)."""

    detect_after: float = 0.5
    heartbeat: float = 0.05
    lease: float = 3.0
    authenticate: bool = True
    #: where the driver's sockets bind and nodes reach them; None: spark.driver.host
    driver_host: Optional[str] = None
    ports: Optional[Tuple[int, int]] = None
    metrics_port: Optional[int] = None
    metrics_addr: str = "0.0.0.0"
    #: seconds ``start`` waits for executors to register before it counts task slots
    executor_wait: float = 60.0

    def __post_init__(self) -> None:
        if not self.detect_after > 0:
            raise ValueError(f"detect_after must be > 0 seconds, got {self.detect_after!r}")
        if self.executor_wait < 0:
            raise ValueError(f"executor_wait must be >= 0 seconds, got {self.executor_wait!r}")


@dataclass(frozen=True)
class Checkpointing:
    """Durable checkpoints and restarts (DESIGN 10); ``location`` None: none."""

    location: Optional[str] = None
    interval: float = 10.0
    keep: int = 3
    full_every: int = 10
    restarts: int = 3
    #: a pair whose digests disagree at a cut (DESIGN 14): "fail" stops the job with
    #: ReplicasDiverged; "rebuild" rebuilds its S replica's node from the twins; "off":
    #: the replicas digest nothing
    on_divergence: str = "fail"
    #: without checkpoints, seconds between the cuts the pairs' digests are compared at
    #: (None: not compared)
    verify_interval: Optional[float] = None

    @property
    def digests(self) -> bool:
        """Do the replicas digest at the cuts: there are cuts, and the policy wants them."""
        return self.on_divergence != "off" and (self.location is not None
                                                or self.verify_interval is not None)

    def __post_init__(self) -> None:
        if self.verify_interval is not None and not self.verify_interval > 0:
            raise ValueError(f"verify_interval must be > 0 seconds, got "
                             f"{self.verify_interval!r}")
        if self.on_divergence not in ON_DIVERGENCE:
            raise ValueError(f"on_divergence must be one of {', '.join(ON_DIVERGENCE)}, "
                             f"got {self.on_divergence!r}")
        if self.location is not None and not self.interval > 0:
            raise ValueError(f"checkpoint_interval must be > 0 seconds, got {self.interval!r}")
        if self.restarts < 0:
            raise ValueError(f"restarts must be >= 0, got {self.restarts}")
        if self.keep < 1:
            raise ValueError(f"checkpoint_keep must be >= 1 checkpoint, got {self.keep!r}")


@dataclass(frozen=True)
class Tuning:
    """Sizes and delays of the data path (docs/operations.md measures their trade-offs)."""

    #: items (DESIGN 11): the most inputs in one, and, counted in sub-items, what a
    #: connection's buffer holds, what one message carries, and the back-pressure window
    #: None: 16384 (``Dataflow.default_batch_rows``: every item costs each replica a
    #: fixed amount, and a partition's share of an item is 1/nodes of it)
    batch_rows: Optional[int] = None
    capacity: int = 16
    batch_size: int = 4
    window: int = 16
    #: how many times ``capacity`` a partition paused for its catch-up may hold at each of
    #: its producers, so the other partitions go on through the pause (1: they wait)
    pause_room: int = PAUSE_ROOM
    #: seconds the ingress lets an item wait for more inputs before it leaves unfilled
    #: (and stage 1 took the items before it); None: 5 ms, or 25 ms where a stage takes
    #: Arrow batches (such an operator pays per batch: larger items at moderate rates)
    item_delay: Optional[float] = None
    flush_delay: float = 0.002
    chunk_size: int = 1 << 20
    metrics_interval: float = 0.1
    check_records: int = 200
    #: run the dataflow over those records in two fresh processes with different hash
    #: seeds, and refuse it if they disagree (``flux.testing.check_deterministic``)
    check_determinism: bool = True
    #: keep every output in ``job.delivered``; None: only without a sink
    keep_output: Optional[bool] = None
    #: one egress merging every partition into one order (True), or one per last-stage
    #: partition, each delivering its partition's outputs in SN order, so that one
    #: partition's pause holds up no other's output (docs/design/parallel_io.md)
    ordered_output: bool = True
    #: each partition's egress runs on an executor, beside its last-stage replica, and
    #: writes its partition's sink there: no output crosses the driver (needs
    #: ordered_output=False and a SinkPerPartition of exactly-once sinks)
    egress_on_executors: bool = False
    #: seconds an output on an executor waits for its sink's commit at most (its
    #: replicas keep it until then)
    commit_interval: float = 0.1
    #: a SplitSource's ingresses end an epoch this often (seconds): an item holds the
    #: inputs of one epoch at most, and merges release an epoch once every split ended
    #: it (longer: larger items, more latency)
    epoch_interval: float = 0.01

    def __post_init__(self) -> None:
        if not self.epoch_interval > 0:
            raise ValueError(f"epoch_interval must be > 0 seconds, got {self.epoch_interval!r}")


@dataclass(frozen=True)
class JobOptions:
    replication: Replication = field(default_factory=Replication)
    network: Network = field(default_factory=Network)
    checkpoints: Checkpointing = field(default_factory=Checkpointing)
    tuning: Tuning = field(default_factory=Tuning)

    #: FluxJob's keyword arguments -> (group, field), where the names differ
    RENAMED = {"replication": ("replication", "mode"), "checkpoint": ("checkpoints", "location"),
               "checkpoint_interval": ("checkpoints", "interval"),
               "checkpoint_keep": ("checkpoints", "keep"),
               "checkpoint_full_every": ("checkpoints", "full_every")}

    def check_output(self, sink: Any) -> None:
        """An exactly-once sink drops every SN not above its last: it takes one ordered
        stream, so with an egress per partition it takes one partition's outputs only."""
        per_partition = isinstance(sink, SinkPerPartition)
        if self.tuning.egress_on_executors:
            if self.tuning.ordered_output or not per_partition:
                raise ValueError("egress_on_executors=True needs ordered_output=False and "
                                 "sink=flux.SinkPerPartition(...) of exactly-once sinks: "
                                 "each partition's egress writes its own sink")
            if self.tuning.keep_output:
                raise ValueError("egress_on_executors=True keeps no output in the driver "
                                 "(keep_output=True): read the sinks")
        if self.tuning.ordered_output and per_partition:
            raise ValueError("a SinkPerPartition needs ordered_output=False (an egress per "
                             "partition); with ordered_output=True give one sink")
        if not self.tuning.ordered_output and is_exactly_once(sink):
            raise ValueError(
                f"ordered_output=False: the {type(sink).__name__} would take the outputs of "
                f"every partition interleaved, and an exactly-once sink drops every output "
                f"whose SN is not above its last: give each partition its own, "
                f"sink=flux.SinkPerPartition(lambda partition: ...) (a folder, Delta app_id "
                f"or Kafka transactional_id per partition)")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "JobOptions":
        """The record of ``FluxJob``'s keyword arguments; an unknown one is refused."""
        groups: Dict[str, Dict[str, Any]] = {g: {} for g in ("replication", "network",
                                                             "checkpoints", "tuning")}
        where = {f.name: (group, f.name) for group, kind in (
            ("replication", Replication), ("network", Network), ("checkpoints", Checkpointing),
            ("tuning", Tuning)) for f in fields(kind)}
        for kwarg, (group, attr) in cls.RENAMED.items():
            del where[attr]
            where[kwarg] = (group, attr)
        for name, value in kwargs.items():
            if name not in where:
                raise TypeError(f"FluxJob() got an unexpected keyword argument {name!r}")
            group, attr = where[name]
            groups[group][attr] = value
        return cls(Replication(**groups["replication"]), Network(**groups["network"]),
                   Checkpointing(**groups["checkpoints"]), Tuning(**groups["tuning"]))
