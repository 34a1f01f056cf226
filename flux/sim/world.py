"""The simulated cluster: hosts, FIFO channels, a controller, crashes, standbys.

The world runs the real protocol machines. Every connection between two
endpoints is a reliable FIFO queue (paper 2.2): nothing on a live connection
is dropped, duplicated or reordered. A crash stops a process at once; what it
had sent and was still in flight survives only as a prefix of each of its
outgoing queues (TCP delivers some of it), and everything addressed to it is
lost. The controller (``controller.recovery``) declares the crash in a
totally ordered view, later, and rebuilds lost replicas on standbys.

Who is declared dead, and when, is the failure detector's policy
(``controller.failure_detector``, DESIGN 6), run on a simulated clock that
ticks while anything is unheard:

- a crash the kernel reports (its connection drops) is a ``detect`` step;
  a *silent* crash (a machine that dies without a FIN) only stops being heard;
- a *cut* freezes every link of a host (TCP retransmits: nothing is lost,
  everything waits) until it heals; the host's processes keep running;
- a *starved* process is not heard for a while but runs and hears everyone
  (a false suspicion when it lasts past the timeout);
- a process declared dead while it runs is a *zombie*: it gets no more views
  and keeps stepping with whoever has not yet applied the view that fenced it,
  until its lease runs out or, heard again, it is told to stop;
- a lossy link between StateMovers drops envelopes; the mover's checks or the
  catch-up deadline (a number of ticks) abort the attempt, which is retried;
- a file of the checkpoint store is damaged (altered or lost) while its checksum, recorded
  when it was written, stays: a restart verifies what it restores and falls back to an
  older complete checkpoint, or stops the job when none verifies (DESIGN 10).

The world only says which steps are enabled and carries one out; the
scheduler (``flux.sim.schedule``) chooses.
"""
from __future__ import annotations

import hashlib
import math
import random
import zlib
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Deque, Dict, List, NamedTuple, Optional, Sequence, Tuple

from controller.checkpoints import CheckpointCoordinator
from controller.failure_detector import Declared, FailureDetector, Lease, Timings
from controller.placement import Placement
from controller.recovery import Recovery
from flux.addresses import Addr, MoverAddr, P, S
from flux.buffer import Buffer
from flux.builder import MachineBuilder
from flux.control_messages import FoldedIn, TakeoverDone, View
from flux.effects import (
    CutChosen,
    Deliver,
    SinkCommit,
    Snapshot,
    SourcesPaused,
    SourcesResumed,
    StateInstalled,
)
from flux.envelope import Envelope
from flux.errors import PairLost
from flux.host import Host
from flux.ingress import INGRESS, Ingress
from flux.segment import Segment
from flux.sim.oracle import Violation
from flux.snapshot_chain import BrokenChain, install, rebuild
from flux.state_codec import pack_state, unpack_state
from flux.topology import EGRESS_PROCESS, INGRESS_PROCESS, Topology
from statemover.messages import LinkLost, SmReady, TransferFailed

INGRESS_HOST = INGRESS_PROCESS
#: a process step takes one input (``process``) or up to this many (``process_ready``,
#: as the runtime's loop steps a segment)
PROCESS_LIMITS = (1, 2, 3, 8, 64)
EGRESS_HOST = EGRESS_PROCESS

#: the detector's timings in ticks, in the runtime's proportions (0.5 s silence, 2 s for a
#: last replica, a 3 s lease: README, failure timings)
SIM_TIMINGS = Timings(timeout=8, last_replica_timeout=32, stuck_after=16, stuck_timeout=480)
SIM_LEASE = 48
#: ticks a catch-up attempt may take before the controller aborts and retries it
SIM_CATCHUP_DEADLINE = 64


class ZombieMachine(NamedTuple):
    """The key of a zombie's machine: its address may already name a new replica
    elsewhere, and both run until the zombie stops."""

    name: str
    addr: Addr

    def __hash__(self) -> int:
        # a str's hash differs from process to process: the world's sets of machines would
        # be walked in another order, and a seed would not replay in another process
        return hash((zlib.crc32(self.name.encode()), self.addr))


#: who takes the "log" steps: the durable input log's writes (DESIGN 10)
INPUT_LOG = "input-log"
#: who takes the "corrupt" steps: the checkpoint store, where files get damaged
CHECKPOINT_STORE = "checkpoint-store"
#: the share of damaged files that are lost outright rather than altered
REMOVED_SHARE = 0.25

#: a file of the checkpoint store: (checkpoint, stage, partition, replica), as the
#: runtime names them (one per replica in each checkpoint's folder)
FileId = Tuple[int, int, int, int]
#: the files that rebuild a partition's state, each with the checksum its writer recorded
Chain = Tuple[Tuple[FileId, str], ...]


def checksum(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


@dataclass
class StoredFile:
    """A snapshot file as a restore reads it: its bytes and what they unpack to. Damage
    replaces both, never the state objects a replica's chain still shares."""

    data: bytes
    state: dict


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
    #: the chance that an envelope between two StateMovers is lost (a lossy mover link)
    mover_loss: float = 0.0
    host_class: type = Host
    #: checkpoints the ingress takes at moments of the scheduler's choosing (DESIGN 10)
    checkpoints: int = 0
    #: a lost pair restarts the whole job from its last complete checkpoint, this many
    #: times at most (0: the run ends as pair-lost)
    restarts_on_pair_lost: int = 0
    #: a replica's snapshots are whole once in this many, else its keyed stores' changes
    full_every: int = 1
    #: the source's own partitions (each input's, by position): with more than one, the
    #: ingress logs the SNs it gives before inputs leave, and after a restart the inputs
    #: the log does not cover come in another interleaving (DESIGN 10)
    source_parts: Optional[List[int]] = None
    ingress_class: type = Ingress
    #: the sink also commits between cuts (an exactly-once sink's ``commit_every``): what
    #: it holds then may lie beyond the last checkpoint, and a restart must give those
    #: outputs' inputs the same SNs again
    sink_commits: bool = False
    #: the store keeps this many complete checkpoints (and every file their chains read),
    #: and the input log what the oldest of them does not cover (None: everything)
    keep: Optional[int] = None
    #: files of the store damaged at moments of the scheduler's choosing (their recorded
    #: checksums unchanged)
    corrupt_checkpoints: int = 0
    #: a restart restores the newest complete checkpoint whose files all verify (False:
    #: the newest, unread)
    verify_restores: bool = True
    #: a complete checkpoint a restart skipped (a file did not verify) is no longer one:
    #: not kept, not restorable (False: its manifest stays and counts among the kept, a
    #: broken rule random schedules rarely reach: tests drive it to the violation)
    forget_skipped: bool = True
    #: after a restart the ingress's next cut may be any input after the restored cut, as
    #: the runtime's (else only one after every cut chosen before the restart)
    cuts_follow_restore: bool = False


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
    #: live processes declared dead (false suspicions, cut hosts), and how they stopped
    zombies: List[str] = field(default_factory=list)
    zombie_stops: List[str] = field(default_factory=list)
    #: mover envelopes lost, and catch-up attempts aborted by their deadline
    mover_lost: int = 0
    deadlines: int = 0
    #: checkpoints: cuts chosen, snapshots taken, those complete (every report in)
    cuts: List[Tuple[int, int]] = field(default_factory=list)
    snapshots: int = 0
    snapshots_skipped: int = 0  # crossed by the replica that does not write
    snapshot_deltas: int = 0  # snapshots written as changes over the writer's last one
    complete: List[int] = field(default_factory=list)
    #: whole-job restarts, and the checkpoint each started from (None: the beginning)
    restarts: List[Optional[int]] = field(default_factory=list)
    #: files damaged (file, "altered" or "removed"), complete checkpoints a restart skipped
    #: because a file did not verify, and why the job stopped when none verified
    damaged: List[Tuple[FileId, str]] = field(default_factory=list)
    fallbacks: List[int] = field(default_factory=list)
    checkpoint_corrupt: str = ""
    #: snapshots not written: a delta whose chain lost a file (the runtime's writer refuses)
    failed_writes: int = 0


class World:
    """Hosts running the protocol machines, connected by FIFO channels."""

    def __init__(self, dataflow, inputs: Sequence[Any], partitions: int, placement: Placement,
                 config: WorldConfig, rng, fault_rng: Optional[random.Random] = None,
                 corrupt_rng: Optional[random.Random] = None):
        self.rng = rng
        #: which file is damaged, and how: a stream of its own, as ``fault_rng``
        self.corrupt_rng = corrupt_rng or random.Random(0)
        #: draws for timed faults (truncations of a zombie's links, lost mover envelopes):
        #: a stream of its own, so runs without them draw what they always drew
        self.fault_rng = fault_rng or random.Random(0)
        #: how many inputs a process step takes (``PROCESS_LIMITS``): its own stream, so
        #: the schedules' draws stay those of each seed
        self.batch_rng = random.Random(0)
        self.dataflow = dataflow
        self.stages = len(dataflow.stages)
        self.partitions = partitions
        self.config = config
        self.inputs = list(inputs)
        self.next_input = 0
        #: the input log: how many inputs' SNs are durable (kept across restarts); it
        #: covers the inputs after ``log_from`` (truncated at complete checkpoints)
        self.logged_inputs = 0
        self.log_from = 0
        self.source_parts = list(config.source_parts) if config.source_parts else None
        #: told the inputs' new order after a restart interleaved the unlogged ones anew
        self.on_reorder: Callable[[List[Any]], None] = lambda inputs: None
        self.outcome = Outcome()
        self.crashed: List[str] = []
        segment_class = type(config.segment_class.__name__, (config.segment_class,),
                             {"bulk_pairs": config.bulk_pairs,
                              "bulk_per_step": config.bulk_per_step})
        self.builder = MachineBuilder(dataflow, partitions, config.capacity, config.batch_size,
                                      config.ingress_capacity, config.buffer_factory,
                                      segment_class, window=config.window,
                                      full_every=config.full_every)
        self.placement = placement
        self.coordinator = CheckpointCoordinator(self.stages, partitions, "sim")
        self.checkpoints_left = config.checkpoints
        #: the ingress chooses a cut only once it has sent an input after this one
        self.last_cut = 0
        #: the oracle's view of a snapshot and of a sink commit (set by ``make_world``)
        self.judge_snapshot: Callable = lambda *a: None
        self.judge_commit: Callable = lambda *a: None
        #: the checkpoint store: its files; per (checkpoint, stage, partition) the chain of
        #: the first snapshot written (a whole one, then deltas); the manifests of complete
        #: checkpoints (number -> cut, each partition's chain); those kept at the last one
        self.files: Dict[FileId, StoredFile] = {}
        self.parts: Dict[Tuple[int, int, int], Chain] = {}
        self.manifests: Dict[int, Tuple[int, Dict[Tuple[int, int], Chain]]] = {}
        self.kept: List[int] = []
        self.corruptions_left = config.corrupt_checkpoints
        #: checkpoints a snapshot of which could not be written: they never complete
        self.write_failed: set = set()
        #: per writing replica, its last snapshot's chain: each file with the state written
        #: (a delta builds on it; the oracle judges it as written, whatever the store holds)
        self.chains: Dict[Addr, List[Tuple[Tuple[FileId, str], dict]]] = {}
        #: the sink: ``outcome.delivered`` is what it holds; this much of it is committed
        self.sink_committed = 0
        self.restart_due = False
        #: (checkpoint, stage, partition) a replica crossed without writing (its twin's
        #: to write), and every replica address whose process halted: a checkpoint whose
        #: writer halted before writing never completes (the next one does)
        self.skipped: set = set()
        self.halted_replicas: set = set()
        self._build()

    def _build(self, restored: Optional[Tuple[int, int]] = None) -> None:
        """Every process of the job, fresh; ``restored``: ``(checkpoint, cut)`` whose
        snapshots (its manifest's chains) the segments start from, the inputs numbered
        from ``cut + 1``."""
        config, partitions = self.config, self.partitions
        self.hosts: Dict[str, Host] = {}
        self.host_of: Dict[Any, str] = {}
        topology = self.topology = Topology.numbered(self.placement, self.stages, partitions,
                                                     config.standbys)
        peer_incs = topology.peer_incs()
        for name in topology.workers:
            machines = {a: self.builder.segment(a) for a in topology.endpoints_of(name)}
            if restored is not None:
                chains = self.manifests[restored[0]][1]
                for a, seg in machines.items():  # as the runtime's restore_operators
                    install(seg.chain, self._read(chains[a.stage, a.partition]))
            self._add_host(config.host_class(name, machines, topology.incarnations[name],
                                             self.builder.standby_segment, config.chunk_size,
                                             peer_incs))
        self.ingress = self.builder.ingress(log_inputs=self.source_parts is not None,
                                            ingress_class=config.ingress_class)
        if restored is not None:
            self.ingress.accepted = self.next_input = restored[1]  # numbered from cut + 1
            self.ingress.logged = restored[1]
        self.egress = self.builder.egress()
        for name, machine in ((INGRESS_HOST, self.ingress), (EGRESS_HOST, self.egress)):
            self._add_host(config.host_class(name, {machine.addr: machine},
                                             topology.incarnations[name], peer_incs=peer_incs))
        self.recovery = Recovery(topology)
        self.alive: Dict[str, bool] = {h: True for h in self.hosts}
        self.channels: Dict[Tuple[Any, Any], Deque[Envelope]] = {}
        self.views: Dict[str, Deque[View]] = {h: deque() for h in self.hosts}
        self.crashed_undetected: List[str] = []
        self.stopped = False
        # -- the failure detector and its clock --------------------------------------
        self.now = 0.0
        self.detector = FailureDetector(SIM_TIMINGS)
        self.leases: Dict[str, Lease] = {}
        for name in topology.workers:
            self.detector.watch(name, 0.0)
            self.leases[name] = Lease(SIM_LEASE, 0.0)
        self.detector.arm(0.0)
        self.host_by_inc = {h.inc: n for n, h in self.hosts.items()}
        self.declared: set = set()
        self.silent_crashes: set = set()  # crashed, no FIN: found by silence alone
        self.starved: Dict[str, float] = {}  # live but unheard until this tick
        self.cut: Dict[str, float] = {}  # host -> the tick its links heal
        self.zombies: set = set()  # declared dead while running
        self.told: set = set()  # zombies heard again: a Stop is on its way
        self._mover_gaps: set = set()  # mover channels that lost an envelope since the last
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
        hosts, host_of, channels, cut = self.hosts, self.host_of, self.channels, self.cut
        for key in self._busy:
            head = channels[key][0]
            dst = self._route(head) if self.zombies else host_of[key[1]]
            if cut and (self.host_by_inc.get(head.inc) in cut or dst in cut):
                continue  # a cut link: TCP holds it until the cut heals
            if hosts[dst].accepts(head):
                steps.append(("deliver", key))
        for name, q in self.views.items():
            if q and name not in cut:
                steps.append(("view", name))
        for name in self.crashed_undetected:
            steps.append(("detect", name))
        for name in sorted(self.told):
            if name not in cut:  # the controller's Stop waits for the link too
                steps.append(("told", name))
        if self._clock_runs():
            steps.append(("tick",))
        for key in self._dirty:
            if isinstance(key, ZombieMachine):
                zombie = self.hosts[key.name]
                if key.name in self.zombies and key.addr in zombie.machines:
                    self._local[key] = [("zombie", key.name, s) for s in
                                        self._local_steps(key.addr, zombie.machines[key.addr])]
                else:
                    self._local.pop(key, None)
            elif key in self._local or self._is_live_worker(key):
                self._local[key] = self._local_steps(key)
        self._dirty.clear()
        for local in self._local.values():
            steps.extend(local)
        if self.config.sink_commits and len(self.outcome.delivered) > self.sink_committed:
            steps.append(("sink-commit",))  # an exactly-once sink's own commit_every
        if self.corruptions_left and self.files:
            steps.append(("corrupt",))  # a file of the store is damaged
        if not steps and self.recovery.attempts and self.config.mover_loss:
            steps.append(("tick",))  # a catch-up waits for what a lossy link lost: its
        return steps                 # deadline is long next to a healthy transfer

    def _route(self, env: Envelope) -> str:
        """The process an envelope reaches: the incarnation it was meant for if that is a
        zombie (TCP to it still works), else whoever hosts the address now."""
        meant = self.host_by_inc.get(env.dst_inc)
        return meant if meant in self.zombies else self.host_of[env.dst]

    @staticmethod
    def _machine_of(key) -> Addr:
        return key.addr if isinstance(key, ZombieMachine) else key

    def _key(self, name: str, addr: Addr):
        """The key of machine ``addr`` of process ``name`` among the local steps."""
        return ZombieMachine(name, addr) if name in self.zombies else addr

    def _is_live_worker(self, addr: Addr) -> bool:
        name = self.host_of.get(addr)
        return (name is not None and self.alive[name] and name != EGRESS_HOST
                and addr in self.hosts[name].machines)

    def _local_steps(self, addr: Addr, seg=None) -> List[tuple]:
        if addr == INGRESS:
            steps = [("flush", INGRESS, i, d) for i, d in self.ingress.flushable()]
            if self.next_input < len(self.inputs) and self.ingress.can_accept(
                    self.inputs[self.next_input]):
                steps.append(("accept",))
            if self.checkpoints_left and self.ingress.accepted > self.last_cut:
                steps.append(("checkpoint",))
            if self.ingress.log_due():
                steps.append(("log",))  # the input log made durable up to here
            return steps
        seg = seg if seg is not None else self.machine(addr)
        steps = [("flush", addr, i, d) for i, d in seg.flushable()]
        if seg.can_process():
            steps.append(("process", addr))
        if seg.credits_due():
            steps.append(("credit", addr))  # back-pressure: what it took may be replaced
        if seg.has_part():
            steps.append(("part", addr))  # phase 1 of catch-up: one bulk part out
        if seg.snapshot_due():
            steps.append(("snapshot", addr))  # a checkpoint's cut crossed
        return steps

    def host_of_step(self, step: tuple) -> str:
        """The process whose speed decides how soon ``step`` happens."""
        kind = step[0]
        if kind == "deliver":
            return self._route(self.channels[step[1]][0]) if self.zombies else \
                self.host_of[step[1][1]]
        if kind == "view":
            return step[1]
        if kind in ("detect", "tick"):
            return "controller"
        if kind in ("told", "zombie"):
            return step[1]
        if kind == "log":
            return INPUT_LOG
        if kind == "corrupt":
            return CHECKPOINT_STORE
        if kind == "sink-commit":
            return EGRESS_HOST
        if kind in ("accept", "checkpoint"):
            return INGRESS_HOST
        return self.host_of[step[1]]

    def apply(self, step: tuple) -> None:
        self._apply(step)
        if self.restart_due:  # a pair was lost in this step: the job restarts
            self.restart(driver_lives=True)

    def _apply(self, step: tuple) -> None:
        kind = step[0]
        if kind == "deliver":
            q = self.channels[step[1]]
            env = q.popleft()
            if not q:
                del self._busy[step[1]]
            host = self.hosts[self._route(env) if self.zombies else self.host_of[env.dst]]
            if step[1] in self._mover_gaps:  # the transport sees the gap before this one
                self._mover_gaps.discard(step[1])
                self._effects(*host.on_envelope(replace(env, msg=LinkLost(0, 1))), host=host)
            self._dirty.add(self._key(host.name, env.dst))
            if isinstance(env.dst, MoverAddr):  # mover signals reach its segments
                self._dirty.update(self._key(host.name, a) for a in host.machines)
            self._effects(*host.on_envelope(env), host=host)
        elif kind == "view":
            view = self.views[step[1]].popleft()
            host = self.hosts[step[1]]
            effects = host.on_view(view)
            for key in [k for k in self._local if self._machine_of(k) not in host.machines
                        and (k.name if isinstance(k, ZombieMachine)
                             else self.host_of.get(k)) == host.name]:
                del self._local[key]  # a discarded replica has no more steps
            self._dirty.update(self._key(host.name, a) for a in host.machines)
            self._effects(*effects, host=host)
        elif kind == "detect":
            self.detect(step[1])
        elif kind == "tick":
            self.tick()
        elif kind == "told":
            self._halt(step[1])  # a zombie heard again: the controller told it to stop
        elif kind == "accept":
            self.ingress.accept(self.inputs[self.next_input])
            self.next_input += 1
            self._dirty.add(INGRESS)
        elif kind == "sink-commit":
            self.sink_committed = len(self.outcome.delivered)
        elif kind == "log":
            n = self.ingress.accepted
            self.logged_inputs = max(self.logged_inputs, n)
            self._effects(*self.hosts[INGRESS_HOST].run_local(self.ingress.inputs_logged(n)))
            self._dirty.add(INGRESS)
        elif kind == "checkpoint":
            self.checkpoints_left -= 1
            self._dirty.add(INGRESS)
            self._effects(*self.hosts[INGRESS_HOST].run_local(
                self.ingress.choose_cut(len(self.outcome.cuts) + 1)))
        elif kind == "corrupt":
            self.corrupt()
        elif kind == "zombie":  # a local step of a machine of a zombie
            self._apply_local(step[2], self.hosts[step[1]])
        else:
            self._apply_local(step, self.hosts[self.host_of[step[1]]])

    def _apply_local(self, step: tuple, host: Host) -> None:
        kind, addr = step[0], step[1]
        machine = host.machines[addr]
        self._dirty.add(self._key(host.name, addr))
        if kind == "process":  # one input, or as the runtime does, several in one step
            limit = self.batch_rng.choice(PROCESS_LIMITS)
            if limit == 1:
                machine.process()
            else:
                machine.process_ready(limit)
        elif kind == "part":
            self.outcome.part_steps += 1
            self._effects(*host.run_local(machine.send_part()))
        elif kind == "credit":
            self._effects(*host.run_local(machine.send_credits()))
        elif kind == "flush":
            self._effects(*host.run_local(machine.flush(*step[2:])))
        elif kind == "snapshot":
            # one replica of a pair writes (the runtime's rule, DESIGN 10): its twin crosses
            # the cut without packing; the oracle still judges the state it crossed with
            keep = self._keeps_snapshot(host, machine.addr)
            envelopes, others = host.run_local(machine.snapshot(keep))
            for e in others:
                if isinstance(e, Snapshot) and e.data is None:
                    self.judge_snapshot(replace(e, data=pack_state(
                        {"operators": machine.chain.get_state()})))
            self._effects(envelopes, others, host=host)
        else:
            raise ValueError(f"unknown step {step}")

    def _chain(self, snap: Snapshot) -> List[Tuple[Tuple[FileId, str], dict]]:
        """The chain a written snapshot ends (the runtime's SnapshotWriter): a whole one
        starts one, a delta extends its replica's last; a failed write makes the next one
        whole, so a delta over anything else is the protocol's error."""
        state = unpack_state(snap.data)
        a = snap.addr
        entry = ((snap.number, a.stage, a.partition, a.replica), checksum(snap.data)), state
        if snap.base is None:
            chain = [entry]
        else:
            chain = self.chains.get(a)
            if not chain or chain[-1][1].get("checkpoint") != snap.base:
                raise Violation(f"checkpoint {snap.number}: {a} wrote a delta over "
                                f"checkpoint {snap.base}, its last snapshot written is "
                                f"{chain[-1][1].get('checkpoint') if chain else None}")
            chain = chain + [entry]
        self.chains[a] = chain
        return chain

    def _keeps_snapshot(self, host: Host, addr: Addr) -> bool:
        """The runtime's rule (HostLoop._writes_snapshot): the S replica writes; the P one
        only once its host knows S's process dead (or S never exists)."""
        if addr.replica == S:
            return True
        twin = self.host_of.get(addr._replace(replica=S))
        return twin is None or self.hosts[twin].inc in host.dead_incs

    def machine(self, addr: Addr):
        return self.hosts[self.host_of[addr]].machines[addr]

    def _effects(self, envelopes: List[Envelope], others: List, host: Optional[Host] = None) -> None:
        loss = self.config.mover_loss
        for env in envelopes:
            dst_host = self._route(env) if self.zombies else self.host_of.get(env.dst)
            if dst_host is None or not self.alive[dst_host]:
                continue  # the peer is gone: TCP would fail the send
            if loss and isinstance(env.dst, MoverAddr) and self.fault_rng.random() < loss:
                self.outcome.mover_lost += 1
                self._mover_gaps.add((env.src, env.dst))  # the next one shows the gap
                continue  # a lossy mover link
            key = (env.src, env.dst)
            self.channels.setdefault(key, deque()).append(env)
            self._busy[key] = None
        for e in others:
            if isinstance(e, Deliver):  # into the sink, which drops what it committed
                held, done = self.outcome.delivered, self.sink_committed
                floor = held[done - 1][0] if done else None
                held.extend(item for item in e.items if floor is None or item[0] > floor)
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
            elif isinstance(e, CutChosen):
                self.outcome.cuts.append((e.number, e.cut))
                self.last_cut = e.cut
                self.coordinator.begin(e.number, e.cut)
                self._checkpoint_report(self.coordinator.source_recorded(e.number, e.cut))
            elif isinstance(e, Snapshot) and e.data is None:
                self.outcome.snapshots_skipped += 1  # its twin writes this one
                self.skipped.add((e.number, e.addr.stage, e.addr.partition))
            elif isinstance(e, Snapshot):
                self.outcome.snapshots += 1
                self.outcome.snapshot_deltas += e.base is not None
                chain = self._chain(e)
                try:
                    state = rebuild([written for _, written in chain])
                except BrokenChain as exc:
                    raise Violation(f"checkpoint {e.number}: {e.addr}'s chain: {exc}") from None
                self.judge_snapshot(replace(e, data=pack_state({"operators": state})))
                (fid, _), written = chain[-1]
                if any(f not in self.files for (f, _), _ in chain[:-1]):
                    # the runtime's writer refuses a delta whose chain lost a file: this
                    # checkpoint stays incomplete, the replica's next snapshot is whole
                    self.outcome.failed_writes += 1
                    self.write_failed.add(e.number)
                    del self.chains[e.addr]
                    host.machines[e.addr].snapshot_lost()
                    continue
                self.files[fid] = StoredFile(e.data, written)
                self.parts.setdefault((e.number, e.addr.stage, e.addr.partition),
                                      tuple(f for f, _ in chain))
                self._checkpoint_report(self.coordinator.part_written(
                    e.number, e.addr.stage, e.addr.partition, str(e.addr)))
            elif isinstance(e, SinkCommit):
                delivered = self.outcome.delivered
                self.judge_commit(e, len(delivered))
                self.sink_committed = len(delivered)
                last = delivered[-1][0] if delivered else None
                self._checkpoint_report(self.coordinator.sink_committed(e.number, last))
            elif isinstance(e, (SmReady, SourcesPaused, SourcesResumed)):
                pass  # for the runtime's metrics
            else:
                raise ValueError(f"unknown effect {e!r}")

    def _broadcast(self, views: List[View]) -> None:
        for view in views:
            for avail in view.avail:
                self.host_of[avail.addr] = avail.node  # where the new replica will live
            for h, q in self.views.items():
                if self.alive[h] and h not in self.declared:
                    q.append(view)
        done = self.recovery.completed
        if len(done) > len(self.outcome.catchups):
            self.outcome.catchups.extend(done[len(self.outcome.catchups):])

    def restart(self, driver_lives: bool = False) -> None:
        """Everything stops at once (the driver died, or a pair was lost): the job starts
        again from its last complete checkpoint, or from the beginning without one. The
        sink keeps what it committed and drops what it had not (DESIGN 10); when a pair was
        lost the driver lives on and first commits what the sink was handed, as the
        runtime's supervisor does (it is the failure-free prefix: its inputs' SNs are in
        the input log).

        The checkpoint restored is the newest complete one whose files all verify: one
        that does not is skipped for good (a fallback); if none does, the job stops
        (``checkpoint_corrupt``). The input log must still cover its cut."""
        if driver_lives:
            self.sink_committed = len(self.outcome.delivered)
        del self.outcome.delivered[self.sink_committed:]
        self.restart_due = False
        skipped = len(self.outcome.fallbacks)
        k = self._restorable()
        if k is None and len(self.outcome.fallbacks) > skipped:
            self.outcome.checkpoint_corrupt = (
                "no complete checkpoint verifies: skipped "
                + ", ".join(map(str, self.outcome.fallbacks[skipped:])))
            self.stopped = True  # the runtime's CheckpointCorrupt
            return
        restored = None if k is None else (k, self.manifests[k][0])
        cut = 0 if restored is None else restored[1]
        if self.source_parts is not None and cut < self.log_from:
            raise Violation(f"the input log was truncated past checkpoint {k}'s cut: it covers "
                            f"the inputs after {self.log_from}, the restart reads from "
                            f"input {cut + 1} on")
        self.coordinator.restarted(k)
        self.outcome.restarts.append(k)
        if self.config.cuts_follow_restore:
            self.last_cut = cut
        self.chains = {}  # every replica starts anew: its first snapshot is whole
        if self.source_parts is not None:
            self._interleave_anew(self.logged_inputs)
        if restored is None:
            self.next_input = 0
        self._build(restored)

    def _interleave_anew(self, logged: int) -> None:
        """A source of several partitions read again from a checkpoint's position: the
        log fixes the order of the first ``logged`` inputs, the rest may come in any
        interleaving that keeps each partition's own order."""
        rest = list(zip(self.inputs[logged:], self.source_parts[logged:]))
        queues: Dict[int, Deque] = {}
        for item in rest:
            queues.setdefault(item[1], deque()).append(item)
        merged = []
        while queues:
            part = self.rng.choice(sorted(queues))
            merged.append(queues[part].popleft())
            if not queues[part]:
                del queues[part]
        if merged != rest:
            self.inputs[logged:] = [record for record, _ in merged]
            self.source_parts[logged:] = [part for _, part in merged]
            self.on_reorder(self.inputs)

    def _restorable(self) -> Optional[int]:
        """The newest complete checkpoint whose files all verify (as their checksums were
        recorded when they were written), or None; the ones that do not are dropped from
        the store's complete ones: kept, one's cut may lie after the cuts that follow the
        restored one, and the input log would be truncated past those."""
        for k in sorted(self.manifests, reverse=True):
            if not self.config.verify_restores or not self._unverified(k):
                return k
            self.outcome.fallbacks.append(k)
            if self.config.forget_skipped:
                del self.manifests[k]
        return None

    def _unverified(self, k: int) -> List[FileId]:
        """The files of checkpoint ``k``'s chains that are missing or not as written."""
        files = self.files
        return [f for chain in self.manifests[k][1].values() for f, digest in chain
                if f not in files or checksum(files[f].data) != digest]

    def _read(self, chain: Chain) -> List[dict]:
        """What a restore reads of a partition's chain."""
        try:
            return [self.files[f].state for f, _ in chain]
        except KeyError as exc:
            raise FileNotFoundError(f"checkpoint file {exc.args[0]} is not in the store") from None

    def _checkpoint_report(self, manifest: Optional[dict]) -> None:
        if manifest is None:
            return
        k = self.coordinator.latest_complete
        self.outcome.complete.append(k)
        chains = {(s, p): self.parts[k, s, p] for s in range(1, self.stages + 1)
                  for p in range(self.partitions)}
        if any(f not in self.files for chain in chains.values() for f, _ in chain):
            return  # the runtime's store refuses a manifest that names a missing file
        self.manifests[k] = (self.coordinator.checkpoints[k].cut, chains)
        self._prune(k)

    def _prune(self, k: int) -> None:
        """As the runtime's store when checkpoint ``k`` completes: keep the last ``keep``
        complete checkpoints, every file their chains read and what replicas still writing
        build on (their last chain, unless it is older than every checkpoint kept); the
        input log loses what the oldest kept checkpoint covers."""
        keep = self.config.keep
        if keep is None:
            return
        oldest = self.kept[0] if self.kept else k
        done = sorted(self.manifests)
        if len(done) > keep:
            needed = {f[0] for chain in self.chains.values() if chain[-1][0][0][0] >= oldest
                      for (f, _), _ in chain}
            for j in done[-keep:]:
                needed.update(f[0] for chain in self.manifests[j][1].values() for f, _ in chain)
            oldest_kept = done[-keep]
            for j in done[:-keep]:
                del self.manifests[j]
            for f in [f for f in self.files if f[0] < oldest_kept and f[0] not in needed]:
                del self.files[f]
            for key in [key for key in self.parts if key[0] < oldest_kept
                        and key[0] not in needed]:
                del self.parts[key]
            done = done[-keep:]
        self.kept = done
        self.log_from = max(self.log_from, self.manifests[done[0]][0])

    def corrupt(self) -> None:
        """One file of the store is damaged, its recorded checksum unchanged: a number in
        its operators' state changed (a restore of it gives a wrong state), or the file
        lost (also when it holds no number). The file is one a complete checkpoint reads if
        there is one (else any: a checkpoint may complete over a damaged file)."""
        self.corruptions_left -= 1
        rng = self.corrupt_rng
        read = sorted({f for _, chains in self.manifests.values() for chain in chains.values()
                       for f, _ in chain if f in self.files})
        fid = rng.choice(read or list(self.files))
        state = unpack_state(self.files[fid].data)
        numbers = _numbers(state["operators"]) + [
            n for _, delta in state.get("changes", ()) for n in _numbers(delta)]
        if numbers and rng.random() >= REMOVED_SHARE:
            holder, key = rng.choice(numbers)
            holder[key] += 1
            self.files[fid] = StoredFile(pack_state(state), state)
            self.outcome.damaged.append((fid, "altered"))
        else:
            del self.files[fid]
            self.outcome.damaged.append((fid, "removed"))

    # -- failures -------------------------------------------------------------
    def crash(self, name: str, keep: Optional[Dict] = None, silent: bool = False) -> Dict:
        """Fail-stop: the process halts; a prefix of what it sent is still delivered.
        Its connections drop (a ``detect`` step follows) unless the crash is ``silent``
        (a machine that dies sends no FIN: only its silence tells).

        Returns how many messages each outgoing channel kept, so a replay
        (``keep``) truncates exactly as the original run did."""
        kept = self._halt(name, keep, self.rng)
        self.crashed.append(name)
        if name in self.declared:
            pass  # a zombie (declared already) crashed for real
        elif silent:
            self.silent_crashes.add(name)
        else:
            self.crashed_undetected.append(name)
        return kept

    def _halt(self, name: str, keep: Optional[Dict] = None,
              rng: Optional[random.Random] = None) -> Dict:
        """The process stops: nothing more from it, a prefix of its in-flight messages
        survives, everything addressed to it is lost."""
        rng = rng or self.fault_rng
        self.alive[name] = False
        mine = set(self.hosts[name].addresses())
        self.halted_replicas |= mine
        if name in self.zombies:
            self.zombies.discard(name)
            self.told.discard(name)
            self.outcome.zombie_stops.append(name)
            for a in mine:
                self._local.pop(ZombieMachine(name, a), None)
        else:
            for a in mine:
                self._local.pop(a, None)
        self.views[name].clear()
        kept: Dict = {}
        for key in list(self._busy):
            src, dst = key
            q = self.channels[key]
            if dst in mine and self.host_of.get(dst) == name:
                q.clear()
            elif src in mine:  # its own messages: a prefix survives (others share the
                inc = self.hosts[name].inc  # channel: a rebuilt replica of its address)
                own = [e for e in q if e.inc == inc]
                if own:
                    n = keep.get(key, len(own)) if keep is not None else rng.randint(0, len(own))
                    kept[key] = n
                    lost = {id(e) for e in own[n:]}
                    if lost:
                        q = self.channels[key] = deque(e for e in q if id(e) not in lost)
            if not q:
                del self._busy[key]
        return kept

    def detect(self, name: str) -> None:
        """A crashed process's connection dropped: the failure detector declares it dead
        at once (3.2.1), in the next view."""
        self.crashed_undetected.remove(name)
        self._act(self.detector.connection_dropped(name))

    def _act(self, verdicts) -> None:
        for v in verdicts:
            if isinstance(v, Declared) and not self.stopped:
                self.declare(v.name)

    def declare(self, name: str) -> None:
        """The controller declares ``name`` dead: views to everyone else. If it still runs
        it is a zombie: it hears no more views and its lease is no longer renewed."""
        if name in self.crashed_undetected:
            self.crashed_undetected.remove(name)
        self.silent_crashes.discard(name)
        try:
            views = self.recovery.node_failed(name)
        except PairLost as lost:
            if len(self.outcome.restarts) < self.config.restarts_on_pair_lost:
                self.restart_due = True  # at the end of this step (DESIGN 10)
                return
            self.outcome.pair_lost = [Addr(lost.stage, lost.partition, P)]
            self.stopped = True
            return
        for other in [name] + sorted(self.recovery.dead - self.declared - {name}):
            self.declared.add(other)
            self.detector.forget(other)
            if self.alive[other]:
                self.zombies.add(other)
                self.outcome.zombies.append(other)
                for a in self.hosts[other].machines:  # its steps go on under keys of its own
                    if self.host_of.get(a) == other:
                        self._local.pop(a, None)
                        self._dirty.discard(a)
                    self._dirty.add(ZombieMachine(other, a))
                if other != name:
                    self.told.add(other)  # failed with its replica set: told to stop (4.2)
        self._broadcast(views)

    # -- the failure detector's clock ---------------------------------------------
    def _clock_runs(self) -> bool:
        """Time matters while someone is unheard or a zombie runs."""
        return bool(self.starved or self.cut or self.zombies or self.silent_crashes)

    def starve(self, name: str, ticks: float) -> None:
        """``name`` runs but is not heard for ``ticks`` (a false suspicion if that lasts)."""
        self.starved[name] = self.now + ticks

    def cut_host(self, name: str, ticks: float) -> None:
        """Every link of ``name`` is down for ``ticks``; its processes keep running."""
        self.cut[name] = self.now + ticks

    def heard(self, name: str) -> bool:
        """Do ``name``'s beats reach the controller now?"""
        return self.alive[name] and name not in self.starved and name not in self.cut

    def tick(self) -> None:
        """One tick of the controller's clock: heal what is due, hear who can be heard,
        renew leases, let the failure detector judge, expire leases and deadlines."""
        now = self.now = self.now + 1
        self.starved = {n: t for n, t in self.starved.items() if t > now and self.alive[n]}
        self.cut = {n: t for n, t in self.cut.items() if t > now and self.alive[n]}
        for name in self.detector.live():
            if self.alive[name] and name not in self.cut:
                self.leases[name].heard(now)  # the controller's beats reach it
            if self.heard(name):
                self.detector.heard(name, now)
        for name in sorted(self.zombies):
            if self.heard(name):
                self.told.add(name)  # it speaks again: told to stop (DESIGN 6)
        self._act(self.detector.tick(now, self.recovery.holds_last_replica))
        for name, lease in sorted(self.leases.items()):
            if self.alive[name] and lease.expired(now):  # it stops on its own
                if name in self.declared:
                    self._halt(name)
                else:
                    self.crash(name)  # it says so: the controller hears it stopped
        self._expire_attempts(now)

    def _expire_attempts(self, now: float) -> None:
        for addr, version, _ in self.recovery.overdue(now, SIM_CATCHUP_DEADLINE):
            self.outcome.deadlines += 1
            self._broadcast(self.recovery.transfer_failed(addr.stage, addr.partition, version))

    def safe_victims(self) -> List[str]:
        """Live nodes and standbys whose crash leaves one replica of every pair alive."""
        rec = self.recovery
        gone = set(rec.missing)
        for name in (self.crashed_undetected + sorted(self.silent_crashes)
                     + sorted(self.starved) + sorted(self.cut)):
            gone |= rec.hosted.get(name, set())
        victims = []
        for name, host in self.hosts.items():
            if (not self.alive[name] or name in (INGRESS_HOST, EGRESS_HOST)
                    or name in self.declared):
                continue
            if all(Addr(a.stage, a.partition, 1 - a.replica) not in gone
                   for a in rec.hosted.get(name, ())):
                victims.append(name)
        return victims

    # -- the end of a run -----------------------------------------------------
    def faultable(self) -> List[str]:
        """Live workers not declared, cut or starved: who may be cut or starved next."""
        return [n for n in self.detector.live() if self.alive[n] and n not in self.cut
                and n not in self.starved]

    def live_machines(self):
        for name, host in self.hosts.items():
            if self.alive[name]:
                yield from host.machines.items()


def _numbers(value: Any) -> List[Tuple[Any, Any]]:
    """Where a state holds a finite number: ``(container, index or key)`` of each."""
    found: List[Tuple[Any, Any]] = []
    items = (enumerate(value) if isinstance(value, list)
             else value.items() if isinstance(value, dict) else ())
    for key, item in items:
        if isinstance(item, (list, dict)):
            found.extend(_numbers(item))
        elif isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item):
            found.append((value, key))
    return found
