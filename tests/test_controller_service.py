"""The controller service over real sockets: who may join, and when a task's failures
are deterministic enough to stop the job (SPARK_NOTES: maxFailures is high)."""
from __future__ import annotations

import time

import pytest
import zmq

from controller.service import START_FAILURES, ControllerService
from exchange.transport import Transport
from flux.messages import CONTROLLER, Envelope, Failed, ProcAddr, Register, Welcome

pytestmark = pytest.mark.timeout(30)

SECRET = "the-job-secret"


@pytest.fixture
def wires():
    ctx = zmq.Context()
    ctl = Transport(ctx, "controller", -3)
    task = Transport(ctx, "w7", 7)
    task.connect("controller", ctl.address)
    service = ControllerService(ctl, None, {"controller": -3}, {"controller": ctl.address}, [],
                                secret=SECRET)
    service.name_for = lambda reg: f"node{reg.task}"
    yield service, task
    task.close()
    ctl.close()
    ctx.term()


def say(service, task, msg, turns=20):
    task.send("controller", Envelope(ProcAddr("w7"), CONTROLLER, 0, msg, 7, None))
    for _ in range(turns):
        service.turn(10)


def test_a_registration_with_the_wrong_secret_is_refused(wires):
    service, task = wires
    say(service, task, Register(0, 7, task.address, 1, 2, "guess"))
    assert service.registered == {}


def test_a_registration_with_the_secret_is_welcomed_under_its_name(wires):
    service, task = wires
    say(service, task, Register(0, 7, task.address, 1, 2, SECRET))
    assert service.registered == {"node0": (0, 7, 1, 2)}
    deadline = time.monotonic() + 5
    got = []
    while not got and time.monotonic() < deadline:
        got, _ = task.poll(50)
    assert [env.msg for env in got] == [Welcome("node0")]


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
