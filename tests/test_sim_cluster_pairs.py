"""The paper's baseline in the simulator (4.2, DESIGN 7): cluster pairs, a whole replica
set on each half of the nodes, plain exchanges inside a set. One node's crash fails its
whole set (the others are told to stop, as zombies they are fenced) and the other set
carries the dataflow alone. Without checkpoints the lost set stays lost, so a crash in
the other set loses pairs; with them, a checkpoint is cut after the loss (a consistent
snapshot of the surviving set) and the whole job restarts from it once it completes: the
set is rebuilt, and the output is the failure-free run's throughout."""
from __future__ import annotations

import pytest

from flux.sim.__main__ import schedules
from flux.sim.schedule import PAIR_LOST, VIOLATION, SimParams

pytestmark = [pytest.mark.sim, pytest.mark.timeout(900)]


def failures(results):
    return "\n".join(f"seed {r.seed}: {r.reason}" for r in results if r.status == VIOLATION)


@pytest.mark.parametrize("shape", [
    dict(crashes=2, standbys=1),
    dict(crashes=2, stages=3, dataflow="packets-ttl", partitioned_egress=True, cuts=1,
         false_suspicions=1),
], ids=["crashes", "packets-cuts"])
def test_without_checkpoints_one_set_carries_the_dataflow_when_the_other_fails(shape):
    results = schedules(SimParams(placement="cluster-pairs", **shape), range(1, 81))
    assert not failures(results), failures(results)
    assert not any(r.catchups or r.sets_rebuilt for r in results)  # nothing is rebuilt
    # a crash fails the other nodes of its set too: they ran on, and were fenced
    assert sum(len(r.zombies) for r in results) > 40


def test_a_crash_in_each_set_loses_pairs_without_a_checkpoint():
    results = schedules(SimParams(placement="cluster-pairs", crashes=2, standbys=1,
                                  victims=(0, 2)), range(1, 21))
    assert not failures(results), failures(results)
    assert all(r.status == PAIR_LOST for r in results), [r.status for r in results]


@pytest.mark.parametrize("shape", [
    dict(crashes=2, checkpoints=3),
    dict(crashes=3, checkpoints=3, restarts=1, writers_on_nodes=True, partitioned_egress=True),
    dict(crashes=2, checkpoints=2, ingresses=3),
    dict(crashes=2, checkpoints=2, stages=3, dataflow="packets-ttl", cuts=2,
         false_suspicions=2),
], ids=["crashes", "restarts-writers", "ingresses", "packets-cuts"])
def test_with_checkpoints_a_lost_set_is_rebuilt_from_a_cut_after_the_loss(shape):
    results = schedules(SimParams(placement="cluster-pairs", **shape), range(1, 81))
    assert not failures(results), failures(results)
    assert sum(r.sets_rebuilt for r in results) >= 20


def test_with_checkpoints_a_crash_in_each_set_in_turn_loses_nothing():
    """The second crash strikes the other set after the first set's rebuild: nothing is
    lost (without checkpoints every such schedule lost pairs, above)."""
    results = schedules(SimParams(placement="cluster-pairs", crashes=2, checkpoints=4,
                                  victims=(0, 2), triggers=("any", "after")), range(1, 41))
    assert not failures(results), failures(results)
    rebuilt = [r for r in results if r.sets_rebuilt]
    assert len(rebuilt) >= 10 and all(r.status != PAIR_LOST for r in rebuilt)
