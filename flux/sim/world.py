"""The simulated cluster: hosts, FIFO channels, a controller, crashes, standbys.

The world runs the real protocol machines. Every connection between two endpoints is a
reliable FIFO queue (paper 2.2): nothing on a live connection is dropped, duplicated or
reordered; a crash loses only what was in flight. The controller
(``controller.recovery``) declares failures in a totally ordered view, later, and
rebuilds lost replicas on standbys.

The world coordinates the parts that each own one seam of it:

- ``Channels`` (``channels.py``): the FIFO links and view queues, delivery, the
  truncation a crash leaves;
- ``Faults`` (``faults.py``): crashes, cut hosts, unheard processes, zombies, damaged
  checkpoint files;
- ``Detection`` (``detection.py``): the failure detector on its simulated clock, leases,
  declaring the dead (DESIGN 6);
- ``CheckpointStore`` (``store.py``) and ``Restarts`` (``restarts.py``): snapshot files,
  chains, manifests and pruning; whole-job restarts that verify and fall back, and the
  input log (DESIGN 10);
- ``Steps`` (``steps.py``): which steps are enabled, in a fixed order, and taking one.

The world only says which steps are enabled and carries one out; the scheduler
(``flux.sim.schedule``) chooses.
"""
from __future__ import annotations

import random
from functools import partial
from typing import Any, Dict, List, Optional, Sequence, Tuple

from controller.checkpoints import CheckpointCoordinator
from controller.placement import Placement
from controller.recovery import Recovery
from flux.addresses import P, S, Addr
from flux.protocol.builder import MachineBuilder
from flux.control_messages import (
    FoldedIn,
    RangeInstalled,
    RangePacked,
    TakeoverDone,
    View,
)
from flux.effects import (
    CutChosen,
    CutPassed,
    Deliver,
    PackRange,
    RangeAwaited,
    SinkCommit,
    Snapshot,
    SourcesPaused,
    SourcesResumed,
    StateInstalled,
)
from flux.envelope import Envelope
from flux.protocol.host import Host
from flux.protocol.ingress_twin_log import ITEM
from flux.sim.channels import Channels
from flux.sim.config import (
    CHECKPOINT_STORE,
    EGRESS_HOST,
    INGRESS_HOST,
    INPUT_LOG,
    PROCESS_LIMITS,
    SIM_CATCHUP_DEADLINE,
    SIM_LEASE,
    SIM_TIMINGS,
    Chain,
    FileId,
    Outcome,
    WorldConfig,
    ZombieMachine,
)
from flux.sim.detection import Detection
from flux.sim.divergence import SimDivergence
from flux.sim.faults import REMOVED_SHARE, Faults
from flux.sim.ingresses import SimIngresses, ingress_claims
from flux.sim.moves import SimMoves
from flux.sim.oracle import settled_oracles
from flux.sim.restarts import Restarts, restore
from flux.sim.sink import SimSink
from flux.sim.steps import Steps
from flux.sim.writers import SimWriters
from flux.sim.store import CheckpointStore, StoredFile, checksum
from controller.topology import Topology
from statemover.messages import SmReady, TransferFailed

#: the world and the names its parts define, importable from here as before the split
__all__ = [
    "CHECKPOINT_STORE", "EGRESS_HOST", "INGRESS_HOST", "INPUT_LOG", "PROCESS_LIMITS",
    "REMOVED_SHARE", "SIM_CATCHUP_DEADLINE", "SIM_LEASE", "SIM_TIMINGS", "Chain",
    "FileId", "Outcome", "StoredFile", "World", "WorldConfig", "ZombieMachine", "checksum",
]


class World:
    """Hosts running the protocol machines, connected by FIFO channels."""

    def __init__(self, dataflow, inputs: Sequence[Any], partitions: int, placement: Placement,
                 config: WorldConfig, rng, fault_rng: Optional[random.Random] = None,
                 corrupt_rng: Optional[random.Random] = None,
                 moves_rng: Optional[random.Random] = None):
        self.rng = rng
        #: draws for timed faults (truncations of a zombie's links, lost mover envelopes):
        #: a stream of its own, so runs without them draw what they always drew
        self.fault_rng = fault_rng or random.Random(0)
        self.dataflow = dataflow
        self.stages = len(dataflow.stages)
        self.partitions = partitions
        self.config = config
        self.inputs = list(inputs)
        self.next_input = 0
        #: told the inputs' new order after a restart interleaved the unlogged ones anew
        self.on_reorder = lambda inputs: None
        self.outcome = Outcome()
        segment_class = type(config.segment_class.__name__, (config.segment_class,),
                             {"bulk_pairs": config.bulk_pairs,
                              "bulk_per_step": config.bulk_per_step,
                              **config.segment_settings})
        self.builder = MachineBuilder(dataflow, partitions, config.capacity, config.batch_size,
                                      config.ingress_capacity, config.buffer_factory,
                                      segment_class, window=config.window,
                                      full_every=config.full_every,
                                      batch_rows=config.batch_rows,
                                      ordered_output=config.ordered_output,
                                      writers_on_nodes=config.writers_on_nodes,
                                      ingresses=config.epochs.ingresses
                                      if config.epochs else 1,
                                      replication=placement.replication,
                                      ingress_pairs=config.ingress_pairs)
        #: several ingresses' steps (None: one ingress, reading ``inputs`` in order)
        self.epochs = SimIngresses(config.epochs, config.log_epochs, config.epoch_skew,
                                   config.ingress_pairs) if config.epochs else None
        self.placement = placement
        #: the sink partitions: one with ordered output, else one per last-stage partition
        self.sink_partitions = 1 if config.ordered_output else partitions
        self.coordinator = CheckpointCoordinator(self.stages, partitions, "sim",
                                                 sinks=self.sink_partitions)
        self.checkpoints_left = config.checkpoints
        #: the ingress chooses a cut only once it has sent an input after this one
        self.last_cut = 0
        #: the oracle's view of a snapshot and of a sink commit (set by ``make_world``)
        self.judge_snapshot = self.judge_commit = lambda *a: None
        #: a drained rescale restarts from ``cut``: no sink partition committed past it
        self.judge_drain = lambda cut: None
        #: told that outputs past a cut go to other sink partitions (a rescale, a move)
        self.on_parts_changed = lambda: None
        self.moves = SimMoves(self, config.moves, moves_rng or random.Random(0))
        #: the sink: ``outcome.delivered`` is what it holds, per partition what it committed
        self.sink = SimSink(self.outcome.delivered)
        #: the oracles of what each egress claims it delivered (``settled``, ``finished``)
        self.settled_oracles = settled_oracles(self)
        self.store = CheckpointStore(self)
        self.restarts = Restarts(self)
        self.faults = Faults(self, corrupt_rng or random.Random(0))
        self.steps = Steps(self)
        self.writers = SimWriters(self)
        #: the controller's comparison of the pairs' digests, and its oracle
        self.divergence = SimDivergence(config.deterministic)
        self.build()

    def build(self, restored: Optional[Tuple[int, int]] = None) -> None:
        """Every process of the job, fresh; ``restored``: ``(checkpoint, cut)`` whose
        snapshots (its manifest's chains) the segments start from, the inputs numbered
        from ``cut + 1``."""
        config, partitions, builder = self.config, self.partitions, self.builder
        self.hosts: Dict[str, Host] = {}
        self.host_of: Dict[Any, str] = {}
        pairs = builder.ingresses if config.ingress_pairs else 0
        topology = self.topology = Topology.numbered(self.placement, self.stages, partitions,
                                                     config.standbys, self.sink_partitions,
                                                     config.writers_on_nodes, pairs,
                                                     1 if pairs else builder.ingresses)
        writers = self.writers.place(topology)
        self.restored = None if restored is None else restored[0]  # its snapshots
        peer_incs = topology.peer_incs()
        for name in topology.workers:
            machines = {a: builder.ingress(index=a.partition, replica=a.replica,
                                           ingress_class=config.ingress_class) if a.stage == 0
                        else builder.segment(a) for a in topology.endpoints_of(name)}
            if restored is not None:
                chains = self.store.manifests[restored[0]][1]
                for a, seg in machines.items():  # as the runtime's restore_operators
                    restore(self, chains, a, seg)
            machines.update((w.addr, w) for w in writers if self.writers.host[w.partition] == name)
            self._add_host(config.host_class(name, machines, topology.incarnations[name],
                                             builder.standby_segment, config.chunk_size,
                                             peer_incs, writer_factory=self.writers.factory(name),
                                             joined_factory=builder.joined_segment))
        if pairs:  # each a pair of replicas on the nodes: ``ingresses`` are the P ones
            self.ingresses = [self.machine(Addr(0, i, P)) for i in range(pairs)]
            cut = 0 if restored is None else restored[1]
            if self.outcome.restarts:  # both follow their split's log past the cut first
                for i in range(pairs):
                    entries, index = self.epochs.replay(i, cut)
                    self.outcome.log_replays += any(e[0] == ITEM for e in entries)
                    position = self.epochs.restored_count(
                        i, cut, restored and self.coordinator.checkpoints[restored[0]])
                    for r in (P, S):
                        self.machine(Addr(0, i, r)).resume_from_log(cut, position, entries,
                                                                    index)
            self.epochs.start(cut)
        elif self.epochs is not None:
            self.ingresses = [builder.ingress(log_inputs=self.epochs.log_inputs,
                                              ingress_class=config.ingress_class, index=i)
                              for i in range(builder.ingresses)]
            cut = 0 if restored is None else restored[1]
            for ingress in self.ingresses if cut else ():
                ingress.resume_after(cut)  # numbered from the epoch after the cut
            self.epochs.start(cut)
        else:
            self.ingresses = [builder.ingress(log_inputs=self.restarts.source_parts is not None,
                                              ingress_class=config.ingress_class)]
        self.ingress = self.ingresses[0]
        if restored is not None and self.epochs is None:
            self.ingress.resume_after(restored[1])  # numbered from cut + 1
            self.next_input = restored[1]
        self.egresses = writers or self.moves.sinks.egresses(builder)
        for oracle in self.settled_oracles:
            oracle.begin(self.inputs, 0 if restored is None else self.position(restored[1]))
        for name, machines in ((INGRESS_HOST, [] if pairs else self.ingresses),
                               (EGRESS_HOST, [] if writers else self.egresses)):
            self._add_host(config.host_class(name, {m.addr: m for m in machines},
                                             topology.incarnations[name], peer_incs=peer_incs))
        self.recovery = Recovery(topology, writers=bool(writers))
        self.alive: Dict[str, bool] = {h: True for h in self.hosts}
        self.stopped = False
        self.net = Channels(self)
        self.detection = Detection(self)
        self.faults.reset()
        self.steps.reset()
        self.divergence.reset()  # the controller starts again with the job

    def _add_host(self, host: Host) -> None:
        self.hosts[host.name] = host
        for a in host.addresses():
            self.host_of[a] = host.name

    # -- the steps the scheduler may choose -----------------------------------
    def enabled(self) -> List[tuple]:
        return self.steps.collect()[0]

    def choosable(self) -> Tuple[List[tuple], List[str]]:
        """The enabled steps, and for each the process whose speed decides its pace
        (``host_of_step``)."""
        return self.steps.collect()

    def host_of_step(self, step: tuple) -> str:
        """The process whose speed decides how soon ``step`` happens."""
        return self.steps.host_of_step(step)

    def apply(self, step: tuple) -> None:
        self.steps.apply(step)
        if self.restarts.due:  # a pair was lost in this step: the job restarts
            self.restart(driver_lives=True)

    def machine(self, addr: Addr):
        return self.hosts[self.host_of[addr]].machines[addr]

    def live_machines(self):
        for name, host in self.hosts.items():
            if self.alive[name]:
                yield from host.machines.items()

    # -- what the machines ask for ------------------------------------------------
    def effects(self, envelopes: List[Envelope], others: List, host: Optional[Host] = None) -> None:
        if envelopes:
            self.net.send(envelopes)
        outcome = self.outcome
        for e in others:
            if isinstance(e, Deliver):  # into the sink, which drops what it committed
                if not self.writers.writes(host, e.partition):
                    continue  # a fenced writer (a zombie's)
                self.settled_oracles[e.partition].delivered(e.items)
                self.sink.deliver(e.partition, e.items)
            elif isinstance(e, TakeoverDone):
                outcome.takeovers.append(e.addr)
            elif isinstance(e, FoldedIn):
                self.broadcast(self.recovery.folded_in(e.reporter, e.addr, e.version))
            elif isinstance(e, TransferFailed):
                outcome.failed_transfers.append(e)
                self.broadcast(self.recovery.transfer_failed(*e.transfer))
            elif isinstance(e, StateInstalled):
                seg = host.segment_of(e.transfer) if host is not None else None
                if seg is not None and seg.addr.stage == 0 and e.complete:
                    self.epochs.read[seg.addr] = seg.inputs  # reads on from its twin's place
                installed = getattr(seg, "installed", None) or {}
                outcome.bulk_parts += installed.get("parts", 0)
                outcome.deltas += installed.get("deltas", 0)
                outcome.delta_keys += installed.get("delta_keys", 0)
            elif isinstance(e, CutChosen):
                self.begin_checkpoint(e.number, e.cut)
                self.store.report(self.coordinator.source_recorded(e.number, e.cut))
            elif isinstance(e, CutPassed):  # with all ingresses passed: the positions
                positions = self.epochs.passed(e.number, e.ingress, e.cut, e.read)
                if positions:
                    self.store.report(self.coordinator.source_recorded(e.number, positions))
            elif isinstance(e, Snapshot):
                found = self.divergence.snapshot(e, host.machines[e.addr],
                                                 partial(live_segment, self))
                if found is not None:  # on_divergence="fail": the job stops (DESIGN 14)
                    outcome.diverged, self.stopped = found.describe(), True
                elif e.data is None:
                    self.store.crossed(e)  # its twin writes this one
                else:
                    self.store.write(e, host)
            elif isinstance(e, SinkCommit):
                if not self.writers.writes(host, e.partition):
                    continue  # a fenced writer (a zombie's): the sink refuses it
                if e.number:
                    self.judge_commit(e, self.sink.holds(e.partition))
                self.sink.commit(e.partition)
                if e.through is not None:  # the writer hears its sink returned
                    self.net.send(host.run_local(
                        self.egresses[e.partition].committed(e.through))[0])
                if e.number:
                    last = self.sink.last_committed(e.partition)
                    self.store.report(self.coordinator.sink_committed(e.number, last,
                                                                      e.partition))
            elif isinstance(e, (RangePacked, PackRange, RangeInstalled)):  # a live move's
                self.moves.report(e, host.name)
            elif isinstance(e, (SmReady, SourcesPaused, SourcesResumed, RangeAwaited)):
                pass  # for the runtime's metrics
            else:
                raise ValueError(f"unknown effect {e!r}")
        if host is not None and self.config.deterministic and (
                host.name == EGRESS_HOST  # a step of an egress
                                 or host.name in self.writers.host.values()):
            claims = ingress_claims(self)
            for oracle, egress in zip(self.settled_oracles, self.egresses):
                oracle.check(egress, claims)

    def begin_checkpoint(self, number: int, cut: int) -> None:
        self.outcome.cuts.append((number, cut))
        self.last_cut = cut
        self.moves.cut_begun(number, cut)  # told the coordinator, the pairs not started

    def position(self, sn: int) -> int:
        """How many inputs have an SN up to ``sn`` (with one ingress: ``sn``)."""
        return sn if self.epochs is None else self.epochs.plan.position(sn)

    def broadcast(self, views: List[View]) -> None:
        """The controller's views, to every live process not declared dead."""
        placed = [a for view in views for a in view.avail + view.joined]
        for avail in placed:  # where each new replica will live
            self.host_of[avail.addr] = avail.node
            self.faults.placed(avail.addr, avail.node)
        for view in views:
            self.net.queue_views([view], self.alive, self.detection.declared)
        if placed:
            self.net.invalidate()
            self.steps.rehost()
        done = self.recovery.completed
        if len(done) > len(self.outcome.catchups):
            self.outcome.catchups.extend(done[len(self.outcome.catchups):])

    # -- faults and restarts, as the scheduler injects them ------------------------------
    def crash(self, name: str, keep: Optional[Dict] = None, silent: bool = False) -> Dict:
        return self.faults.crash(name, keep, silent)

    def starve(self, name: str, ticks: float) -> None:
        self.faults.starve(name, ticks)

    def cut_host(self, name: str, ticks: float) -> None:
        self.faults.cut_host(name, ticks)

    def safe_victims(self) -> List[str]:
        return self.faults.safe_victims()

    def faultable(self) -> List[str]:
        return self.faults.faultable()

    def restart(self, driver_lives: bool = False) -> None:
        self.restarts.restart(driver_lives)

    # -- the checkpoint store's state, by the names tests read ----------------------------
    @property
    def files(self) -> Dict[FileId, StoredFile]:
        return self.store.files

    @property
    def manifests(self) -> Dict[int, Tuple[int, Dict[Tuple[int, int], Chain]]]:
        return self.store.manifests

    @property
    def kept(self) -> List[int]:
        return self.store.kept

    @property
    def log_from(self) -> int:
        return self.store.log_from

    @log_from.setter
    def log_from(self, value: int) -> None:
        self.store.log_from = value


def live_segment(world: World, addr) -> Optional[Any]:
    """Replica ``addr``'s machine where its live host runs it, or None."""
    name = world.host_of.get(addr)
    host = world.hosts.get(name) if name is not None else None
    return host.machines.get(addr) if host is not None and world.alive[name] else None
