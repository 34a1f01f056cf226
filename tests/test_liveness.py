"""Heartbeats from a thread of their own: a busy loop does not silence its node."""
from __future__ import annotations

import time


from flux.addresses import ProcAddr
from flux.control_messages import Heartbeat
from flux.runtime.liveness import Liveness
from flux.runtime.transport import Transport


def beats_within(controller: Transport, seconds: float) -> list:
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        envelopes, _ = controller.poll(20)
        got += [env for env in envelopes if isinstance(env.msg, Heartbeat)]
    return got


def test_beats_go_on_while_the_loop_is_stuck_and_say_for_how_long(zmq_ctx):
    ctx = zmq_ctx
    controller = Transport(ctx, "controller", -3)
    liveness = Liveness(ctx, "node1", 7, controller.address, interval=0.02)
    try:
        liveness.start(view=lambda: 4)
        first = beats_within(controller, 0.3)
        assert len(first) >= 5
        assert all(env.src == ProcAddr("node1") and env.view == 4 for env in first)
        # the loop never calls loop_turned(): it is "stuck"; the beats say so, growing
        later = beats_within(controller, 0.3)
        assert later and later[-1].msg.lag > first[0].msg.lag >= 0
        liveness.loop_turned()
        fresh = beats_within(controller, 0.1)
        assert fresh and min(env.msg.lag for env in fresh) < 0.1
    finally:
        liveness.stop()
        controller.close()
    assert liveness.error is None


def test_the_controller_reports_a_stuck_loop_and_declares_it_failed_only_much_later(zmq_ctx):
    from controller.placement import ChainedDeclustering
    from controller.recovery import Recovery
    from flux.addresses import CONTROLLER
    from flux.envelope import Envelope
    from flux.runtime.controller_service import ControllerService
    from controller.topology import Topology

    ctx = zmq_ctx
    ctl = Transport(ctx, "controller", -3)
    node = Transport(ctx, "node1/liveness", 11)
    node.connect("controller", ctl.address)
    nodes = [f"node{k}" for k in range(4)]
    incs = {n: 10 + k for k, n in enumerate(nodes)}
    now = [0.0]
    service = ControllerService(ctl, timeout=0.5, clock=lambda: now[0], stuck_after=1.0,
                                stuck_timeout=30.0)
    for n in nodes:
        service.add_member(n, incs[n], "tcp://127.0.0.1:9")  # nobody listens there
    service.begin(Recovery(Topology(ChainedDeclustering(1, 4), 1, 4, incs)))

    def beat(lag):
        node.send("controller", Envelope(ProcAddr("node1"), CONTROLLER, 0, Heartbeat(lag), 11))
        for _ in range(10):
            service.turn(20)

    try:
        beat(0.01)
        beat(2.5)  # alive, its loop busy for 2.5 s: reported, not failed
        assert "node1" not in service.dead and service.stuck == {"node1": 2.5}
        assert [e[1:] for e in service.events] == [("stuck", "node1 (2.50s)")]
        beat(0.02)
        assert service.stuck == {}
        beat(31.0)  # a loop that does not turn for half a minute serves no one
        assert "node1" in service.dead and "loop has not turned" in service.why_dead["node1"]
    finally:
        node.close()
        ctl.close()


class SlowOnRecord:
    """A stateless operator that takes 1.5 s on the record with value 500 (a long call)."""

    def process(self, record):
        if record[1] == 500:
            time.sleep(1.5)
        return [record]

    def get_state(self):
        return None

    def install_state(self, state):
        pass


def test_a_long_operator_call_is_not_a_death():
    """Before heartbeats had a thread of their own, both replicas of the partition went
    silent for 1.5 s here, past the 1 s detection timeout, and were declared dead."""
    from flux.dataflow import Dataflow, Stage
    from flux.operator import wire_form
    from flux.testing.counter import first_field
    from flux.reference import reference_output
    from flux.testing.threads import ThreadCluster

    dataflow = Dataflow([Stage("slow", first_field, (SlowOnRecord,))])
    records = [(f"k{i % 7}", i) for i in range(1000)]
    expected = reference_output(dataflow, records, 3)
    with ThreadCluster(dataflow, 3, records, standbys=0, detect_after=1.0) as cluster:
        assert cluster.wait_until(lambda: len(cluster.delivered) == len(expected), 30)
        assert cluster.controller.dead == set(), cluster.controller.why_dead
        stuck = [detail for _, what, detail in cluster.controller.events if what == "stuck"]
    assert stuck, "the long call was not reported"
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]


def test_a_stuck_loop_leaves_its_stack_in_the_log_once_per_stall(zmq_ctx, monkeypatch, caplog):
    """A node declared stuck must leave the why: where its loop waits (a sink's broker,
    an operator), logged once the loop has not turned for ``STACK_AFTER`` seconds."""
    from flux.runtime import liveness as module

    monkeypatch.setattr(module, "STACK_AFTER", 0.15)
    controller = Transport(zmq_ctx, "controller", -3)
    liveness = Liveness(zmq_ctx, "node1", 7, controller.address, interval=0.02)

    def waiting_for_a_sinks_broker():
        time.sleep(0.5)

    try:
        liveness.loop_turned()  # this thread is the loop
        liveness.start()
        with caplog.at_level("WARNING", logger="flux.runtime.liveness"):
            waiting_for_a_sinks_broker()
            liveness.loop_turned()
            time.sleep(0.1)  # turning again: no new stall
    finally:
        liveness.stop()
        controller.close()
    stacks = [r.getMessage() for r in caplog.records if "has not turned" in r.getMessage()]
    assert len(stacks) == 1 and "waiting_for_a_sinks_broker" in stacks[0]
