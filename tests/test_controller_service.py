"""The controller service over real sockets: who may join, and when a task's failures
are deterministic enough to stop the job (SPARK_NOTES: maxFailures is high)."""
from __future__ import annotations

import time

import pytest

from flux.addresses import CONTROLLER, Addr, ProcAddr
from flux.control_messages import (
    Failed,
    Heartbeat,
    OperatorFailed,
    Ready,
    Register,
    Stop,
    Welcome,
)
from flux.envelope import Envelope
from flux.errors import OperatorError
from flux.runtime.controller_service import PENDING, START_FAILURES, ControllerService
from flux.runtime.transport import Transport

pytestmark = pytest.mark.timeout(30)

SECRET = "the-job-secret"


@pytest.fixture
def wires(zmq_ctx):
    ctx = zmq_ctx
    ctl = Transport(ctx, "controller", -3)
    task = Transport(ctx, "w7", 7)
    task.connect("controller", ctl.address)
    service = ControllerService(ctl, secret=SECRET, name_for=lambda reg: (
        f"standby{reg.inc}" if f"node{reg.task}" in service.registered else f"node{reg.task}"))
    yield service, task
    task.close()
    ctl.close()


def say(service, task, msg, seconds=5.0, sender="w7"):
    """Send ``msg`` and turn the controller until it has read it (a turn acts on every
    message it reads) and handed its answers to ZeroMQ."""
    task.send("controller", Envelope(ProcAddr(sender), CONTROLLER, 0, msg, 7, None))
    sent, ctl = task.out_seq["controller"], service.transport
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        task.flush()
        service.turn(10)
        if ctl.in_seq.get(task.identity, 0) >= sent and not ctl.pending():
            return
    raise AssertionError(f"the controller did not read {msg!r} within {seconds}s")


def heard(task, count, seconds=5.0):
    """What the controller told ``task``, beats (the lease) apart: (messages, beats)."""
    got, beats, deadline = [], 0, time.monotonic() + seconds
    while (len(got) < count or not count) and time.monotonic() < deadline:
        for env in task.poll(50)[0]:
            if isinstance(env.msg, Heartbeat):
                beats += 1
            else:
                got.append(env.msg)
    return got, beats


def test_a_registration_with_the_wrong_secret_is_refused(wires):
    service, task = wires
    say(service, task, Register(0, 7, task.address, 1, 2, "guess"))
    assert service.registered == {}


def test_a_registration_with_the_secret_is_welcomed_under_its_name(wires):
    service, task = wires
    say(service, task, Register(0, 7, task.address, 1, 2, SECRET))
    assert service.registered == {"node0": (0, 7, 1, 2)}
    assert heard(task, 1)[0] == [Welcome("node0")]


def test_a_held_registration_is_welcomed_only_when_named_with_its_host(wires):
    """A job names its tasks once it knows all their hosts (no pair on one host)."""
    service, task = wires
    service.name_for = lambda reg: PENDING
    say(service, task, Register(0, 7, task.address, 1, 2, SECRET, "", "10.0.0.5", "exec3"))
    assert service.registered == {} and heard(task, 0, 0.3)[0] == []
    assert list(service.pending) == [(0, 7)]
    service.admit(service.pending[0, 7], "node2")
    assert service.registered == {"node2": (0, 7, 1, 2)} and service.pending == {}
    assert service.hosts == {"node2": "10.0.0.5"}
    service.turn(10)
    assert heard(task, 1)[0] == [Welcome("node2")]


def test_a_registered_task_holds_the_lease_and_says_when_it_is_built_before_the_start(wires):
    """Nodes build their operators (maybe for seconds) before the job starts: the
    controller beats to them meanwhile, or their lease would run out while they wait
    for the others; a node's Ready is what the job waits for."""
    service, task = wires
    say(service, task, Register(0, 7, task.address, 1, 2, SECRET))
    assert not service.started and service.ready == set()
    got, beats = heard(task, 1)
    while beats < 2:
        service.turn(60)
        beats += heard(task, 0, 0.05)[1]
    assert got == [Welcome("node0")] and beats >= 2
    say(service, task, Ready(), sender="node0")
    assert service.ready == {"node0"}
    say(service, task, Ready(), sender="node9")  # not registered: nobody
    assert service.ready == {"node0"}


def test_a_task_failing_again_and_again_before_registering_stops_the_job_with_its_error(wires):
    service, task = wires
    reason = "ModuleNotFoundError: No module named 'my_operators'"
    for attempt in range(START_FAILURES - 1):
        say(service, task, Failed(3, 100 + attempt, reason, SECRET))
        assert service.error is None  # a retry may still succeed (a transient error)
    say(service, task, Failed(3, 200, reason, SECRET))
    assert isinstance(service.error, RuntimeError)
    assert str(service.error) == (f"task 3 failed {START_FAILURES} times before its node "
                                  f"started; last error: {reason}")


def test_failures_of_different_tasks_are_counted_apart(wires):
    service, task = wires
    for t in range(START_FAILURES):
        say(service, task, Failed(t, 100 + t, "OSError: disk full", SECRET))
    assert service.error is None


def test_a_failure_report_without_the_secret_cannot_stop_the_job(wires):
    service, task = wires
    for attempt in range(START_FAILURES + 2):
        say(service, task, Failed(0, attempt, "forged", "guess"))
    assert service.error is None


def test_a_task_registering_twice_is_welcomed_twice_under_one_name(wires):
    service, task = wires
    say(service, task, Register(0, 7, task.address, 1, 2, SECRET))
    say(service, task, Register(0, 7, task.address, 1, 2, SECRET))  # it heard nothing yet
    assert service.registered == {"node0": (0, 7, 1, 2)}
    assert heard(task, 2)[0] == [Welcome("node0"), Welcome("node0")]


def test_a_task_registers_again_until_the_controller_answers(zmq_ctx):
    """The first Register is lost (a controller not listening yet): join sends another."""
    import threading

    from flux.control_messages import Members
    from flux.spark.node_task import join

    ctx = zmq_ctx
    ctl, task = Transport(ctx, "controller", -3), Transport(ctx, "w7", 7)
    task.connect("controller", ctl.address)
    ctl.connect("w7", task.address)
    registers = []

    def controller():
        while len(registers) < 2:
            registers.extend(e for e in ctl.poll(50)[0] if isinstance(e.msg, Register))
        for msg in (Welcome("node0"), Members((("node0", task.address, 7),))):
            ctl.send("w7", Envelope(CONTROLLER, ProcAddr("w7"), 0, msg, 0, None))
        ctl.flush()

    answering = threading.Thread(target=controller)
    answering.start()
    try:
        register = Envelope(ProcAddr("w7"), CONTROLLER, 0,
                            Register(0, 7, task.address, 1, 2, SECRET), 7, None)
        welcome, members, early = join(task, register, timeout=20)
    finally:
        answering.join(timeout=20)
        task.close()
        ctl.close()
    assert len(registers) == 2 and welcome == Welcome("node0") and early == []
    assert members.addresses[0][0] == "node0"


def test_an_operator_failure_stops_the_job_with_the_operator_partition_and_record(wires):
    service, task = wires
    say(service, task, OperatorFailed("operator Parser", 1, 3, (42, 1),
                                      "ValueError: bad packet", SECRET))
    assert isinstance(service.error, OperatorError)
    assert str(service.error) == ("operator Parser failed in stage 1, partition 3, on the "
                                  "record with sequence number (42, 1): ValueError: bad packet")


def test_an_operator_failure_without_the_secret_cannot_stop_the_job(wires):
    service, task = wires
    say(service, task, OperatorFailed("operator Parser", 1, 3, (42,), "forged", "guess"))
    assert service.error is None


def test_a_silent_node_holding_the_last_replica_of_a_pair_gets_longer_before_it_is_declared(zmq_ctx):
    """On a loaded machine a live node can be silent for half a second; declaring it dead
    while its partner is being rebuilt would stop the job (a double failure) for nothing."""
    from controller.placement import ChainedDeclustering
    from controller.recovery import Recovery
    from controller.topology import Topology

    ctx = zmq_ctx
    ctl = Transport(ctx, "controller", -3)
    nodes = [f"node{k}" for k in range(4)]
    incs = {n: 10 + k for k, n in enumerate(nodes)}
    now = [0.0]
    recovery = Recovery(Topology(ChainedDeclustering(2, 4), 2, 4, incs))
    service = ControllerService(ctl, timeout=0.5, clock=lambda: now[0],
                                last_replica_timeout=2.0)
    for n in nodes:  # nobody listens: sends never block
        service.add_member(n, incs[n], "tcp://127.0.0.1:9")
    service.begin(recovery)
    def until(t):  # the controller turns every few milliseconds; nobody beats
        while now[0] < t:
            now[0] = round(now[0] + 0.05, 3)
            service.turn(0)

    try:
        service.fail("node1", "killed")
        until(0.6)  # node3 is declared; node0 and node2 hold last replicas
        assert service.dead == {"node1", "node3"} and service.error is None
        until(2.1)
        assert "node0" in service.dead and service.error is not None  # then the pair is lost
    finally:
        ctl.close()


def test_the_controllers_own_stall_is_not_taken_for_the_silence_of_the_nodes(zmq_ctx):
    """If the controller's thread does not run for a second (the driver's GC, a starved
    core), it heard nobody in that time; nobody is declared dead for it."""
    from controller.placement import ChainedDeclustering
    from controller.recovery import Recovery
    from controller.topology import Topology

    ctx = zmq_ctx
    ctl = Transport(ctx, "controller", -3)
    nodes = [f"node{k}" for k in range(4)]
    incs = {n: 10 + k for k, n in enumerate(nodes)}
    now = [0.0]
    service = ControllerService(ctl, timeout=0.5, clock=lambda: now[0])
    for n in nodes:  # nobody listens: sends never block
        service.add_member(n, incs[n], "tcp://127.0.0.1:9")
    service.begin(Recovery(Topology(ChainedDeclustering(2, 4), 2, 4, incs)))
    try:
        service.turn(0)
        now[0] = 1.2  # the controller's thread was stalled for 1.2 s
        service.turn(0)
        assert service.dead == set()
        assert [e[1:] for e in service.events] == [("controller stalled", 1.2)]
        for _ in range(12):  # then it turns, and the nodes really are silent
            now[0] = round(now[0] + 0.05, 3)
            service.turn(0)
        assert "node0" in service.dead and "silent" in service.why_dead["node0"]
    finally:
        ctl.close()


def test_a_task_registering_after_the_job_stopped_is_told_to_stop(wires):
    """A task Spark retries while the job shuts down must not wait for a start."""
    service, task = wires
    service.stop_all("job stopped")
    say(service, task, Register(1, 7, task.address, 1, 2, SECRET))
    assert heard(task, 1)[0] == [Stop("job stopped")]


def stalled_catchup(ctx, catchup_timeout=120.0):
    """A controller whose node1 failed, with a standby catching up (nobody answers)."""
    from controller.placement import ChainedDeclustering
    from controller.recovery import Recovery
    from controller.topology import Topology

    ctl = Transport(ctx, "controller", -3)
    names = [f"node{k}" for k in range(4)] + ["standby0"]
    incs = {n: 10 + k for k, n in enumerate(names)}
    now = [0.0]
    service = ControllerService(ctl, timeout=1000.0, clock=lambda: now[0],
                                catchup_timeout=catchup_timeout)
    for n in names:  # nobody listens: sends never block
        service.add_member(n, incs[n], "tcp://127.0.0.1:9")
    service.begin(Recovery(Topology(ChainedDeclustering(1, 4), 1, 4, incs, ["standby0"])))
    service.fail("node1", "killed")
    return ctx, ctl, service, now


def test_a_catch_up_attempt_that_outlives_its_deadline_is_aborted_and_retried(zmq_ctx):
    ctx, ctl, service, now = stalled_catchup(zmq_ctx, catchup_timeout=60.0)
    try:
        first = {(a.stage, a.partition): at.version for a, at in service.recovery.attempts.items()}
        assert first, "no catch-up started"
        service.turn(0)
        now[0] = 59.0
        service.turn(0)
        assert not [e for e in service.events if e[1] == "catch-up aborted"]
        now[0] = 61.0
        service.turn(0)
        aborted = [e for e in service.events if e[1] == "catch-up aborted"]
        assert len(aborted) == len(first) and "not folded in after 61s" in aborted[0][2]
        again = {(a.stage, a.partition): at.version for a, at in service.recovery.attempts.items()}
        assert set(again) == set(first)  # every replica is being rebuilt again...
        assert all(again[k] > first[k] for k in first)  # ...by a new attempt
        assert service.dead == {"node1"}  # no live process was declared dead
    finally:
        ctl.close()


def test_a_transfer_failure_reported_by_a_node_aborts_its_attempt(zmq_ctx):
    from flux.addresses import ProcAddr
    from statemover.messages import TransferFailed

    ctx, ctl, service, now = stalled_catchup(zmq_ctx)
    node = Transport(ctx, "standby0", 14)
    node.connect("controller", ctl.address)
    try:
        (addr, attempt), *_ = service.recovery.attempts.items()
        transfer = (addr.stage, addr.partition, attempt.version)
        node.send("controller", Envelope(ProcAddr("standby0"), CONTROLLER, 2, TransferFailed(
            transfer, "checksum mismatch"), 14))
        deadline = time.monotonic() + 5
        while ctl.in_seq.get(node.identity, 0) < 1 and time.monotonic() < deadline:
            node.flush()
            service.turn(10)  # a turn acts on every message it reads
        assert [e[2] for e in service.events if e[1] == "catch-up aborted"] == [
            f"{addr.stage}.{addr.partition}: standby0: checksum mismatch"]
        retry = service.recovery.attempts.get(addr)  # retried once the rest of its wave ends
        assert retry is None or retry.version > attempt.version
        assert addr in service.recovery.missing
    finally:
        node.close()
        ctl.close()


def test_a_node_that_stops_on_its_own_says_why_and_is_failed_at_once(zmq_ctx):
    from controller.placement import ChainedDeclustering
    from controller.recovery import Recovery
    from flux.control_messages import Stopping
    from controller.topology import Topology

    ctx = zmq_ctx
    ctl = Transport(ctx, "controller", -3)
    node = Transport(ctx, "node2", 12)
    node.connect("controller", ctl.address)
    nodes = [f"node{k}" for k in range(4)]
    incs = {n: 10 + k for k, n in enumerate(nodes)}
    service = ControllerService(ctl, timeout=5.0)
    for n in nodes:
        service.add_member(n, incs[n], "tcp://127.0.0.1:9")
        service.registered[n] = (int(n[-1]), incs[n], 0, 0)
    service.begin(Recovery(Topology(ChainedDeclustering(2, 4), 2, 4, incs)))
    try:
        node.send("controller", Envelope(ProcAddr("node2"), CONTROLLER, 0,
                                         Stopping("lost the controller's lease (3.10s)"), 12))
        deadline = time.monotonic() + 5
        while "node2" not in service.dead and time.monotonic() < deadline:
            service.turn(20)
        assert service.why_dead["node2"] == "it stopped: lost the controller's lease (3.10s)"
        assert service.dead == {"node2"} and service.error is None
    finally:
        node.close()
        ctl.close()


def test_a_node_declared_dead_that_speaks_again_is_told_to_stop_and_not_heard(zmq_ctx):
    """A cut link heals after the node was declared dead: its reports are not
    acted on, and it is told to stop, so that its task ends and rejoins as a standby."""
    from controller.placement import ChainedDeclustering
    from controller.recovery import Recovery
    from flux.control_messages import FoldedIn
    from controller.topology import Topology

    ctx = zmq_ctx
    ctl = Transport(ctx, "controller", -3)
    zombie = Transport(ctx, "node2", 12)
    others = Transport(ctx, "others", 1)  # listens for the live ones: no connection drops
    zombie.connect("controller", ctl.address)
    nodes = [f"node{k}" for k in range(4)]
    incs = {**{n: 10 + k for k, n in enumerate(nodes)}, "standby0": 20}
    service = ControllerService(ctl, timeout=5.0)
    for n in nodes + ["standby0"]:
        service.add_member(n, incs[n], zombie.address if n == "node2" else others.address)
    service.begin(Recovery(Topology(ChainedDeclustering(2, 4), 2, 4, incs, ["standby0"])))
    try:
        service.fail("node2", "silent for 5.2s")
        attempts = {a: at.version for a, at in service.recovery.attempts.items()}
        views = len(service.views)
        # its first beat left 3 s late (over half its 5 s timeout): its process was starved
        for msg in (Heartbeat(0.0, 3.0), FoldedIn(Addr(1, 3, 0), Addr(1, 2, 0), 1),
                    Heartbeat(0.0)):
            zombie.send("controller", Envelope(ProcAddr("node2"), CONTROLLER, 0, msg, 12))
        deadline = time.monotonic() + 5
        stops, gaps = [], []
        while not (stops or gaps) and time.monotonic() < deadline:
            zombie.flush()
            service.turn(10)
            envelopes, gaps = zombie.poll(10)
            stops = [e.msg for e in envelopes if isinstance(e.msg, Stop)]
        # the controller's new connection to it starts its numbering again: a zombie that
        # heard the controller before sees a gap, which stops a node as surely (fail-stop)
        assert [s.reason for s in stops] == ["fenced: declared dead (silent for 5.2s)"] or (
            gaps and gaps[0].peer.startswith("controller"))
        assert len(service.views) == views  # its report changed nothing
        assert [d for _, what, d in service.events if what == "late heartbeat"] == [
            "node2 (3.000s)"]
        assert {a: at.version for a, at in service.recovery.attempts.items()} == attempts
        assert "node2" not in service.last_seen
        assert [e[2] for e in service.events if e[1] == "zombie told to stop"] == ["node2"]
        assert service.error is None and service.dead == {"node2"}
    finally:
        others.close()
        zombie.close()
        ctl.close()
