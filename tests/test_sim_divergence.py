"""Divergence detection in the simulator (DESIGN 14): at every cut both replicas of a
partition cross, the controller compares their digests, and the oracle compares what the
digests stand for (the replicas' states). In runs of deterministic operators, through
crashes, catch-ups, restarts and zombies, no pair ever disagrees (no false alarm); a
nondeterministic operator (one replica leaves out a record, once) is found at the first
cut both replicas cross after it, every time; digests that leave the states out are
caught missing it."""
from __future__ import annotations

import pytest

from flux.sim.__main__ import schedules
from flux.sim.schedule import DIVERGED, VIOLATION, SimParams

pytestmark = [pytest.mark.sim, pytest.mark.timeout(900)]


def failures(results):
    return "\n".join(f"seed {r.seed}: {r.reason}" for r in results if r.status == VIOLATION)


@pytest.mark.parametrize("shape", [
    dict(checkpoints=3, crashes=3, standbys=2),
    dict(checkpoints=3, restarts=2, standbys=1, writers_on_nodes=True),
    dict(checkpoints=3, stages=3, dataflow="packets-ttl", standbys=2, false_suspicions=2),
], ids=["catch-ups", "restarts-writers", "packets-zombies"])
def test_deterministic_pairs_never_disagree(shape):
    results = schedules(SimParams(**shape), range(1, 81))
    assert not failures(results), failures(results)
    assert not [r for r in results if r.status == DIVERGED]
    assert sum(r.digests_compared for r in results) > 200  # pairs really were compared
    assert sum(len(r.catchups) for r in results) > 20  # through rebuilt replicas too


@pytest.mark.parametrize("shape", [
    dict(checkpoints=6),
    dict(checkpoints=6, crashes=3, standbys=2, restarts=1),
], ids=["no-failures", "failures"])
def test_a_nondeterministic_operator_is_found_at_the_next_cut_both_replicas_cross(shape):
    """The oracle reports a violation for every pair whose states differ at a cut while
    the digests agree: none here, and the job stopped for the divergence in many runs."""
    results = schedules(SimParams(variant="nondeterministic", **shape), range(1, 151))
    assert not failures(results), failures(results)
    found = [r for r in results if r.status == DIVERGED]
    assert len(found) >= 15
    assert all("not deterministic" in r.reason for r in found)
    # the oracle checked every key named (its values differ at the cut): many were
    named = [r for r in found if "a key whose value differs" in r.reason]
    assert len(named) >= len(found) // 4 and sum(r.keys_named for r in results) == len(named)


def test_digests_without_the_states_are_caught_missing_a_divergence():
    results = schedules(SimParams(variant="nondeterministic-undigested", checkpoints=6),
                        range(1, 101))
    missed = [r for r in results if r.status == VIOLATION]
    assert missed and all("differ between the replicas" in r.reason for r in missed)
