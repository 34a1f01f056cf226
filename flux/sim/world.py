"""The simulated cluster: hosts, FIFO channels, a controller, crashes, standbys.

The world runs the real protocol machines. Every connection between two
endpoints is a reliable FIFO queue (paper 2.2): nothing on a live connection
is dropped, duplicated or reordered. A crash stops a process at once; what it
had sent and was still in flight survives only as a prefix of each of its
outgoing queues (TCP delivers some of it), and everything addressed to it is
lost. The controller (``controller.recovery``) declares the crash in a
totally ordered view, later, and rebuilds lost replicas on standbys.

The world only says which steps are enabled and carries one out; the
scheduler (``flux.sim.schedule``) chooses.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from controller.placement import Placement
from controller.recovery import Recovery
from flux.addresses import Addr, MoverAddr, P
from flux.buffer import Buffer
from flux.builder import MachineBuilder
from flux.control_messages import FoldedIn, TakeoverDone, View
from flux.effects import Deliver, SourcesPaused, SourcesResumed, StateInstalled
from flux.envelope import Envelope
from flux.errors import PairLost
from flux.host import Host
from flux.ingress import INGRESS
from flux.segment import Segment
from flux.topology import EGRESS_PROCESS, INGRESS_PROCESS, Topology
from statemover.messages import SmReady, TransferFailed

INGRESS_HOST = INGRESS_PROCESS
EGRESS_HOST = EGRESS_PROCESS


@dataclass
class WorldConfig:
    capacity: int = 4
    ingress_capacity: int = 4
    batch_size: int = 2
    buffer_factory: Callable[[int], Buffer] = Buffer
    segment_class: type = Segment
    standbys: int = 0
    chunk_size: int = 64
    #: two-phase catch-up: keyed pairs per bulk part, and whether the active hands
    #: out one part per local "part" step (else all of them at sm_ready)
    bulk_pairs: int = 2
    bulk_per_step: bool = True
    #: back-pressure: tuples a consumer may hold untaken per connection (None: no credits)
    window: Optional[int] = None


@dataclass
class Outcome:
    delivered: List[Any] = field(default_factory=list)
    takeovers: List[Addr] = field(default_factory=list)
    pair_lost: List[Addr] = field(default_factory=list)
    catchups: List[Addr] = field(default_factory=list)
    failed_transfers: List[Any] = field(default_factory=list)
    #: two-phase catch-up, counted at installs: bulk parts, keyed deltas, keys in them
    bulk_parts: int = 0
    deltas: int = 0
    delta_keys: int = 0
    #: bulk parts handed to a mover by "part" steps (phase 1 interleaved with processing)
    part_steps: int = 0


class World:
    """Hosts running the protocol machines, connected by FIFO channels."""

    def __init__(self, dataflow, inputs: Sequence[Any], partitions: int, placement: Placement,
                 config: WorldConfig, rng):
        self.rng = rng
        self.dataflow = dataflow
        self.stages = len(dataflow.stages)
        self.partitions = partitions
        self.config = config
        self.inputs = list(inputs)
        self.next_input = 0
        self.outcome = Outcome()
        segment_class = type(config.segment_class.__name__, (config.segment_class,),
                             {"bulk_pairs": config.bulk_pairs,
                              "bulk_per_step": config.bulk_per_step})
        self.builder = MachineBuilder(dataflow, partitions, config.capacity, config.batch_size,
                                      config.ingress_capacity, config.buffer_factory,
                                      segment_class, window=config.window)
        self.hosts: Dict[str, Host] = {}
        self.host_of: Dict[Any, str] = {}
        topology = self.topology = Topology.numbered(placement, self.stages, partitions,
                                                     config.standbys)
        peer_incs = topology.peer_incs()
        for name in topology.workers:
            machines = {a: self.builder.segment(a) for a in topology.endpoints_of(name)}
            self._add_host(Host(name, machines, topology.incarnations[name],
                                self.builder.standby_segment, config.chunk_size, peer_incs))
        self.ingress = self.builder.ingress()
        self.egress = self.builder.egress()
        for name, machine in ((INGRESS_HOST, self.ingress), (EGRESS_HOST, self.egress)):
            self._add_host(Host(name, {machine.addr: machine}, topology.incarnations[name],
                                peer_incs=peer_incs))
        self.recovery = Recovery(topology)
        self.alive: Dict[str, bool] = {h: True for h in self.hosts}
        self.channels: Dict[Tuple[Any, Any], Deque[Envelope]] = {}
        self.views: Dict[str, Deque[View]] = {h: deque() for h in self.hosts}
        self.crashed_undetected: List[str] = []
        self.crashed: List[str] = []
        self.stopped = False
        # Enabled local steps per machine, recomputed only for machines a step
        # touched: a machine's local steps depend on its own state alone.
        self._local: Dict[Addr, List[tuple]] = {}
        self._dirty = {a for a in self.host_of if isinstance(a, Addr)}
        self._busy: Dict[Tuple[Any, Any], None] = {}  # non-empty channels, in a fixed order

    def _add_host(self, host: Host) -> None:
        self.hosts[host.name] = host
        for a in host.addresses():
            self.host_of[a] = host.name

    # -- the steps the scheduler may choose -----------------------------------
    def enabled(self) -> List[tuple]:
        steps: List[tuple] = []
        if self.stopped:
            return steps
        hosts, host_of, channels = self.hosts, self.host_of, self.channels
        for key in self._busy:
            if hosts[host_of[key[1]]].accepts(channels[key][0]):
                steps.append(("deliver", key))
        for name, q in self.views.items():
            if q:
                steps.append(("view", name))
        for name in self.crashed_undetected:
            steps.append(("detect", name))
        for addr in self._dirty:
            if addr in self._local or self._is_live_worker(addr):
                self._local[addr] = self._local_steps(addr)
        self._dirty.clear()
        for local in self._local.values():
            steps.extend(local)
        return steps

    def _is_live_worker(self, addr: Addr) -> bool:
        name = self.host_of.get(addr)
        return (name is not None and self.alive[name] and name != EGRESS_HOST
                and addr in self.hosts[name].machines)

    def _local_steps(self, addr: Addr) -> List[tuple]:
        if addr == INGRESS:
            steps = [("flush", INGRESS, i, d) for i, d in self.ingress.flushable()]
            if self.next_input < len(self.inputs) and self.ingress.can_accept(
                    self.inputs[self.next_input]):
                steps.append(("accept",))
            return steps
        seg = self.machine(addr)
        steps = [("flush", addr, i, d) for i, d in seg.flushable()]
        if seg.can_process():
            steps.append(("process", addr))
        if seg.credits_due():
            steps.append(("credit", addr))  # back-pressure: what it took may be replaced
        if seg.has_part():
            steps.append(("part", addr))  # phase 1 of catch-up: one bulk part out
        return steps

    def host_of_step(self, step: tuple) -> str:
        """The process whose speed decides how soon ``step`` happens."""
        kind = step[0]
        if kind == "deliver":
            return self.host_of[step[1][1]]
        if kind == "view":
            return step[1]
        if kind == "detect":
            return "controller"
        if kind == "accept":
            return INGRESS_HOST
        return self.host_of[step[1]]

    def apply(self, step: tuple) -> None:
        kind = step[0]
        if kind == "deliver":
            q = self.channels[step[1]]
            env = q.popleft()
            if not q:
                del self._busy[step[1]]
            host = self.hosts[self.host_of[env.dst]]
            self._dirty.add(env.dst)
            if isinstance(env.dst, MoverAddr):
                self._dirty.update(host.machines)  # mover signals reach its segments
            self._effects(*host.on_envelope(env), host=host)
        elif kind == "view":
            view = self.views[step[1]].popleft()
            host = self.hosts[step[1]]
            effects = host.on_view(view)
            for addr in [a for a in self._local if self.host_of.get(a) == host.name
                         and a not in host.machines]:
                del self._local[addr]  # a discarded replica has no more steps
            self._dirty.update(host.machines)
            self._effects(*effects)
        elif kind == "detect":
            self.detect(step[1])
        elif kind == "accept":
            self.ingress.accept(self.inputs[self.next_input])
            self.next_input += 1
            self._dirty.add(INGRESS)
        elif kind == "process":
            self.machine(step[1]).process()
            self._dirty.add(step[1])
        elif kind == "part":
            host = self.hosts[self.host_of[step[1]]]
            self._dirty.add(step[1])
            self.outcome.part_steps += 1
            self._effects(*host.run_local(self.machine(step[1]).send_part()))
        elif kind == "credit":
            host = self.hosts[self.host_of[step[1]]]
            self._dirty.add(step[1])
            self._effects(*host.run_local(self.machine(step[1]).send_credits()))
        elif kind == "flush":
            addr, i, d = step[1:]
            host = self.hosts[self.host_of[addr]]
            self._dirty.add(addr)
            self._effects(*host.run_local(self.machine(addr).flush(i, d)))
        else:
            raise ValueError(f"unknown step {step}")

    def machine(self, addr: Addr):
        return self.hosts[self.host_of[addr]].machines[addr]

    def _effects(self, envelopes: List[Envelope], others: List, host: Optional[Host] = None) -> None:
        for env in envelopes:
            dst_host = self.host_of.get(env.dst)
            if dst_host is None or not self.alive[dst_host]:
                continue  # the peer is gone: TCP would fail the send
            key = (env.src, env.dst)
            self.channels.setdefault(key, deque()).append(env)
            self._busy[key] = None
        for e in others:
            if isinstance(e, Deliver):
                self.outcome.delivered.extend(e.items)
            elif isinstance(e, TakeoverDone):
                self.outcome.takeovers.append(e.addr)
            elif isinstance(e, FoldedIn):
                self._broadcast(self.recovery.folded_in(e.reporter, e.addr, e.version))
            elif isinstance(e, TransferFailed):
                self.outcome.failed_transfers.append(e)
                self._broadcast(self.recovery.transfer_failed(*e.transfer))
            elif isinstance(e, StateInstalled):
                seg = host.segment_of(e.transfer) if host is not None else None
                installed = getattr(seg, "installed", None) or {}
                self.outcome.bulk_parts += installed.get("parts", 0)
                self.outcome.deltas += installed.get("deltas", 0)
                self.outcome.delta_keys += installed.get("delta_keys", 0)
            elif isinstance(e, (SmReady, SourcesPaused, SourcesResumed)):
                pass  # for the runtime's metrics
            else:
                raise ValueError(f"unknown effect {e!r}")

    def _broadcast(self, views: List[View]) -> None:
        for view in views:
            for avail in view.avail:
                self.host_of[avail.addr] = avail.node  # where the new replica will live
            for h, q in self.views.items():
                if self.alive[h]:
                    q.append(view)
        done = self.recovery.completed
        if len(done) > len(self.outcome.catchups):
            self.outcome.catchups.extend(done[len(self.outcome.catchups):])

    # -- failures -------------------------------------------------------------
    def crash(self, name: str, keep: Optional[Dict] = None) -> Dict:
        """Fail-stop: the process halts; a prefix of what it sent is still delivered.

        Returns how many messages each outgoing channel kept, so a replay
        (``keep``) truncates exactly as the original run did."""
        self.alive[name] = False
        self.views[name].clear()
        mine = set(self.hosts[name].addresses())
        for a in mine:
            self._local.pop(a, None)
        kept: Dict = {}
        for key in list(self._busy):
            src, dst = key
            q = self.channels[key]
            if dst in mine and self.host_of.get(dst) == name:
                q.clear()
            elif src in mine and q and q[0].inc == self.hosts[name].inc:
                n = keep.get(key, len(q)) if keep is not None else self.rng.randint(0, len(q))
                kept[key] = n
                while len(q) > n:
                    q.pop()
            if not q:
                del self._busy[key]
        self.crashed_undetected.append(name)
        self.crashed.append(name)
        return kept

    def detect(self, name: str) -> None:
        """The controller declares a crashed process dead in the next view (3.2.1)."""
        self.crashed_undetected.remove(name)
        try:
            self._broadcast(self.recovery.node_failed(name))
        except PairLost as lost:
            self.outcome.pair_lost = [Addr(lost.stage, lost.partition, P)]
            self.stopped = True

    def safe_victims(self) -> List[str]:
        """Live nodes and standbys whose crash leaves one replica of every pair alive."""
        rec = self.recovery
        gone = set(rec.missing)
        for name in self.crashed_undetected:
            gone |= rec.hosted.get(name, set())
        victims = []
        for name, host in self.hosts.items():
            if not self.alive[name] or name in (INGRESS_HOST, EGRESS_HOST):
                continue
            if all(Addr(a.stage, a.partition, 1 - a.replica) not in gone
                   for a in rec.hosted.get(name, ())):
                victims.append(name)
        return victims

    # -- the end of a run -----------------------------------------------------
    def live_machines(self):
        for name, host in self.hosts.items():
            if self.alive[name]:
                yield from host.machines.items()
