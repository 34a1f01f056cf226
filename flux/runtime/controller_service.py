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
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Tuple

from controller.failure_detector import (
    Declared,
    FailureDetector,
    Stalled,
    Stuck,
    Timings,
    Unstuck,
    Verdict,
)
from controller.recovery import Recovery
from flux.addresses import CONTROLLER, ProcAddr
from flux.control_messages import (
    CatchUpPaused,
    SnapshotWritten,
    Failed,
    FoldedIn,
    Heartbeat,
    Members,
    NodeStats,
    OperatorFailed,
    Ready,
    Register,
    StateMoved,
    Stop,
    Stopping,
    TakeoverDone,
    View,
    Welcome,
)
from flux.envelope import Envelope
from flux.errors import CheckpointCorrupt, OperatorError, PairLost
from flux.runtime.metrics import MAX_EVENTS
from flux.runtime.mover_service import mover_peer
from flux.runtime.transport import ConnectionLost, Transport
from statemover.messages import TransferFailed

#: a task that fails this many times before its node loop runs fails the job (SPARK_NOTES)
START_FAILURES = 3
#: what ``name_for`` returns to hold a registration until the job names every task at
#: once, knowing their hosts (no pair on one host)
PENDING = "<pending>"
#: views kept in ``views`` (what every process was told, for debugging; bounded)
VIEWS_KEPT = 64

log = logging.getLogger(__name__)


class ControllerService:
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
                 on_snapshot: Optional[Callable[[SnapshotWritten], None]] = None):
        self.transport = transport
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

    def add_member(self, name: str, inc: int, address: str, mover_address: str = "") -> None:
        """Know process ``name`` (its incarnation and sockets) without a registration."""
        self.incarnations[name] = inc
        self.addresses[name] = address
        if mover_address:
            self.mover_addresses[name] = mover_address

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

    def pids(self, name: str) -> Tuple[int, int]:
        """The (Python worker, executor JVM) process ids a registered task reported."""
        _, _, pid, jvm = self.registered[name]
        return pid, jvm

    def turn(self, timeout_ms: int) -> None:
        envelopes, gaps = self.transport.poll(timeout_ms)
        now = self.clock()
        self._act(self.detector.turned(now, timeout_ms / 1000))
        for env in envelopes:
            name = env.src.name if isinstance(env.src, ProcAddr) else None
            if name in self.dead and not isinstance(env.msg, (Register, Failed, Stopping)):
                self._tell_fenced(name, now)  # a zombie: cut off, declared dead, back
                continue
            self.detector.heard(name, now)
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
            elif isinstance(env.msg, SnapshotWritten) and self.on_snapshot is not None:
                self.on_snapshot(env.msg)
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
        if now - self._last_beat >= self.beat:  # the lease every process holds (DESIGN 6),
            self._last_beat = now               # from registration: nodes wait for the start
            for name in self._live():
                self._send(name, Heartbeat(), 0)
        if not self.started:
            return
        self._expire_attempts(now)
        self._act(self.detector.tick(now, self.recovery.holds_last_replica))

    def _act(self, verdicts: List[Verdict]) -> None:
        """Carry out the failure detector's verdicts."""
        now = self.clock()
        for v in verdicts:
            if isinstance(v, Declared):
                self.fail(v.name, v.why)
            elif isinstance(v, Stuck):
                log.warning("%s is alive but its loop has not turned for %.2fs", v.name, v.lag)
                self.events.append((now, "stuck", f"{v.name} ({v.lag:.2f}s)"))
            elif isinstance(v, Unstuck):
                log.info("%s's loop turns again (it stopped for up to %.2fs)", v.name,
                         v.longest)
            elif isinstance(v, Stalled):
                log.warning("the controller did not turn for %.2fs: silence in that time "
                            "is not counted", v.seconds)
                self.events.append((now, "controller stalled", round(v.seconds, 3)))

    def _tell_fenced(self, name: str, now: float) -> None:
        """A process declared dead speaks again (its link was cut and healed, or it was
        only slow): nothing it says is acted on, and it is told to stop (at most once a
        second), so its task fails and Spark re-runs it as a fresh standby (DESIGN 6)."""
        if now - self._told_fenced.get(name, float("-inf")) < 1.0:
            return
        self._told_fenced[name] = now
        log.warning("%s, declared dead (%s), is alive: told to stop", name,
                    self.why_dead.get(name, "?"))
        self.events.append((now, "zombie told to stop", name))
        self._send(name, Stop(f"fenced: declared dead ({self.why_dead.get(name, '?')})"), 0)

    def on_stopping(self, name: str, reason: str) -> None:
        """A node says it ends on its own: its reason goes in the driver's log, and it is
        failed now rather than when its connection drops."""
        if name in self.dead or not self.started:
            log.info("%s stopped: %s", name, reason)
            return
        log.warning("%s stops on its own: %s", name, reason)
        self.fail(name, f"it stopped: {reason}")

    def abort_attempt(self, transfer: tuple, why: str) -> None:
        """A state transfer failed with both ends alive (e.g. a checksum mismatch), or its
        attempt ran out of time: abort it and retry (DESIGN 4.6)."""
        views = self.recovery.transfer_failed(*transfer)
        if views:
            stage, partition, version = transfer
            log.warning("catch-up of stage %d partition %d (attempt %d) aborted: %s",
                        stage, partition, version, why)
            self.events.append((self.clock(), "catch-up aborted", f"{stage}.{partition}: {why}"))
            self._broadcast(views)

    def _expire_attempts(self, now: float) -> None:
        for addr, version, age in self.recovery.overdue(now, self.catchup_timeout):
            self.abort_attempt((addr.stage, addr.partition, version),
                               f"not folded in after {age:.0f}s")

    # -- membership --------------------------------------------------------------------
    def on_register(self, msg: Register) -> None:
        """A Spark task joins with the job's secret; anything else is refused.
        Idempotent: a task that registers again (it heard nothing yet) is welcomed again."""
        if self.secret is not None and msg.secret != self.secret:
            log.warning("refused a registration with a wrong secret from %s", msg.address)
            return
        again = [n for n, r in self.registered.items() if r[:2] == (msg.task, msg.inc)]
        if again:
            self._send(again[0], self._welcome(again[0]), 0)
            return
        name = self.name_for(msg) if self.name_for else None
        if name == PENDING:
            self.pending[msg.task, msg.inc] = msg
            return
        if name is None:
            log.warning("refused task %s attempt %s: no role for it", msg.task, msg.inc)
            return
        self.admit(msg, name)

    def admit(self, msg: Register, name: str) -> None:
        """Task ``msg`` joins as process ``name``: welcomed, watched, announced."""
        self.pending.pop((msg.task, msg.inc), None)
        self.registered[name] = (msg.task, msg.inc, msg.pid, msg.executor_pid)
        self.hosts[name] = msg.host
        self.executors[name] = msg.executor
        self.boots[name] = msg.boot
        self.add_member(name, msg.inc, msg.address, msg.mover_address)
        if self.stopping is not None:  # a task retried as the job stops: it ends at once
            self._connect(name)
            self._send(name, Stop(self.stopping), 0)
            return
        self.detector.watch(name, self.clock())
        self._connect(name)
        self._send(name, self._welcome(name), 0)
        log.info("%s joined: task %d, attempt %d, on %s", name, msg.task, msg.inc,
                 msg.host or "an unnamed host")
        if self.started:  # a late standby (a retried task): tell everyone where it is
            self.announce()
            host = msg.host if self.recovery.host_of else None
            self._broadcast(self.recovery.add_standby(name, msg.inc, host))

    def _welcome(self, name: str) -> Welcome:
        """Before the start, just the name; for a process joining a running job, the
        current state it starts from."""
        if not self.started:
            return Welcome(name)
        rec = self.recovery
        return Welcome(name, rec.view, tuple(sorted(rec.node_of.items())),
                       tuple(sorted(self.incarnations[n] for n in self.dead)))

    def on_start_failure(self, msg: Failed) -> None:
        """Spark retries a failed task forever (maxFailures is high, SPARK_NOTES): a task
        that fails before registering, again and again, has a deterministic error."""
        if self.secret is not None and msg.secret != self.secret:
            log.warning("ignored a start failure with a wrong secret (task %s)", msg.task)
            return
        reasons = self.start_failures.setdefault(msg.task, [])
        reasons.append(msg.reason)
        log.warning("task %s (attempt %s) failed to start: %s", msg.task, msg.inc, msg.reason)
        if msg.fatal and self.error is None:  # a node that registered: no retry can help
            self.error = (CheckpointCorrupt(*msg.corrupt) if len(msg.corrupt) == 2 else
                          RuntimeError(f"task {msg.task} could not start its node: "
                                       f"{msg.reason}"))
            return
        if len(reasons) >= START_FAILURES and self.error is None:
            self.error = RuntimeError(
                f"task {msg.task} failed {len(reasons)} times before its node started; "
                f"last error: {msg.reason}")

    def on_operator_failed(self, msg: OperatorFailed) -> None:
        """User code raised on a record: its other replica would raise too, so the job
        stops with that error (the first one reported) instead of failing over."""
        if self.secret is not None and msg.secret != self.secret:
            log.warning("ignored an operator failure with a wrong secret")
            return
        if self.error is None:
            self.error = OperatorError(msg.what, msg.stage, msg.partition, msg.sn, msg.error)

    def announce(self) -> None:
        """Where every process listens, and every StateMover (as ``name/mover``)."""
        entries = [(n, a, self.incarnations.get(n, 0)) for n, a in self.addresses.items()]
        entries += [(mover_peer(n), a, self.incarnations.get(n, 0))
                    for n, a in self.mover_addresses.items()]
        members = Members(tuple(sorted(entries)))
        for name in self._live():
            self._send(name, members, 0)

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
        if name not in self.transport.dealers:
            self._connect(name)
        self.transport.send(name, Envelope(CONTROLLER, ProcAddr(name), view, msg, 0, None))

    def fail(self, name: str, why: str) -> None:
        if name in self.dead or self.error is not None:
            return
        log.warning("declaring %s dead: %s", name, why)
        self._mark_dead(name, why, "detected", f"{name} ({why})")
        self.transport.disconnect(name)
        try:
            views = self.recovery.node_failed(name)
            for other in sorted(self.recovery.dead - self.dead):  # failed with it (4.2)
                self._fence(other, f"its replica set failed with {name}")
            self._broadcast(views)
        except PairLost as exc:
            self.error = exc  # the job must stop: both replicas of a partition are gone
            log.error("%s", exc)

    def _fence(self, name: str, why: str) -> None:
        """A live process the views declare failed: it is told to stop (and, fenced by its
        incarnation, is ignored by everyone even if it does not)."""
        log.warning("fencing %s: %s", name, why)
        self._send(name, Stop(f"fenced: {why}"), 0)
        self._mark_dead(name, why, "fenced", name)

    def _mark_dead(self, name: str, why: str, event: str, detail: str) -> None:
        self.dead.add(name)
        self.why_dead[name] = why
        self.detector.forget(name)
        self.node_stats.pop(name, None)
        self.events.append((self.clock(), event, detail))

    def _broadcast(self, views: List[View]) -> None:
        for view in views:
            self.views.append(view)
            for name in self._live():
                self._send(name, view, view.number)
