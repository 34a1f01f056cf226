"""The simulator drives the failure detector's policy (DESIGN 6): false
suspicions, link cuts and heals, silent crashes, lossy mover links, zombies."""
from __future__ import annotations

import pytest

from flux.sim.__main__ import crash_window
from flux.sim.schedule import (
    OK,
    PAIR_LOST,
    VIOLATION,
    RandomChooser,
    SimParams,
    execute,
    format_trace,
    run_schedule,
)

pytestmark = pytest.mark.timeout(300)


def run_many(params, seeds):
    window = crash_window(params)
    results = [run_schedule(seed, params, window) for seed in seeds]
    bad = [r for r in results if r.status == VIOLATION]
    assert not bad, "\n".join(f"seed {r.seed}: {r.reason}\n{format_trace(r, last=20)}"
                              for r in bad[:3])
    return results


@pytest.mark.sim
def test_false_suspicions_make_zombies_that_never_break_the_output():
    results = run_many(SimParams(false_suspicions=2, standbys=2, crashes=1), range(1, 61))
    assert sum(len(r.zombies) for r in results) >= 30  # live processes declared dead
    assert sum(r.status == OK for r in results) >= 20
    assert sum(len(r.catchups) for r in results) > 0


@pytest.mark.sim
def test_cut_hosts_heal_and_silent_crashes_are_found_by_silence():
    results = run_many(SimParams(cuts=2, standbys=2, crashes=2), range(1, 61))
    traces = [step for r in results for step, _ in r.trace]
    assert any(s[0] == "cut" for s in traces)
    assert any(s[0] == "crash" and "silent" in s for s in traces)
    assert any(s[0] == "told" for s in traces)  # a zombie back from a cut told to stop
    assert sum(len(r.zombies) for r in results) > 0
    assert sum(r.status == OK for r in results) >= 20


@pytest.mark.sim
def test_lossy_mover_links_resend_or_retry_until_every_replica_is_rebuilt():
    results = run_many(SimParams(lossy_mover=0.05, standbys=2, crashes=2), range(1, 41))
    assert sum(r.mover_lost for r in results) > 0
    assert all(r.status == OK for r in results)  # every catch-up completed in the end
    assert sum(len(r.catchups) for r in results) >= 40


#: seeds of ``--seed 9500 --crashes 3 --standbys 2 --lossy-mover 0.2`` that never rebuilt
#: their replicas while a lost envelope failed the attempt (docs/results/simulator.md)
STALLED_AT_A_FIFTH_LOST = (9541, 9596, 9621)
#: a seed of the same that livelocks without the rule (``--variant no-resend``: 9542 and
#: 9544 of the 100 from 9500 until the hand-back changed the schedules; 9544 and 9821
#: since) and is quiet with it
LIVELOCKED_WITHOUT_RESEND = 9544


@pytest.mark.sim
def test_at_a_fifth_lost_every_replica_is_rebuilt():
    """A lost mover envelope is sent again (statemover/resend.py): each of these seeds
    once ended with no quiescence after 200000 steps, thousands of attempts each failed
    by a loss; now each rebuilds every replica it lost, the output exact."""
    params = SimParams(lossy_mover=0.2, standbys=2, crashes=3)
    results = run_many(params, STALLED_AT_A_FIFTH_LOST)
    assert all(r.status == OK for r in results)
    assert all(r.steps < 20_000 for r in results), [r.steps for r in results]
    assert sum(r.mover_lost for r in results) > 100


@pytest.mark.sim
@pytest.mark.timeout(600)
def test_failing_the_attempt_on_a_loss_is_caught_as_a_livelock():
    """The broken variant ``no-resend`` drops the rule: the oracle reports it."""
    params = SimParams(lossy_mover=0.2, standbys=2, crashes=3, variant="no-resend")
    r = run_schedule(LIVELOCKED_WITHOUT_RESEND, params, crash_window(params))
    assert r.status == VIOLATION and "no quiescence" in r.reason
    ok = SimParams(lossy_mover=0.2, standbys=2, crashes=3)
    assert run_schedule(LIVELOCKED_WITHOUT_RESEND, ok, crash_window(ok)).status == OK


def test_hearing_the_dead_is_caught_when_zombies_run():
    params = SimParams(false_suspicions=2, standbys=2, variant="hear-the-dead")
    window = crash_window(params)
    assert any(run_schedule(seed, params, window).status == VIOLATION for seed in range(1, 21))


class FaultAt(RandomChooser):
    """Random steps, and one given fault at a given step."""

    def __init__(self, seed, params, fault, at):
        super().__init__(seed, params, crash_window(params))
        self.fault, self.at = fault, at

    def __call__(self, world, rng, t):
        if self.fault is not None and t >= self.at:
            fault, self.fault = self.fault, None
            return fault, None
        return super().__call__(world, rng, t)


def run_with(fault, seed=3, at=300, **kw):
    params = SimParams(crashes=0, **kw)
    return execute(seed, params, FaultAt(seed, params, fault, at))


def test_a_cut_shorter_than_the_timeout_declares_nobody():
    for seed in range(1, 11):
        r = run_with(("cut", "node1", 7), seed)  # the timeout is 8 ticks
        assert r.status == OK and r.zombies == [], (seed, r.reason)


def test_a_cut_past_the_timeout_makes_a_zombie_replaced_by_a_standby():
    for seed in range(1, 11):
        r = run_with(("cut", "node1", 40), seed, standbys=1)
        assert r.status == OK, (seed, r.reason)
        assert r.zombies == ["node1"] and len(r.catchups) == 4  # its 4 replicas rebuilt


def test_the_holder_of_a_last_replica_is_given_its_grace():
    """node1 holds the twins of node0's and node2's replicas... after node0 is gone it
    holds a last replica: a 20-tick cut (past the timeout, within the 32-tick grace) is
    waited out, not declared (that would lose the pair)."""
    seed = 5
    params = SimParams(crashes=0)

    class Both(FaultAt):
        def __call__(self, world, rng, t):
            if t == 100 and world.alive["node0"]:
                return ("crash", "node0"), None
            return super().__call__(world, rng, t)

    r = execute(seed, params, Both(seed, params, ("cut", "node1", 20), 200))
    assert r.status == OK, r.reason
    assert r.zombies == []
    r = execute(seed, params, Both(seed, params, ("cut", "node1", 60), 200))
    assert r.status == PAIR_LOST  # past the grace: declared, and the pair is lost


def test_a_seed_with_timed_faults_replays_exactly():
    params = SimParams(cuts=1, false_suspicions=1, standbys=1, lossy_mover=0.05)
    window = crash_window(params)
    a, b = run_schedule(11, params, window), run_schedule(11, params, window)
    assert (a.status, a.steps, a.zombies, a.mover_lost) == (b.status, b.steps, b.zombies,
                                                            b.mover_lost)


def test_a_zombie_applying_a_view_that_discards_its_new_replica():
    """Seed 275 of the cut run (docs/results/simulator.md): a standby declared dead while a view aborting the
    replica it was building was already on its way applied that view as a zombie; the
    discarded replica must take no more steps (the world kept them: a KeyError)."""
    params = SimParams(stages=2, partitions=4, crashes=2, standbys=2, cuts=2)
    r = run_schedule(275, params, crash_window(params))
    assert r.status != VIOLATION, r.reason
    assert "standby0" in r.zombies
