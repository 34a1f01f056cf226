"""Drive one process's protocol machines over the ZeroMQ transport.

The runtime twin of the simulator's world, for a single process: it feeds
envelopes from the transport to the ``Host`` (which decides what may be taken
now: a message from a later view or behind a guarded control message waits
at the head of its connection, DEALER-side FIFO order kept), runs the local
steps (process every input the merges release, flush every batch), and
hands the envelopes the machines return back to the transport. No protocol
rule lives here (DESIGN 3).
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import (Any, Callable, Deque, Dict, Iterator, List, Optional, Protocol, Tuple,
                    runtime_checkable)

from controller.failure_detector import Lease
from flux.addresses import CONTROLLER, S, MoverAddr, ProcAddr
from flux.control_messages import (
    CatchUpPaused,
    FoldedIn,
    Heartbeat,
    Members,
    NodeStats,
    StateMoved,
    Stop,
    TakeoverDone,
    View,
)
from flux.data_messages import Ack, Credit
from flux.effects import Deliver, Snapshot, SourcesPaused, SourcesResumed, StateInstalled
from flux.envelope import Envelope
from flux.protocol.host import Host
from flux.protocol.ingress import INGRESS
from flux.protocol.machine import Machine
from flux.connector_api import DroppingSource, TimedSource, WaitingSource
from flux.runtime.metrics import Metrics
from flux.connectors.sources import NOT_YET
from flux.runtime.transport import DEFAULT_POLL_LIMIT, ConnectionGap, Transport
from statemover.messages import SmReady, TransferFailed

log = logging.getLogger(__name__)

#: inputs one segment processes before the loop looks at its other work
PROCESS_PER_STEP = 256
#: effects of a catch-up step, which the host may have carried to another segment
CATCH_UP_EVENTS = (SmReady, StateInstalled, SourcesPaused, SourcesResumed, TransferFailed)


@runtime_checkable
class RunSource(Protocol):
    """A source that hands records over in runs (the ingress process's feed,
    ``flux.runtime.ingress_process.FeedSource``): taken a run at a time, what
    back-pressure holds put back first; ``finished`` once none will come."""

    finished: bool

    def take(self, limit: int) -> List[Any]: ...

    def put_back(self, records: List[Any]) -> None: ...


class HostLoop:
    """One process: its Host, its Transport, and where every endpoint lives."""

    def __init__(self, host: Host, transport: Transport, where: Dict[Any, str],
                 addresses: Dict[str, str], on_effect: Callable[[Any], None] = lambda e: None,
                 source: Optional[Iterator[Any]] = None, incarnations: Dict[str, int] = None,
                 on_turn: Callable[[], None] = lambda: None, clock=time.monotonic,
                 lease: Optional[float] = None, metrics: Optional[Metrics] = None,
                 flush_delay: float = 0.002, mover_relay: Optional[str] = None,
                 max_turn: float = 0.02, stats_every: Optional[float] = None,
                 snapshots=None,
                 ack_delay: float = 0.005):
        self.host = host
        self.me = ProcAddr(host.name)
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
        self.source = source
        # what the source can do, asked once: a protocol's isinstance reads every member
        self._runs = isinstance(source, RunSource)
        self._timed = isinstance(source, TimedSource)
        self._waits = isinstance(source, WaitingSource)
        self._drops = isinstance(source, DroppingSource)
        self._next_record: Any = None
        self._next_arrival: Optional[float] = None
        self._source_waits = False  # the source said NOT_YET: idle a little, do not spin
        #: the ingress refused the next input (a full buffer): only an ack, which comes as
        #: a message and wakes the poll, can make room; waiting for it, not spinning, leaves
        #: the core to the nodes that will send it
        self._held_back = False
        self.metrics = metrics
        #: a turn that still has work after this long returns (and the next begins at once):
        #: a busy node keeps beating and hearing the controller
        self.max_turn = max_turn
        self._more = False
        #: the peer that carries this node's StateMover traffic (its StateMoverService);
        #: None: straight to the other node's process, on the data connections
        self.mover_relay = mover_relay
        #: a connection with something to send waits this long for more before it
        #: flushes: fewer, larger messages (SPARK_NOTES: one per tuple costs ~10x)
        self.flush_delay = flush_delay
        self._flush_wait: Dict[Tuple[Any, int, int], float] = {}  # since when flushable
        #: acks and credits are cumulative: each waits this long for a later one on its
        #: connection that replaces it, so a consumer sends one per connection and interval
        #: instead of one per batch it takes (messages, not tuples, were most of
        #: a node's CPU). Anything else for the same process sends them first, so they keep
        #: their place before the control messages that must follow them (DESIGN 4.4).
        self.ack_delay = ack_delay
        #: machines whose state may have changed since ``_work`` last found nothing to do
        #: for them, and each machine's flushable connections as last computed: the
        #: guards are functions of a machine's state alone (sans-I/O), so an untouched
        #: machine is not asked again (asking every machine at every turn cost a
        #: node ~200 us a turn, most of its CPU at low rates)
        self._dirty: set = set(host.machines)
        self._ready: Dict[Any, list] = {}
        self._held_acks: Dict[str, Dict[tuple, Envelope]] = {}  # peer -> connection -> latest
        self._held_since: Dict[str, float] = {}
        self._moves: Dict[tuple, float] = {}  # transfer -> when both movers were ready
        self._moved_bytes: Dict[tuple, int] = {}  # transfer -> bytes of its parts so far
        self._paused: Dict[tuple, float] = {}  # transfer -> when its active paused its sources
        self.held: Dict[Tuple[Any, Any], Deque[Envelope]] = {}
        #: envelopes the transport refused (outbox full): local work waits for them
        self.overflow: Deque[Tuple[str, Envelope]] = deque()
        self.gaps: List[ConnectionGap] = []
        self.source_done = source is None
        #: a node reports its segments' counters this often (monitoring; None: never)
        self.stats_every = stats_every
        self._stats_sent = clock()
        #: where this node's checkpoint snapshots go (a SnapshotWriter); None: nowhere
        self.snapshots = snapshots

    # -- one turn of the poller loop ------------------------------------------------
    def turn(self, timeout_ms: int) -> bool:
        """Receive, deliver, work, send. Returns True if anything moved."""
        if self._busy():
            timeout_ms = 0
        else:
            if self._source_waits and self._waits:
                timeout_ms = min(timeout_ms, math.ceil(self.source.due_in() * 1000))
            if self._flush_wait:
                due = min(self._flush_wait.values()) + self.flush_delay - self.clock()
                timeout_ms = max(0, min(timeout_ms, math.ceil(due * 1000)))
            if self._held_since:
                due = min(self._held_since.values()) + self.ack_delay - self.clock()
                timeout_ms = max(0, min(timeout_ms, math.ceil(due * 1000)))
        envelopes, gaps = self.transport.poll(timeout_ms)
        self.gaps += gaps
        lost = [g for g in gaps if isinstance(g, ConnectionGap) and not self._from_dead(g)]
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
        if len(envelopes) < DEFAULT_POLL_LIMIT:  # else the controller's may be among the rest
            self._check_lease(polled)
        if self.stopped is not None:
            return False
        for env in envelopes:
            self.receive(env)
        self.on_turn()
        if self.snapshots is not None:
            for written in self.snapshots.done():
                machine = self.host.machines.get(written.addr)
                if written.error and machine is not None:
                    machine.snapshot_lost()  # its next snapshot is whole (no chain on a gap)
                    self._touch(written.addr)
                self.report(written)
        if self.stats_every is not None and polled - self._stats_sent >= self.stats_every:
            self._stats_sent = polled
            self.report(NodeStats(tuple(m.stats() for m in self.host.machines.values())))
        moved = bool(envelopes)
        deadline = self.clock() + self.max_turn
        while True:
            if not self._drain_overflow():
                self._more = False  # wait for the peers a little, do not spin
                return moved  # back-pressure: nothing new until the outboxes empty
            step = self._deliver() | self._accept_input() | self._work()
            moved |= step
            self._more = step
            if not step or self.clock() >= deadline:
                self._send_held_acks(self.clock() - self.ack_delay)
                return moved  # more to do: the next turn polls without waiting

    def _from_dead(self, gap: ConnectionGap) -> bool:
        """Did ``gap`` happen on a connection from an incarnation a view declared dead? Its
        messages are dropped anyway (a zombie back from a cut, DESIGN 6): nothing it sent,
        and nothing it failed to send, is acted on."""
        inc = gap.peer.rpartition("#")[2]
        return inc.isdigit() and int(inc) in self.host.dead_incs

    def _apply_members(self, msg: Members) -> None:
        for name, address, inc in msg.addresses:
            self.addresses[name] = address
            self.incarnations[name] = inc

    def _check_lease(self, now: float) -> None:
        """A node that hears nothing from the controller for ``lease`` stops (DESIGN 6)."""
        if self.lease is not None and self.lease.expired(now):
            self._stop(f"lost the controller's lease ({self.lease.silent_for(now):.2f}s)")

    def _stop(self, reason: str) -> None:
        """This process ends on its own (it says why; the job goes on without it)."""
        self.stopped = reason
        log.warning("%s stops: %s", self.host.name, reason)

    def _apply_view(self, view: View) -> None:
        for avail in view.avail:
            self.where[avail.addr] = avail.node
        for name, inc in self.incarnations.items():
            if inc in view.failed_incs and name not in self.dead_processes:
                self.dead_processes.add(name)  # fenced: forget what was queued for it
                self.transport.disconnect(name)
                self.overflow = deque((p, e) for p, e in self.overflow if p != name)
        self._emit(*self.host.on_view(view))
        self._touch()

    def _drain_overflow(self) -> bool:
        while self.overflow:
            peer, env = self.overflow[0]
            if not self.transport.send(peer, env):
                return False
            self.overflow.popleft()
        return True

    def receive(self, env: Envelope) -> None:
        """Take one envelope off the wire: control for this process now, data in order."""
        if env.dst == self.me and isinstance(env.msg, View):
            self._apply_view(env.msg)  # views come in order on the controller's connection
        elif env.dst == self.me and isinstance(env.msg, Members):
            self._apply_members(env.msg)
        elif env.dst == self.me and isinstance(env.msg, Stop):
            self.stopped = env.msg.reason
        elif env.dst == self.me and isinstance(env.msg, Heartbeat):
            pass
        else:
            self.held.setdefault((env.src, env.dst), deque()).append(env)

    def _busy(self) -> bool:
        source_ready = not (self.source_done or self._source_waits or self._held_back)
        return self._more or source_ready or any(self.held.values())

    def _deliver(self) -> bool:
        moved = False
        machines = self.host.machines
        for q in self.held.values():
            while q and self.host.accepts(q[0]):
                env = q.popleft()
                self._touch(env.dst if env.dst in machines else None)  # a mover's: any
                self._emit(*self.host.on_envelope(env))
                moved = True
        return moved

    def _touch(self, addr=None) -> None:
        """``addr``'s machine (every machine, for None) may have changed: ``_work`` asks it."""
        if addr is None:
            self._dirty.update(self.host.machines)
        else:
            self._dirty.add(addr)

    def _accept_input(self, limit: int = 1000) -> bool:
        ingress = self.host.machines.get(INGRESS)
        if ingress is None or self.source_done:
            return False
        self._source_waits = self._held_back = False
        if self._runs:
            return self._accept_taken(ingress, limit)
        source = self.source
        timed = self._timed
        accept = ingress.accept
        arrivals: List[Optional[float]] = []
        for _ in range(limit):
            if self._next_record is None:
                record = next(source, None)
                if record is NOT_YET:
                    self._source_waits = True
                    break
                if record is None:
                    self.source_done = True
                    break
                self._next_record = record
                self._next_arrival = source.arrival if timed else None
            if accept(self._next_record) is None:
                if self._drops:
                    source.arrive()  # a feed that cannot wait drops meanwhile: count it now
                self._held_back = True
                break  # back-pressure: that partition's buffer is full
            self._next_record = None
            arrivals.append(self._next_arrival)
        if arrivals:
            self._dirty.add(INGRESS)
        if self.metrics is not None:
            self.metrics.inputs_taken(arrivals)
            if self._drops:
                self.metrics.inputs_dropped(source.dropped)
        return bool(arrivals)

    def _accept_taken(self, ingress, limit: int) -> bool:
        """A source that hands records over in runs (the ingress process's feed, which
        keeps no arrival times, positions or partitions: the driver's feed has those):
        the ingress accepts a run in one call; what back-pressure holds goes back."""
        source = self.source
        records = source.take(limit)
        if not records:
            if source.finished:
                self.source_done = True
            else:
                self._source_waits = True
            return False
        n = ingress.accept_many(records)
        if n < len(records):
            source.put_back(records[n:])  # back-pressure: that partition's buffer is full
            self._held_back = True
        if n:
            self._dirty.add(INGRESS)
        return n > 0

    def choose_cut(self, number: int) -> None:
        """The ingress's process: checkpoint ``number`` covers every input accepted so far
        (DESIGN 10; the driver's feed knows that input and the source's position after
        it). The cut leaves with the next batches."""
        ingress = self.host.machines[INGRESS]
        self._touch(INGRESS)
        self._emit(*self.host.run_local(ingress.choose_cut(number)))

    def _work(self) -> bool:
        moved = False
        for key in [k for k in self._flush_wait if k[0] not in self.host.machines]:
            del self._flush_wait[key]  # a segment this process no longer hosts
        for addr in [a for a in self._ready if a not in self.host.machines]:
            del self._ready[addr]
        dirty, self._dirty = self._dirty, set()
        for addr, machine in list(self.host.machines.items()):
            if addr not in dirty:  # nothing changed it: only a batch may be due by now
                if addr in self._ready and self._ready[addr]:
                    moved |= self._flush(addr, machine, fresh=False)
                continue
            did = False
            left = PROCESS_PER_STEP
            while left > 0:
                if machine.snapshot_due():  # a checkpoint's cut: before the next input
                    keep = self.snapshots is not None and self._writes_snapshot(addr)
                    self._emit(*self.host.run_local(machine.snapshot(keep)))
                    did = True
                if not machine.can_process():
                    break
                taken = machine.process_ready(left)  # stops at a cut's guard by itself
                if not taken:
                    break
                left -= taken
                did = True
            if machine.credits_due():  # back-pressure: what it took may be replaced
                self._emit(*self.host.run_local(machine.send_credits()))
                did = True
            did |= self._flush(addr, machine, fresh=True)
            if machine.has_part():  # catch-up's bulk, a part at a time between inputs
                self._emit(*self.host.run_local(machine.send_part()))
                did = True
            if did:
                self._dirty.add(addr)  # it changed: ask it again
                moved = True
        return moved

    def _writes_snapshot(self, addr) -> bool:
        """One replica of a pair writes its checkpoint snapshot (DESIGN 10): the S one, whose
        data its consumers only ack (they take the P replica's), so the time it spends
        packing holds up no output; the P one while S's process is dead (or it never
        exists)."""
        if addr.replica == S:
            return True
        twin = addr._replace(replica=S)
        return twin not in self.where or self.where[twin] in self.dead_processes

    def _flush(self, addr, machine: Machine, fresh: bool = True) -> bool:
        """Send each connection's batch once it has waited ``flush_delay`` (a connection
        that stays flushable, a backlog, goes on sending at every turn). ``fresh`` False:
        the machine is as it was when its flushable connections were last asked."""
        now, flushed = self.clock(), False
        waiting = self._flush_wait
        ready = machine.flushable() if fresh or addr not in self._ready else self._ready[addr]
        for i, d in ready:
            if now - waiting.setdefault((addr, i, d), now) >= self.flush_delay:
                self._emit(*self.host.run_local(machine.flush(i, d)))
                flushed = True
        if flushed:
            ready = machine.flushable()
            self._dirty.add(addr)
        self._ready[addr] = ready
        still = set(ready)
        for key in [k for k in waiting if k[0] == addr and (k[1], k[2]) not in still]:
            del waiting[key]  # sent all it had, or cannot send now (paused, standby)
        return flushed

    def _emit(self, envelopes: List[Envelope], others: List) -> None:
        if others and any(isinstance(e, CATCH_UP_EVENTS) for e in others):
            self._touch()  # the host ran a catch-up step: it may have changed any segment
        for env in envelopes:
            dst = env.dst
            if isinstance(dst, MoverAddr):
                self._touch()  # (as above: the mover may call back into a segment)
                self._send_to(self.mover_relay or dst.node, env)
            else:
                self._send_to(self.where[dst], env)
        for e in others:
            if isinstance(e, SmReady):
                self._moves[e.transfer] = self.clock()
            elif isinstance(e, StateInstalled):
                self._installed(e)
            elif isinstance(e, SourcesPaused):
                self._paused[e.transfer] = self.clock()
            elif isinstance(e, SourcesResumed):
                self._resumed(e)
            elif isinstance(e, Snapshot) and e.data is not None and self.snapshots:
                self.snapshots.write(e)  # to the store, off this thread
            elif isinstance(e, (FoldedIn, TakeoverDone, TransferFailed)):
                self.report(e)  # the controller retries a failed transfer (3.4)
            self.on_effect(e)

    def _installed(self, e: StateInstalled) -> None:
        """Count a transfer's bytes, bulk parts included; report the movement when whole."""
        nbytes = self._moved_bytes.pop(e.transfer, 0) + e.nbytes
        if not e.complete:  # a bulk part: the rest follows
            self._moved_bytes[e.transfer] = nbytes
            return
        started = self._moves.pop(e.transfer, None)
        seg = self.host.segment_of(e.transfer)
        if started is not None and seg is not None:
            self.report(StateMoved(seg.addr, nbytes, self.clock() - started))

    def _resumed(self, e: SourcesResumed) -> None:
        """Report how long the active held its partition's sources paused."""
        paused = self._paused.pop(e.transfer, None)
        seg = self.host.segment_of(e.transfer)
        if paused is not None and seg is not None:
            self.report(CatchUpPaused(seg.addr, self.clock() - paused))

    def report(self, msg) -> None:
        """Tell the controller ``msg`` (a report, on this process's own connection)."""
        self._send_to("controller", Envelope(self.me, CONTROLLER, self.host.view, msg,
                                             self.host.inc, None))

    def _send_to(self, peer: str, env: Envelope) -> None:
        if peer in self.dead_processes:
            return  # TCP to a dead process: lost, as the protocol expects
        if self.ack_delay > 0 and isinstance(env.msg, (Ack, Credit)):
            held = self._held_acks.setdefault(peer, {})
            held[(env.src, env.dst, type(env.msg), env.dst_inc)] = env  # replaces an older one
            self._held_since.setdefault(peer, self.clock())
            return
        if peer in self._held_since:
            self._send_held(peer)  # what went before goes first (DESIGN 4.4)
        self._transmit(peer, env)

    def _send_held_acks(self, older_than: float) -> None:
        """Send the acks and credits that waited since before ``older_than``."""
        for peer in [p for p, since in self._held_since.items() if since <= older_than]:
            self._send_held(peer)

    def _send_held(self, peer: str) -> None:
        del self._held_since[peer]
        for env in self._held_acks.pop(peer).values():
            if peer not in self.dead_processes:
                self._transmit(peer, env)

    def _transmit(self, peer: str, env: Envelope) -> None:
        if peer not in self.transport.dealers:
            self.transport.connect(peer, self.addresses[peer])
        if self.overflow or not self.transport.send(peer, env):
            self.overflow.append((peer, env))  # keeps FIFO order behind what waits


__all__ = ["HostLoop", "Deliver"]
