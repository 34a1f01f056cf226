"""The protocol machines run end to end over real ZeroMQ sockets on loopback.

Every process of a small cluster (4 nodes by chained declustering, the
ingress, the egress) is a HostLoop on its own thread with its own sockets.
The egress output must equal the failure-free reference exactly.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest
import zmq

from controller.placement import ChainedDeclustering
from flux.protocol.builder import MachineBuilder
from flux.effects import Deliver
from flux.connectors.sources import NOT_YET
from flux.examples import paper_dataflow
from flux.testing.dataflows import counting_dataflow
from flux.protocol.host import Host
from flux.protocol.ingress import INGRESS
from flux.operator import wire_form
from flux.reference import reference_output
from flux.runtime.loop import HostLoop
from flux.runtime.transport import ConnectionGap, Transport
from flux.testing.workloads import keyed_workload, packet_workload


def run_cluster(dataflow, records, partitions, timeout=60.0):
    stages = len(dataflow.stages)
    builder = MachineBuilder(dataflow, partitions, capacity=64, batch_size=16)
    placement = ChainedDeclustering(stages, partitions)
    processes = {f"node{n}": {a: builder.segment(a) for a in addrs}
                 for n, addrs in placement.nodes.items()}
    processes["ingress"] = {INGRESS: builder.ingress()}
    processes["egress"] = {builder.egress_addr: builder.egress()}
    where = {a: name for name, machines in processes.items() for a in machines}
    incs = {name: k + 1 for k, name in enumerate(processes)}
    peer_incs = {a: incs[name] for a, name in where.items()}

    ctx = zmq.Context()
    transports = {name: Transport(ctx, name, incs[name]) for name in processes}
    addresses = {name: t.address for name, t in transports.items()}
    delivered, stop, errors = [], threading.Event(), []

    def on_effect(e):
        if isinstance(e, Deliver):
            delivered.extend(e.items)

    loops = {name: HostLoop(Host(name, machines, incs[name], peer_incs=peer_incs),
                            transports[name], where, addresses, on_effect,
                            iter(records) if name == "ingress" else None)
             for name, machines in processes.items()}

    def run(loop):
        try:
            while not stop.is_set():
                loop.turn(5)
        except Exception as exc:  # surfaced by the test below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(loop,), daemon=True) for loop in loops.values()]
    for t in threads:
        t.start()
    expected = reference_output(dataflow, records, partitions)
    deadline = time.monotonic() + timeout
    try:
        while len(delivered) < len(expected) and not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
        for t in transports.values():
            t.close()
        ctx.term()
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    assert not any(loop.gaps for loop in loops.values())
    return delivered, expected


@pytest.mark.timeout(120)
def test_counting_dataflow_over_zeromq_equals_the_reference():
    records = keyed_workload(3000, seed=5, keys=50)
    delivered, expected = run_cluster(counting_dataflow(2), records, partitions=4)
    assert len(delivered) == len(expected)
    assert [wire_form(x) for x in delivered] == [wire_form(x) for x in expected]


@pytest.mark.timeout(120)
def test_the_papers_dataflow_over_zeromq_equals_the_reference():
    records = packet_workload(4000, seed=3, pairs=400, apps=4, sources=20)
    delivered, expected = run_cluster(paper_dataflow(), records, partitions=4)
    assert len(expected) > 100
    assert [wire_form(x) for x in delivered] == [wire_form(x) for x in expected]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("replication", ["none", "cluster-pairs"])
def test_the_baselines_give_the_reference_output_without_failures(replication):
    from flux.testing.threads import ThreadCluster

    records = packet_workload(4000, seed=3, pairs=400, apps=4, sources=20)
    expected = reference_output(paper_dataflow(), records, 4)
    cluster = ThreadCluster(paper_dataflow(), 4, records, standbys=0, replication=replication)
    with cluster:
        assert cluster.wait_until(lambda: len(cluster.delivered) >= len(expected), 60)
    assert not cluster.errors, cluster.errors
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]


class RecordingTransport:
    """Just enough of a Transport for one loop: nothing arrives, sends are kept."""

    poll_limited = False  # the last poll took all it may: never, nothing arrives

    def __init__(self):
        self.dealers, self.sent = {}, []
        self.inbox = []  # what the next poll hands the loop

    @contextmanager
    def bundling(self):
        yield  # sends are kept at once

    def flush(self):
        pass

    def poll(self, timeout_ms):
        arrived, self.inbox = self.inbox, []
        return arrived, []

    def connect(self, peer, address):
        self.dealers[peer] = address

    def send(self, peer, env):
        self.sent.append((peer, env))
        return True


def test_a_batch_leaves_at_once_to_a_consumer_that_keeps_up_else_waits_the_flush_delay():
    """A connection whose consumer took everything sent on it, and that sent nothing
    for ``flush_delay``, sends at once (waiting would only add latency). Otherwise what
    comes waits until ``flush_delay`` since it could first leave, and leaves as one batch
    (fewer messages while the consumer is busy)."""
    from flux.addresses import Addr
    from flux.data_messages import Batch, Credit
    from flux.envelope import Envelope

    # an item per input: each leaves at once, whatever stage 1 holds (a full item)
    builder = MachineBuilder(counting_dataflow(1), 2, capacity=64, batch_size=16,
                             batch_rows=1)
    ingress = builder.ingress()
    where = {Addr(1, i, replica): f"node{i}{replica}" for i in range(2) for replica in (0, 1)}
    now = [0.0]
    transport = RecordingTransport()

    def source():  # the keys a and c hash to one partition
        for run in ([("a", 1), ("c", 2), ("a", 3)], [("a", 4)], [("a", 5), ("a", 6)],
                    [], [], [("a", 7)]):
            yield from run
            yield NOT_YET  # nothing more at hand until the next turn
    loop = HostLoop(Host("ingress", {INGRESS: ingress}, 1), transport, where,
                    {n: "tcp://x" for n in where.values()}, source=source(),
                    clock=lambda: now[0], flush_delay=0.01, item_delay=0.0)

    def data_sent():
        """Rows per batch with data sent since last asked, by destination."""
        sent = [env for _, env in transport.sent if isinstance(env.msg, Batch)]
        transport.sent.clear()
        return {env.dst: sum(len(rows) for _, rows in env.msg.items)
                for env in sent if env.msg.items}, sent
    loop.turn(0)
    first, _ = data_sent()
    assert sorted(first.values()) == [1, 1]  # the first item, at once, to both replicas
    for t in (0.001, 0.002, 0.0099):  # more items; the consumer has not taken the first
        now[0] = t
        loop.turn(0)
        assert data_sent()[0] == {}
    now[0] = 0.0101
    loop.turn(0)
    later, sent = data_sent()
    assert later.keys() == first.keys() and sorted(later.values()) == [5, 5]
    assert len([env for env in sent if env.msg.items]) == 2  # one batch to each replica
    # both replicas take all they hold; once flush_delay passed since that batch, the
    # next item leaves at once
    last = max(sn for env in sent if env.msg.items for sn, _ in env.msg.items)
    transport.inbox = [Envelope(dst, INGRESS, 0, Credit(last)) for dst in later]
    now[0] = 0.0202
    loop.turn(0)
    loop.turn(0)
    assert sorted(data_sent()[0].values()) == [1, 1]


def test_pending_inputs_wait_the_item_delay_and_leave_as_one_item():
    """An input of a slow feed leaves at once (no item left within ``item_delay``);
    inputs that come soon after an item wait for more and join one: at a moderate rate
    items are larger than what the source had at hand each time (an operator on
    batches pays per batch); none waits longer than ``item_delay``."""
    from flux.addresses import Addr
    from flux.data_messages import Batch, Credit
    from flux.envelope import Envelope

    builder = MachineBuilder(counting_dataflow(1), 2, capacity=64, batch_size=16)
    ingress = builder.ingress()
    where = {Addr(1, i, replica): f"node{i}{replica}" for i in range(2) for replica in (0, 1)}
    now = [0.0]
    transport = RecordingTransport()
    arriving = [("a", 0)]  # what the feed has at hand

    def source():
        for _ in range(4):
            while not arriving:
                yield NOT_YET
            yield arriving.pop()
    loop = HostLoop(Host("ingress", {INGRESS: ingress}, 1), transport, where,
                    {n: "tcp://x" for n in where.values()}, source=source(),
                    clock=lambda: now[0], flush_delay=0.0, item_delay=0.005)

    def batches():
        sent = [env for _, env in transport.sent if isinstance(env.msg, Batch)]
        transport.sent.clear()
        return sent
    loop.turn(0)
    assert ingress.last_item == 1 and ingress.pending_rows() == 0  # at once
    first = batches()
    last = max(sn for env in first for sn, _ in env.msg.items)
    # stage 1 takes it: every replica that got a batch credits it
    transport.inbox = [Envelope(env.dst, INGRESS, 0, Credit(last)) for env in first]
    for t, record in ((0.001, ("a", 1)), (0.002, ("b", 2)), (0.003, ("a", 3))):
        now[0] = t
        arriving.append(record)
        loop.turn(0)
    assert not arriving and ingress.pending_rows() == 3 and ingress.last_item == 1
    assert loop.local.cut_due() == pytest.approx(0.005)  # the loop wakes for it
    now[0] = 0.0049
    loop.turn(0)
    assert ingress.last_item == 1
    now[0] = 0.005
    loop.turn(0)
    assert ingress.last_item == 4 and ingress.pending_rows() == 0  # one item of all three
    loop.turn(0)
    items = {sn for env in batches() for sn, _ in env.msg.items}
    assert items == {(4, 0)}


class EndlessWork:
    """A machine that only processes (``flux.protocol.machine.Processes``) and always has
    input ready; each item takes 1 ms of the fake clock."""

    def __init__(self, now):
        self.now, self.processed = now, 0

    def can_process(self):
        return True

    def process(self):
        self.now[0] += 0.001
        self.processed += 1

    def process_ready(self, limit):
        for _ in range(limit):
            self.process()
        return limit

    def credits_due(self):
        return False

    def send_credits(self):
        return []


def test_a_busy_loop_reports_every_bounded_turn():
    """The liveness thread beats for the node; the loop tells it at every turn,
    and a busy loop's turns end after ``max_turn``, so a beat's lag stays that small."""
    from flux.addresses import Addr

    now = [0.0]
    work = EndlessWork(now)
    turns = []
    loop = HostLoop(Host("node0", {Addr(1, 0, 0): work}, 1), RecordingTransport(), {},
                    {"controller": "tcp://x"}, clock=lambda: now[0],
                    on_turn=lambda: turns.append(now[0]), max_turn=0.02)
    for _ in range(10):
        loop.turn(5)
    # a turn ends with the step that reaches 20 ms (steps of PROCESS_PER_STEP = 1 item of
    # 1 ms: twenty of them)
    assert work.processed == 10 * 20
    assert len(turns) == 10 and max(b - a for a, b in zip(turns, turns[1:])) < 0.03
    assert loop._busy()  # the next turn would not wait: there is more to do


class GapTransport(RecordingTransport):
    """A connection that lost messages: the transport reports the gap once."""

    def __init__(self):
        super().__init__()
        self.gaps = [ConnectionGap("w7#7", 4, 6)]

    def poll(self, timeout_ms):
        gaps, self.gaps = self.gaps, []
        return [], gaps


def test_a_process_whose_incoming_connection_lost_messages_stops_fail_stop():
    """Its state no longer matches its twin's; stopping lets the pair mask it (and in Spark
    its task fails and comes back as a standby)."""
    builder = MachineBuilder(counting_dataflow(1), 2, capacity=64, batch_size=16)
    loop = HostLoop(Host("ingress", {INGRESS: builder.ingress()}, 1), GapTransport(), {}, {},
                    source=iter([("a", 1)]))
    assert loop.turn(0) is False
    assert loop.stopped == "messages from w7#7 were lost in transit (expected #4, got #6)"
    assert loop.source_done is False  # it did nothing after the gap


def test_lost_messages_from_a_process_declared_dead_are_nobodys_concern():
    """A zombie back from a cut whose connection lost messages: they were to be dropped
    anyway (its incarnation is fenced), so nothing stops for them."""
    builder = MachineBuilder(counting_dataflow(1), 2, capacity=64, batch_size=16)
    from flux.addresses import Addr
    from flux.data_messages import Batch

    host = Host("ingress", {INGRESS: builder.ingress()}, 1, dead_incs={7})
    where = {Addr(1, i, replica): f"node{i}{replica}" for i in range(2) for replica in (0, 1)}
    transport = GapTransport()
    loop = HostLoop(host, transport, where, {n: "tcp://x" for n in where.values()},
                    source=iter([("a", 1)]))
    loop.turn(0)
    assert loop.stopped is None
    # it went on: the input left for stage 1 (an item at once, none left before)
    assert any(env.msg.items for _, env in transport.sent if isinstance(env.msg, Batch))


class ScriptedTransport(RecordingTransport):
    """Hands the loop the given batches, one per poll."""

    def __init__(self, batches):
        super().__init__()
        self.batches = list(batches)

    def poll(self, timeout_ms):
        return (self.batches.pop(0) if self.batches else []), []


def test_a_message_for_another_process_is_dropped_not_taken_for_an_endpoint(caplog):
    """A task of an earlier attempt may still write to an address this attempt's process
    took over (the OS handed the port out again): its registration, meant for the
    controller, reaches the driver's egress process. Dropped with a log line; the loop
    goes on (it had stopped the job with "no endpoint @controller here")."""
    from flux.addresses import ProcAddr
    from flux.control_messages import Heartbeat
    from flux.envelope import Envelope

    builder = MachineBuilder(counting_dataflow(1), 2, capacity=64, batch_size=16)
    stray = Envelope(ProcAddr("w145"), ProcAddr("controller"), 0, Heartbeat(0.0), 145, None)
    loop = HostLoop(Host("egress", {e.addr: e for e in builder.egresses()}, 3),
                    ScriptedTransport([[stray]]), {}, {})
    loop.turn(0)
    loop.turn(0)
    assert loop.stopped is None and "egress dropped" in caplog.text


def test_a_long_step_is_not_taken_for_the_controllers_silence():
    """A standby that builds a big replica (or installs its state) for 10 s while the
    controller's beats wait in the socket keeps its 3 s lease: it is judged at the poll
    (at 100 MB a standby stopped itself this way, again and again)."""
    from flux.addresses import CONTROLLER, Addr, ProcAddr
    from flux.control_messages import Avail, Heartbeat, View
    from flux.envelope import Envelope

    now = [0.0]
    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4)

    def slow_standby_segment(addr):
        now[0] += 10.0  # e.g. a 100 MB operator built for the new replica
        return builder.standby_segment(addr)

    me = ProcAddr("standby0")
    view = View(1, avail=(Avail(Addr(1, 0, 1), 5, 1, "standby0", "node0"),))
    beat = Envelope(CONTROLLER, me, 0, Heartbeat(), 0, None)
    transport = ScriptedTransport([[beat, Envelope(CONTROLLER, me, 1, view, 0, None)], [beat]])
    host = Host("standby0", {}, 5, slow_standby_segment)
    loop = HostLoop(host, transport, {Addr(1, 0, 0): "node0"},
                    {"controller": "tcp://x", "node0": "tcp://y"}, clock=lambda: now[0],
                    lease=3.0)
    loop.turn(0)  # the view takes 10 s
    assert loop.stopped is None
    loop.turn(0)  # the beats that came meanwhile are read
    assert loop.stopped is None
    now[0] += 3.5
    loop.turn(0)  # now the controller is really silent
    assert loop.stopped and "lease" in loop.stopped


def test_a_movement_is_reported_once_with_the_bytes_of_its_parts():
    from flux.addresses import Addr
    from flux.control_messages import StateMoved
    from flux.effects import StateInstalled
    from statemover.messages import SmReady

    now = [0.0]
    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4)
    seg = builder.segment(Addr(1, 0, 1))
    transport = RecordingTransport()
    loop = HostLoop(Host("standby0", {seg.addr: seg}, 5), transport, {},
                    {"controller": "tcp://x"}, clock=lambda: now[0])
    t = (1, 0, 3)
    loop._emit([], [SmReady(t), StateInstalled(t, 100, complete=False)])
    now[0] = 2.5
    loop._emit([], [StateInstalled(t, 50, complete=False), StateInstalled(t, 7)])
    reports = [env.msg for _, env in transport.sent if isinstance(env.msg, StateMoved)]
    assert reports == [StateMoved(seg.addr, 157, 2.5)]


def test_the_pause_of_a_catch_up_is_reported_from_pause_to_resume():
    """The recovering partition's pause (bounded by the delta, not the state)
    is timed where its active pauses and resumes its sources."""
    from flux.addresses import Addr
    from flux.control_messages import CatchUpPaused
    from flux.effects import SourcesPaused, SourcesResumed

    now = [10.0]
    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4)
    seg = builder.segment(Addr(1, 0, 0))
    transport = RecordingTransport()
    loop = HostLoop(Host("node0", {seg.addr: seg}, 5), transport, {},
                    {"controller": "tcp://x"}, clock=lambda: now[0])
    t = (1, 0, 3)
    loop._emit([], [SourcesResumed((1, 0, 2))])  # an attempt paused before this loop: no report
    loop._emit([], [SourcesPaused(t)])
    now[0] = 10.04
    loop._emit([], [SourcesResumed(t)])
    reports = [env.msg for _, env in transport.sent if isinstance(env.msg, CatchUpPaused)]
    assert reports == [CatchUpPaused(seg.addr, reports[0].seconds)]
    assert abs(reports[0].seconds - 0.04) < 1e-9


def test_a_welcome_heard_again_after_joining_is_dropped():
    """Registration is idempotent: a task that registered again before it heard the
    controller's Welcome gets a second one, after its loop runs. It must not reach a
    machine: once, it reached the StateMover (``ProcAddr(n) == MoverAddr(n)`` as tuples)
    and crashed the node at the job's start."""
    from flux.addresses import CONTROLLER, Addr, ProcAddr
    from flux.control_messages import Welcome
    from flux.envelope import Envelope

    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4)
    seg = builder.segment(Addr(1, 0, 0))
    host = Host("node0", {seg.addr: seg}, 5, segment_factory=builder.segment)
    loop = HostLoop(host, RecordingTransport(), {}, {"controller": "tcp://x"})
    loop.receive(Envelope(CONTROLLER, ProcAddr("node0"), 0, Welcome("node0"), 0, None))
    assert not loop._busy() and loop._deliver() is False  # nothing held for a machine


def test_a_message_for_the_process_never_reaches_its_state_mover():
    from flux.addresses import CONTROLLER, Addr, ProcAddr
    from flux.control_messages import Welcome
    from flux.envelope import Envelope
    from flux.errors import RemoteProtocolError

    builder = MachineBuilder(counting_dataflow(1), 2, capacity=8, batch_size=4)
    seg = builder.segment(Addr(1, 0, 0))
    host = Host("node0", {seg.addr: seg}, 5, segment_factory=builder.segment)
    with pytest.raises(RemoteProtocolError, match="no endpoint @node0"):
        host.on_envelope(Envelope(CONTROLLER, ProcAddr("node0"), 0, Welcome("node0"), 0,
                                  None))


class RecordingWriter:
    """Just enough of a SnapshotWriter: keeps whose snapshots it was given."""

    def __init__(self):
        self.written = []

    def write(self, snap):
        self.written.append(snap.addr)

    def done(self):
        return []


@pytest.mark.parametrize("stage, writes", [(2, True), (1, False)],
                         ids=["moves-the-last-stage", "moves-another-stage"])
def test_a_primary_whose_twin_lives_writes_the_snapshot_of_a_cut_moving_the_last_stage(
        stage, writes):
    """One replica of a pair writes a checkpoint's snapshot, the S one while it lives
    (DESIGN 10); at a cut that moves the last stage's key groups with a sink per
    partition the P one writes too (docs/design/rescaling.md): a writer lost before it
    wrote must not keep that checkpoint open, the egresses hold outputs for it."""
    from exchange.group_map import GroupMove
    from flux.addresses import P, S, Addr
    from flux.testing.dataflows import regrouping_dataflow

    builder = MachineBuilder(regrouping_dataflow(2), 3, capacity=64, batch_size=16,
                             ordered_output=False)
    segment = builder.segment(Addr(1, 0, P))
    segment.cuts.learn((1, 0, ((1, 0, [GroupMove(stage, 0, 9, 0, 2).to_wire()]),)))
    writer = RecordingWriter()
    where = {Addr(s, p, r): f"node{1 + p}" for s in (1, 2) for p in range(3) for r in (P, S)}
    where[segment.addr] = "node0"  # its twin lives on node1
    loop = HostLoop(Host("node0", {segment.addr: segment}, 1), RecordingTransport(), where,
                    {n: f"tcp://{n}" for n in ("controller", *set(where.values()))},
                    snapshots=writer)
    loop.turn(0)
    assert not segment.snapshot_due()  # the cut was crossed
    assert writer.written == ([segment.addr] if writes else [])
