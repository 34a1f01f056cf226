"""The failure detector's policy (controller/failure_detector.py), as a pure machine."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.failure_detector import (
    Declared,
    FailureDetector,
    Lease,
    Stalled,
    Stuck,
    Timings,
    Unstuck,
)

pytestmark = pytest.mark.timeout(60)

T = Timings(timeout=0.5, last_replica_timeout=2.0, stuck_after=1.0, stuck_timeout=30.0)
NOBODY = lambda name: False  # noqa: E731  no node holds a last replica
EVERYBODY = lambda name: True  # noqa: E731


def armed(*names, now=0.0):
    fd = FailureDetector(T)
    for n in names:
        fd.watch(n, now)
    fd.arm(now)
    return fd


def test_nothing_is_judged_before_the_job_starts():
    fd = FailureDetector(T)
    fd.watch("node0", 0.0)
    assert fd.tick(100.0, NOBODY) == []
    assert fd.connection_dropped("node0") == []
    assert fd.heartbeat("node0", 50.0, 100.0) == []  # building its operators
    fd.arm(100.0)  # its clock starts at the start
    assert fd.tick(100.4, NOBODY) == []


def test_a_silent_process_is_declared_dead_once():
    fd = armed("node0", "node1")
    fd.heard("node1", 0.4)
    assert fd.tick(0.6, NOBODY) == [Declared("node0", "silent for 0.600s")]
    assert fd.tick(5.0, NOBODY) == [Declared("node1", "silent for 4.600s")]
    assert fd.tick(9.0, NOBODY) == []
    assert fd.live() == []


def test_the_holder_of_a_last_replica_gets_a_grace():
    fd = armed("node0")
    assert fd.tick(1.9, EVERYBODY) == []
    assert [v.name for v in fd.tick(2.1, EVERYBODY)] == ["node0"]


def test_a_dropped_connection_or_a_gap_is_a_death_at_once():
    fd = armed("node0", "node1")
    assert fd.connection_dropped("node0") == [Declared("node0", "its connection dropped")]
    assert fd.connection_gap("node1", 3, 5) == [Declared("node1", "connection gap 3->5")]
    assert fd.connection_dropped("node0") == []  # already dead
    assert fd.connection_dropped("stranger") == []  # never watched


def test_a_stuck_loop_is_reported_not_declared_until_its_timeout():
    fd = armed("node0")
    assert fd.heartbeat("node0", 0.2, 1.0) == []
    assert fd.heartbeat("node0", 1.5, 2.0) == [Stuck("node0", 1.5)]
    assert fd.heartbeat("node0", 2.5, 3.0) == []  # reported once
    assert fd.stuck() == {"node0": 2.5}
    assert fd.tick(3.1, NOBODY) == []  # it beats: not silent
    assert fd.heartbeat("node0", 0.01, 3.2) == [Unstuck("node0", 2.5)]
    assert fd.stuck() == {}
    assert fd.heartbeat("node0", 31.0, 40.0) == [
        Declared("node0", "its loop has not turned for 31.0s")]


def test_the_controllers_own_stall_is_nobodys_silence():
    fd = armed("node0")
    assert fd.turned(0.0, 0.05) == []
    # the controller's thread did not run for 3 s (a GC pause): node0 was not heard
    assert fd.turned(3.05, 0.05) == [Stalled(pytest.approx(3.0))]
    assert fd.tick(3.05, NOBODY) == []
    assert [v.name for v in fd.tick(3.6, NOBODY)] == ["node0"]  # real silence still counts


def test_a_forgotten_process_is_never_judged_again():
    fd = armed("node0")
    fd.forget("node0")
    assert fd.tick(100.0, NOBODY) == [] and fd.heartbeat("node0", 99.0, 100.0) == []


def test_timings_must_be_positive_and_ordered():
    with pytest.raises(ValueError, match="positive"):
        Timings(timeout=0.0)
    with pytest.raises(ValueError, match="stuck_after"):
        Timings(stuck_after=5.0, stuck_timeout=1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.001, 0.374), st.floats(0.0, 5.0)), min_size=1,
                max_size=60))
def test_a_process_heard_within_the_timeout_is_never_declared(gaps):
    """Whatever the controller's stalls, a process heard every 3/4 of the timeout of the
    controller's running time is never declared dead (stalls up to a quarter of the
    timeout are not discounted: they are the noise of a loaded machine)."""
    fd = armed("node0")
    now, turned = 0.0, 0.0
    fd.turned(0.0, 0.0)
    for beat_gap, stall in gaps:
        now += stall  # the controller did not run; node0's beats wait in the socket
        fd.turned(now, 0.0)
        now += beat_gap
        assert fd.tick(now, NOBODY) == []
        fd.turned(now, beat_gap)
        fd.heard("node0", now)
        turned = now
    assert fd.live() == ["node0"] and turned == now


def test_a_lease_expires_after_its_length_of_silence():
    lease = Lease(3.0, now=0.0)
    lease.heard(2.0)
    assert not lease.expired(4.9)
    assert lease.expired(5.1) and lease.silent_for(5.1) == pytest.approx(3.1)
    with pytest.raises(ValueError):
        Lease(0.0, now=0.0)


def test_nothing_is_judged_once_the_job_stops():
    fd = armed("node0", "node1")
    fd.disarm()  # every process was told to stop: they close their connections
    assert fd.connection_dropped("node0") == [] and fd.tick(100.0, NOBODY) == []


def test_partners_silent_together_are_declared_one_per_tick():
    """Both replicas of a pair silenced by one stall: declaring both in one tick would
    lose the pair; the first is declared, and once the recovery knows it, the second
    holds the last replica and gets its grace."""
    fd = armed("node0", "node1", "node2")
    fd.heard("node2", 0.5)
    dead = set()
    partners = {"node0": "node1", "node1": "node0", "node2": None}

    def holds_last_replica(name):
        return partners[name] in dead

    first = fd.tick(0.6, holds_last_replica)
    assert [v.name for v in first] == ["node0"]
    dead.update(v.name for v in first)
    assert fd.tick(0.61, holds_last_replica) == []  # node1 now holds the last replica
    fd.heard("node2", 2.0)
    assert [v.name for v in fd.tick(2.1, holds_last_replica)] == ["node1"]


def test_silences_past_every_grace_are_all_declared_in_one_tick():
    fd = armed("node0", "node1")
    assert [v.name for v in fd.tick(2.5, EVERYBODY)] == ["node0", "node1"]
