"""Drive one process's protocol machines over the ZeroMQ transport.

The runtime twin of the simulator's world, for a single process: it feeds
envelopes from the transport to the ``Host`` (which decides what may be taken
now: a message from a later view or behind a guarded control message waits
at the head of its connection, DEALER-side FIFO order kept), runs the local
steps (process every input the merges release, flush every batch), and
hands the envelopes the machines return back to the transport. No protocol
rule lives here (DESIGN 3).

The loop is the turn and what arrives; its parts, one file each: the
machines' local work (``flux.runtime.local_steps``), what it sends
(``flux.runtime.outbox``), the ingress's source
(``flux.runtime.source_intake``) and the timing of catch-ups
(``flux.runtime.catchup_timing``).
"""
from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from controller.failure_detector import Lease
from flux.addresses import CONTROLLER, S, MoverAddr, ProcAddr
from flux.control_messages import (
    CutAtEpoch,
    HoldInputs,
    CutDigest,
    ProbedKeys,
    ProbeKeys,
    FoldedIn,
    RangeInstalled,
    RangePacked,
    Heartbeat,
    Members,
    NodeStats,
    SinkCommitted,
    SplitCutPassed,
    Stop,
    TakeoverDone,
    View,
    Welcome,
)
from flux.effects import (
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
from flux.protocol.ingress import INGRESS
from flux.runtime.catchup_timing import CatchUpTiming
from flux.runtime.local_steps import ITEM_DELAY, LocalSteps
from flux.runtime.metrics import Metrics
from flux.runtime.outbox import Outbox
from flux.runtime.range_timing import RangeTiming
from flux.runtime.source_intake import SourceIntake
from flux.runtime.transport import ConnectionGap, Transport
from statemover.messages import SmReady, TransferFailed

log = logging.getLogger(__name__)

#: effects of a catch-up step, which the host may have carried to another segment
CATCH_UP_EVENTS = (SmReady, StateInstalled, SourcesPaused, SourcesResumed, TransferFailed)


def probed_keys(host: Host, msg: ProbeKeys) -> ProbedKeys:
    """The controller asks where a replica's state differs from its twin's (DESIGN 14):
    the answer, from the segment here."""
    work = host.work.get(msg.addr)
    pairs = None
    if work is not None and work.snapshots is not None:
        found = work.snapshots.probe_keys(msg.number, msg.cut, msg.operator, msg.groups)
        pairs = None if found is None else tuple(tuple(p) for p in found)
    return ProbedKeys(msg.addr, msg.number, msg.cut, msg.operator, pairs)


def from_dead(gap: ConnectionGap, dead_incs) -> bool:
    """Did ``gap`` happen on a connection from an incarnation a view declared dead? Its
    messages are dropped anyway (a zombie back from a cut, DESIGN 6): nothing it sent,
    and nothing it failed to send, is acted on."""
    inc = gap.peer.rpartition("#")[2]
    return inc.isdigit() and int(inc) in dead_incs


class HostLoop:
    """One process: its Host, its Transport, and where every endpoint lives."""

    def __init__(self, host: Host, transport: Transport, where: Dict[Any, str],
                 addresses: Dict[str, str], on_effect: Callable[[Any], None] = lambda e: None,
                 source: Optional[Iterator[Any]] = None, incarnations: Dict[str, int] = None,
                 on_turn: Callable[[], None] = lambda: None, clock=time.monotonic,
                 lease: Optional[float] = None, metrics: Optional[Metrics] = None,
                 flush_delay: float = 0.002, mover_relay: Optional[str] = None,
                 max_turn: float = 0.02, stats_every: Optional[float] = None,
                 snapshots=None, ack_delay: float = 0.005, item_delay: float = ITEM_DELAY,
                 writer_sinks=None, split_ingresses=None):
        """``flush_delay``: a batch waits this long for more (``LocalSteps``);
        ``item_delay``: an ingress's item waits this long for more inputs (``LocalSteps``);
        ``ack_delay``: an ack or credit waits this long for a later one (``Outbox``)."""
        self.host = host
        self.me = ProcAddr(host.name)
        self.view_applied = host.view  # (host.view is set as a view begins to apply)
        self.transport = transport
        #: which process hosts each segment address; avail moves an address to a standby
        self.where = dict(where)
        self.addresses = addresses
        self.incarnations = dict(incarnations or {})
        #: processes whose incarnation the host knows to be fenced (a late joiner's start)
        self.dead_processes: set = {n for n, i in self.incarnations.items()
                                    if i in host.dead_incs}
        #: called at every turn: the liveness thread reports how long ago that was
        self.on_turn = on_turn
        self.clock = clock
        #: a node that stops hearing from the controller stops itself (DESIGN 6)
        self.lease = Lease(lease, clock()) if lease is not None else None
        self.stopped: Optional[str] = None
        self.on_effect = on_effect
        self.intake = SourceIntake(source, metrics)
        #: a turn that still has work after this long returns (and the next begins at once):
        #: a busy node keeps beating and hearing the controller
        self.max_turn = max_turn
        self._more = False
        #: the peer that carries this node's StateMover traffic (its StateMoverService);
        #: None: straight to the other node's process, on the data connections
        self.mover_relay = mover_relay
        self.outbox = Outbox(transport, addresses, self.dead_processes, clock, ack_delay)
        self.ack_delay = ack_delay
        self.ranges = RangeTiming(clock)  # live moves' ranges (DESIGN 13)
        self.local = LocalSteps(host, self._emit, clock, flush_delay, self._keeps_snapshot,
                                item_delay, self.ranges.began)
        self.timing = CatchUpTiming(host, clock)
        #: envelopes taken off the wire, per connection, until the host may take them
        self.held: Dict[Tuple[Any, Any], Deque[Envelope]] = {}
        self.gaps: List[ConnectionGap] = []
        #: a node reports its segments' counters this often (monitoring; None: never)
        self.stats_every = stats_every
        self._stats_sent = clock()
        #: where this node's checkpoint snapshots go (a SnapshotWriter); None: nowhere
        self.snapshots = snapshots
        #: the sinks of the writers this node runs (``WriterSinks``); None: none here
        self.writer_sinks = writer_sinks
        #: the ingress replicas this node runs, each reading a split (``NodeIngresses``)
        self.splits = split_ingresses

    @property
    def source_done(self) -> bool:
        """The source has no more records (or there is none)."""
        return self.intake.done

    # -- one turn of the poller loop ------------------------------------------------
    def turn(self, timeout_ms: int) -> bool:
        """Receive, deliver, work, send. Returns True if anything moved. What a step
        sends leaves at its end, one message per peer (``Transport.bundling``)."""
        with self.transport.bundling():
            return self._turn(timeout_ms)

    def _turn(self, timeout_ms: int) -> bool:
        envelopes, gaps = self.transport.poll(self._poll_timeout(timeout_ms))
        self.gaps += gaps
        lost = [g for g in gaps if isinstance(g, ConnectionGap)
                and not from_dead(g, self.host.dead_incs)]
        if lost and self.stopped is None:
            # Messages from a live peer vanished in transit (DESIGN 4.4): this process's
            # state no longer matches its twin's. It stops, fail-stop, and its pair masks it.
            g = lost[0]
            self._stop(f"messages from {g.peer} were lost in transit (expected "
                       f"#{g.expected}, got #{g.got})")
            return False
        # The lease is judged at the poll: a controller message in this batch proves it was
        # alive then. Judged after handling the batch, a long step (building a big operator
        # for a new replica, installing its state) would look like the controller's silence
        # while its beats wait, unread, in the socket (a standby stopped so at 100 MB).
        polled = self.clock()
        if self.lease is not None and any(env.src == CONTROLLER for env in envelopes):
            self.lease.heard(polled)
        if not self.transport.poll_limited:  # else the controller's may be among the rest
            self._check_lease(polled)
        if self.stopped is not None:
            return False
        for env in envelopes:
            self.receive(env)
        self.on_turn()
        if self.snapshots is not None:
            self._snapshots_written()
        for packed in self.ranges.packed():  # live moves' bulks, packed off this thread
            self.report(packed)
        if self.writer_sinks is not None:  # writers commit at least this often
            self._emit(*self.host.run_local(self.writer_sinks.opened()))
            self._writers_committed()
            self._emit(*self.host.run_local(self.writer_sinks.commits_due(polled)))
            for report in self.writer_sinks.progress(polled):
                self.report(report)
        if self.stats_every is not None and polled - self._stats_sent >= self.stats_every:
            self._stats_sent = polled
            self.report(NodeStats(tuple(m.stats() for m in self.host.machines.values())))
        moved = bool(envelopes)
        deadline = self.clock() + self.max_turn
        while True:
            if not self.outbox.drain():
                self._more = False  # wait for the peers a little, do not spin
                return moved  # back-pressure: nothing new until the outboxes empty
            step = self._deliver() | self._accept_input() | self.local.run()
            self.transport.flush()
            moved |= step
            self._more = step
            if not step or self.clock() >= deadline:
                self.outbox.send_held_acks(self.clock() - self.ack_delay)
                return moved  # more to do: the next turn polls without waiting

    def _poll_timeout(self, timeout_ms: int) -> int:
        """No wait with work at hand; else until the first of: the source's next record,
        a batch's ``flush_delay``, an ack's ``ack_delay``."""
        if self._busy():
            return 0
        due_in = self.intake.due_in()
        if due_in is not None:
            timeout_ms = min(timeout_ms, math.ceil(due_in * 1000))
        epoch = self.splits.due(self.host, self.clock()) if self.splits is not None else None
        for due in (self.local.flush_due(), self.local.cut_due(), self.outbox.acks_due(), epoch):
            if due is not None:
                timeout_ms = max(0, min(timeout_ms, math.ceil((due - self.clock()) * 1000)))
        return timeout_ms

    def _snapshots_written(self) -> None:
        """Report the snapshots the writer finished; after a failed write, the replica's
        next snapshot is whole (no chain on a gap, DESIGN 10)."""
        for written in self.snapshots.done():
            work = self.host.work.get(written.addr)
            if written.error and work is not None and work.snapshots is not None:
                work.snapshots.snapshot_lost()
                self.local.touch(written.addr)
            self.report(written)

    def _apply_members(self, msg: Members) -> None:
        for name, address, inc in msg.addresses:
            self.addresses[name] = address
            self.incarnations[name] = inc

    def _check_lease(self, now: float) -> None:  # silent for ``lease``: it stops (DESIGN 6)
        if self.lease is not None and self.lease.expired(now):
            self._stop(f"lost the controller's lease ({self.lease.silent_for(now):.2f}s)")

    def _stop(self, reason: str) -> None:
        """This process ends on its own (it says why; the job goes on without it)."""
        self.stopped = reason
        log.warning("%s stops: %s", self.host.name, reason)

    def _apply_view(self, view: View) -> None:
        for placed in view.avail + view.writers + view.joined:  # replicas, writers: moved
            self.where[placed.addr] = placed.node
        for name, inc in self.incarnations.items():
            if inc in view.failed_incs and name not in self.dead_processes:
                self.dead_processes.add(name)  # fenced: forget what was queued for it
                self.transport.disconnect(name)
                self.outbox.forget(name)
        self._emit(*self.host.on_view(view))
        if self.splits is not None:  # a replica that took over may not have heard a cut
            self.splits.tell_cuts(self.host, self.local.touch)
        self.local.touch()
        self.view_applied = view.number

    def receive(self, env: Envelope) -> None:
        """Take one envelope off the wire: control for this process now, data in order."""
        if env.dst == self.me and isinstance(env.msg, View):
            self._apply_view(env.msg)  # views come in order on the controller's connection
        elif env.dst == self.me and isinstance(env.msg, Members):
            self._apply_members(env.msg)
        elif env.dst == self.me and isinstance(env.msg, Stop):
            self.stopped = env.msg.reason
        elif env.dst == self.me and isinstance(env.msg, ProbeKeys):
            self.report(probed_keys(self.host, env.msg))  # on the thread owning the segment
        elif env.dst == self.me and isinstance(env.msg, (CutAtEpoch, HoldInputs)):
            if self.splits is not None:  # (a process without ingress replicas: none here)
                self.splits.told(self.host, env.msg, self.local.touch)
        elif env.dst == self.me and isinstance(env.msg, (Heartbeat, Welcome)):
            pass  # a Welcome again: the task registered again before it heard the first
        elif isinstance(env.dst, ProcAddr) and env.dst != self.me:  # a process of an earlier
            log.warning("%s dropped %r from %s for %s (an address it reuses)", self.me,
                        env.msg, env.src, env.dst)  # attempt, writing to an old address
        else:
            self.held.setdefault((env.src, env.dst), deque()).append(env)

    def _busy(self) -> bool:
        return self._more or self.intake.ready() or any(self.held.values()) or (
            self.splits is not None and self.splits.ready(self.host))

    def _deliver(self) -> bool:
        moved = False
        machines = self.host.machines
        for q in self.held.values():
            while q and self.host.accepts(q[0]):
                env = q.popleft()
                self.local.touch(env.dst if env.dst in machines else None)  # a mover's: any
                self.ranges.delivering(env.msg)  # a live move's install is timed
                self._emit(*self.host.on_envelope(env))
                moved = True
        return moved

    def _accept_input(self) -> bool:
        """The ingress's process: the ingress accepts what its source has; a node's
        ingress replicas, what their splits have, and they end epochs on the clock."""
        if self.splits is not None:
            moved, effects, reports = self.splits.step(self.host, self.local.touch)
            self._emit(*self.host.run_local(effects))
            for report in reports:
                self.report(report)
            return moved
        ingress = self.host.machines.get(INGRESS)
        if ingress is None or self.intake.done or not self.intake.feed(ingress,
                                                                        ingress.batch_rows):
            return False
        self.local.touch(INGRESS)
        return True

    def choose_cut(self, number: int, moves=()) -> None:
        """The ingress's process: checkpoint ``number`` covers every input accepted so far
        (DESIGN 10), and carries live ``moves`` of key groups (DESIGN 13)."""
        ingress = self.host.machines[INGRESS]
        self.local.touch(INGRESS)
        self._emit(*self.host.run_local(ingress.choose_cut(number, moves)))

    def _keeps_snapshot(self, addr, both: bool = False) -> bool:
        """Does this replica pack its checkpoint snapshot (a SnapshotWriter takes it)? One
        replica of a pair writes it (DESIGN 10): the S one, whose data its consumers only
        ack (they take the P replica's), so the time it spends packing holds up no output;
        the P one while S's process is dead (or it never exists), or if the cut wants both
        (``both``: it moves the last stage's groups, docs/design/rescaling.md)."""
        twin, writes = addr._replace(replica=S), self.snapshots is not None
        return writes and (both or addr.replica == S or twin not in self.where
                           or self.where[twin] in self.dead_processes)

    def _emit(self, envelopes: List[Envelope], others: List) -> None:
        if others and any(isinstance(e, CATCH_UP_EVENTS) for e in others):
            self.local.touch()  # the host ran a catch-up step: it may have changed any segment
        for env in envelopes:
            dst = env.dst
            if isinstance(dst, MoverAddr):
                self.local.touch()  # (as above: the mover may call back into a segment)
                self.outbox.send(self.mover_relay or dst.node, env)
            else:
                self.outbox.send(self.where[dst], env)
        for e in others:
            if isinstance(e, SmReady):
                self.timing.movers_ready(e)
            elif isinstance(e, StateInstalled):
                self._report_if(self.timing.installed(e))
            elif isinstance(e, SourcesPaused):
                self.timing.sources_paused(e)
            elif isinstance(e, SourcesResumed):
                self._report_if(self.timing.sources_resumed(e))
            elif isinstance(e, Snapshot):
                if e.data is not None and self.snapshots:
                    self.snapshots.write(e)  # to the store, off this thread
                if e.digest is not None:  # compared with its twin's (DESIGN 14)
                    self.report(CutDigest(e.addr, e.digest))
            elif isinstance(e, (FoldedIn, TakeoverDone, TransferFailed)):
                self.report(e)  # the controller retries a failed transfer (3.4)
            elif isinstance(e, (RangePacked, PackRange, RangeAwaited, RangeInstalled)):
                self._report_if(self.ranges.effect(e))  # a live move (DESIGN 13)
            elif isinstance(e, Deliver) and self.writer_sinks is not None:
                self.writer_sinks.deliver(e.partition, e.items)
            elif isinstance(e, SinkCommit) and e.through is not None:
                self.writer_sinks.submit(e)  # a writer here commits its sink
            elif isinstance(e, CutPassed):  # a pair of ingresses here passed a cut
                mark = self.splits.mark(e.ingress, e.read) if self.splits else None
                self.report(SplitCutPassed(e.number, e.cut, e.ingress, e.read,
                                           json.dumps(mark) if mark else ""))
            self.on_effect(e)

    def _writers_committed(self) -> None:
        """Writers whose sink returned from a commit (off this thread) ack both replicas;
        at a checkpoint's cut the controller hears what the sink holds (DESIGN 10)."""
        for e, sn, acks in self.writer_sinks.finished():
            self._report_if(SinkCommitted(e.number, sn, e.partition) if e.number else None)
            self._emit(*self.host.run_local(acks))

    def _report_if(self, msg) -> None:
        if msg is not None:
            self.report(msg)

    def report(self, msg) -> None:
        """Tell the controller ``msg`` (a report, on this process's own connection)."""
        self.outbox.send("controller", Envelope(self.me, CONTROLLER, self.host.view, msg,
                                                self.host.inc, None))


__all__ = ["HostLoop", "Deliver"]
