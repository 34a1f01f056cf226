"""The controller service: failure detection and totally ordered views (paper 3.2.1).

It listens for heartbeats (any message counts; nodes beat from a thread of
their own and say how long ago their loop last turned) from every process it
watches and tells the pure ``FailureDetector`` (controller/failure_detector.py)
what it heard and when, and when a connection dropped or showed a gap; the
detector's verdicts say who is dead, stuck or fine again. The pure
``Recovery`` turns failures, fold-in reports and failed or overdue
catch-up attempts into views, which go to every live process in order over
its FIFO connection. The ingress and the egress are assumed
always available (paper 3.1.1) and are never declared dead.

The service is split along its seams, one file each: how a task becomes a
member (``flux.runtime.controller_registration``), how failures are
declared (``flux.runtime.controller_failures``), the pairs' digests
(``flux.runtime.controller_divergence``), the ranges of live moves
(``flux.runtime.controller_moves``) and dormant pairs' starts
(``flux.runtime.controller_joins``); this file holds what they
share: the service's record, its turn and its connections to every process.
"""
from __future__ import annotations

import queue
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from controller.divergence import DivergenceMonitor
from controller.failure_detector import FailureDetector, Timings
from controller.range_relay import RangeRelay
from controller.recovery import Recovery
from flux.addresses import CONTROLLER, Addr, ProcAddr
from flux.control_messages import (
    CatchUpPaused,
    CutDigest,
    ProbedKeys,
    RangeInstalled,
    RangePacked,
    SinkCommitted,
    SnapshotWritten,
    WriterProgress,
    IngressEnded,
    SplitCutPassed,
    Failed,
    FoldedIn,
    Heartbeat,
    NodeStats,
    OperatorFailed,
    Ready,
    Register,
    StateMoved,
    Stop,
    Stopping,
    TakeoverDone,
    View,
)
from flux.envelope import Envelope
from flux.runtime.controller_divergence import ON_DIVERGENCE, DivergenceSide
from flux.runtime.controller_failures import FailureSide
from flux.runtime.controller_joins import JoinSide
from flux.runtime.controller_moves import MoveRelaySide
from flux.runtime.controller_registration import PENDING, START_FAILURES, RegistrationSide
from flux.runtime.metrics import MAX_EVENTS
from flux.runtime.transport import ConnectionLost, Transport
from statemover.messages import TransferFailed

#: reports of the data's progress from the nodes, for the driver (``on_data_report``)
DATA_REPORTS = (WriterProgress, SinkCommitted, IngressEnded, SplitCutPassed)
#: views kept in ``views`` (what every process was told, for debugging; bounded)
VIEWS_KEPT = 64


class ControllerService(RegistrationSide, FailureSide, DivergenceSide, MoveRelaySide,
                        JoinSide):
    """The controller's process: membership, failure detection, views.

    Built before anyone registers; ``add_member`` makes a process known without a
    registration (the thread cluster knows all of them in advance), ``begin`` starts
    watching and recovering once every node has joined."""

    def __init__(self, transport: Transport, timeout: float = 0.3, clock=time.monotonic,
                 secret: Optional[str] = None, beat: float = 0.05,
                 last_replica_timeout: float = 2.0,
                 name_for: Optional[Callable[[Register], Optional[str]]] = None,
                 events=None, stuck_after: float = 1.0,
                 stuck_timeout: float = 30.0, catchup_timeout: float = 120.0,
                 on_snapshot: Optional[Callable[[SnapshotWritten], None]] = None,
                 on_data_report: Optional[Callable[[Any], None]] = None,
                 on_divergence: str = "fail",
                 operator_names: Optional[Dict[int, List[str]]] = None):
        """``on_data_report``: told every ``WriterProgress`` and ``SinkCommitted`` of the
        sinks' writers on the nodes and every ``IngressEnded`` of the ingresses there
        (docs/design/parallel_io.md). ``on_divergence``: what a
        pair's digests that disagree do (``flux.runtime.controller_divergence``);
        ``operator_names``: stage -> its operators' names, for the error."""
        if on_divergence not in ON_DIVERGENCE:
            raise ValueError(f"on_divergence must be one of {ON_DIVERGENCE}, got "
                             f"{on_divergence!r}")
        self.on_divergence = on_divergence
        self.operator_names = operator_names or {}
        #: the pairs' digests, compared per cut (DESIGN 14)
        self.divergence = DivergenceMonitor()
        #: divergences waiting for their replicas' keys (``controller_divergence.Probe``)
        self.probes: dict = {}
        #: ranges of live moves on their way to their destinations (DESIGN 13)
        self.ranges = RangeRelay()
        self.range_waits: Dict[tuple, float] = {}
        self.range_took: Dict[tuple, float] = {}
        self.staged: set = set()
        #: the newest complete checkpoint, (number, cut), as the driver last said; and
        #: what each egress of one partition was told of it, where (``send_done``)
        self.newest_done: Optional[Tuple[int, int]] = None
        self._init_membership()  # pairs started and stopped (``JoinSide``)
        self.done_told: Dict[Addr, Tuple[str, int]] = {}
        self.transport = transport
        self.on_data_report = on_data_report
        #: a node wrote (or failed to write) a checkpoint snapshot: the job's checkpoints
        self.on_snapshot = on_snapshot
        self.recovery: Optional[Recovery] = None
        self.secret = secret
        self.beat = beat
        self._last_beat = float("-inf")
        #: decides the name of a registering task, or None to refuse it
        self.name_for = name_for
        #: registrations (task, inc) -> (name, pid, executor pid), for kill_node and logs
        self.registered: Dict[str, tuple] = {}
        #: registrations held (``PENDING``) until ``admit`` names them, by (task, inc)
        self.pending: Dict[Tuple[int, int], Register] = {}
        #: process -> the machine it runs on, and its kernel's boot id, as it registered
        self.hosts: Dict[str, str] = {}
        self.executors: Dict[str, str] = {}  # name -> Spark's executor id
        self.boots: Dict[str, str] = {}
        self.started = False
        #: registered processes that said they are built and their loop turns (``Ready``)
        self.ready: set = set()
        self.start_failures: Dict[int, List[str]] = {}
        self.incarnations: Dict[str, int] = {CONTROLLER.name: transport.incarnation}
        self.addresses: Dict[str, str] = {CONTROLLER.name: transport.address}
        #: the policy: silence (``timeout``; ``last_replica_timeout`` for a node whose
        #: failure would lose a pair), stuck loops (reported past ``stuck_after``, failed
        #: past ``stuck_timeout``), dropped connections, gaps
        self.detector = FailureDetector(Timings(timeout, last_replica_timeout, stuck_after,
                                                stuck_timeout))
        self.clock = clock
        #: a catch-up attempt not folded in after this long is aborted and retried (3.4)
        self.catchup_timeout = catchup_timeout
        self.dead: set = set()
        self.mover_addresses: Dict[str, str] = {}  # process -> its StateMover's socket
        self.why_dead: Dict[str, str] = {}
        self._told_fenced: Dict[str, float] = {}  # dead process -> when last told to stop
        #: live node -> (when, its last NodeStats), for the metrics endpoint
        self.node_stats: Dict[str, Tuple[float, NodeStats]] = {}
        self.views: Deque[View] = deque(maxlen=VIEWS_KEPT)  # the last views, for debugging
        #: (time, what, detail); a job passes its metrics' EventLog
        self.events = events if events is not None else deque(maxlen=MAX_EVENTS)
        self.error: Optional[Exception] = None
        #: set by ``stop_all``: why the job stops (a task that registers later is told so)
        self.stopping: Optional[str] = None
        #: messages for every live process, from other threads (``tell_all``)
        self._to_all: "queue.SimpleQueue" = queue.SimpleQueue()

    @property
    def timeout(self) -> float:
        return self.detector.timings.timeout

    @property
    def last_seen(self) -> Dict[str, float]:
        """Watched processes, and when each was last heard."""
        return {n: self.detector.watched[n].seen for n in self.detector.live()}

    @property
    def stuck(self) -> Dict[str, float]:
        """Processes whose loop does not turn, and the longest lag each reported."""
        return self.detector.stuck()

    def begin(self, recovery: Recovery) -> None:
        """Every node is here: watch every worker from now, tell everyone where everyone
        listens, and let ``recovery`` turn failures into views."""
        self.recovery = recovery
        now = self.clock()
        for name in recovery.topology.workers:  # the thread cluster's never registered
            if name not in self.detector.watched and name not in self.dead:
                self.detector.watch(name, now)
        self.detector.arm(now)
        self.started = True
        self.announce()

    def turn(self, timeout_ms: int) -> None:
        envelopes, gaps = self.transport.poll(timeout_ms)
        now = self.clock()
        self._act(self.detector.turned(now, timeout_ms / 1000))
        for env in envelopes:
            name = env.src.name if isinstance(env.src, ProcAddr) else None
            # a beat that left late: its process was starved, a silence of its own making
            if isinstance(env.msg, Heartbeat) and env.msg.late > self.detector.timings.timeout / 2:
                self.events.append((now, "late heartbeat", f"{name} ({env.msg.late:.3f}s)"))
            if name in self.dead and not isinstance(env.msg, (Register, Failed, Stopping)):
                self._tell_fenced(name, now, env.msg)  # a zombie: cut off, declared dead, back
                continue
            self.detector.heard(name, now)
            if name is not None:
                self.heard_view(name, env.view)
            if isinstance(env.msg, Register):
                self.on_register(env.msg)
            elif isinstance(env.msg, Failed):
                self.on_start_failure(env.msg)
            elif isinstance(env.msg, OperatorFailed):
                self.on_operator_failed(env.msg)
            elif isinstance(env.msg, FoldedIn) and self.started:
                self._broadcast(self.recovery.folded_in(env.msg.reporter, env.msg.addr,
                                                        env.msg.version))
                if not self.recovery.pending():
                    self.events.append((now, "catch-up done", env.msg.addr))
            elif isinstance(env.msg, TakeoverDone):
                self.events.append((now, "take-over done", env.msg.addr))
            elif isinstance(env.msg, StateMoved):
                self.events.append((now, "state moved",
                                    (env.msg.addr, env.msg.nbytes, env.msg.seconds)))
            elif isinstance(env.msg, Stopping) and name in self.registered:
                self.on_stopping(name, env.msg.reason)
            elif isinstance(env.msg, CutDigest):
                self.on_cut_digest(env.msg)
            elif isinstance(env.msg, ProbedKeys):
                self.on_probed_keys(env.msg)
            elif isinstance(env.msg, RangePacked):
                self.on_range_packed(env.msg)
            elif isinstance(env.msg, RangeInstalled):
                self.on_range_installed(env.msg, name)
            elif isinstance(env.msg, SnapshotWritten) and self.on_snapshot is not None:
                self.on_snapshot(env.msg)
            elif isinstance(env.msg, DATA_REPORTS) and self.on_data_report:
                self.on_data_report(env.msg)
            elif isinstance(env.msg, CatchUpPaused):
                self.events.append((now, "paused", (env.msg.addr, env.msg.seconds)))
            elif isinstance(env.msg, Ready) and name in self.registered:
                self.ready.add(name)
            elif isinstance(env.msg, NodeStats) and name in self.detector.watched:
                self.node_stats[name] = (now, env.msg)
            elif isinstance(env.msg, Heartbeat):
                self._act(self.detector.heartbeat(name, env.msg.lag, now))
            elif isinstance(env.msg, TransferFailed) and self.started:
                self.abort_attempt(env.msg.transfer, f"{name}: {env.msg.reason}")
        for gap in gaps:
            if isinstance(gap, ConnectionLost):  # fast detection: its process is gone
                self._act(self.detector.connection_dropped(gap.peer))
            else:  # from the process's own socket or its liveness thread's ("name/liveness")
                self._act(self.detector.connection_gap(gap.peer.split("#")[0].split("/")[0],
                                                       gap.expected, gap.got))
        self._send_told()
        self.send_ranges()
        self.send_done()
        if now - self._last_beat >= self.beat:  # the lease every process holds (DESIGN 6),
            self._last_beat = now               # from registration: nodes wait for the start
            for name in self._live():
                self._send(name, Heartbeat(), 0)
        if not self.started:
            return
        self._expire_attempts(now)
        self.expire_probes(now)
        self.place_joins()
        self.place_leaves()
        self._act(self.detector.tick(now, self.recovery.holds_last_replica))

    def tell_all(self, msg) -> None:
        """Any thread: ``msg`` to every live process, sent at the controller's next turn
        (a checkpoint's cut at an epoch's end, ``CutAtEpoch``)."""
        self._to_all.put(msg)

    def _send_told(self) -> None:
        while True:
            try:
                msg = self._to_all.get_nowait()
            except queue.Empty:
                return
            for name in self._live():
                self._send(name, msg, 0)

    def stop_all(self, reason: str) -> None:
        """Tell every live process to stop; from now on their silence and their closed
        connections are expected, not failures."""
        self.stopping = reason
        self.detector.disarm()
        for name in self._live():
            self._send(name, Stop(reason), 0)
        self.transport.flush()

    def _live(self):
        return [n for n in self.addresses if n not in self.dead and n != CONTROLLER.name]

    def _connect(self, name: str) -> None:
        self.transport.connect(name, self.addresses[name])
        if name in self.detector.watched:  # a watched process: know at once when it dies
            self.transport.watch(name)

    def _send(self, name: str, msg, view: int) -> None:
        self._send_to(name, ProcAddr(name), msg, view)

    def _send_to(self, name: str, dst, msg, view: int) -> None:
        """``msg`` to endpoint ``dst`` (the process, or a segment it hosts) in ``name``."""
        if name not in self.transport.dealers:
            self._connect(name)
        self.transport.send(name, Envelope(CONTROLLER, dst, view, msg, 0, None))

    def _broadcast(self, views: List[View]) -> None:
        for view in views:
            self.views.append(view)
            for name in self._live():
                self._send(name, view, view.number)


__all__ = ["ControllerService", "PENDING", "START_FAILURES", "VIEWS_KEPT"]
