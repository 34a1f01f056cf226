"""The paper's baseline in the simulator (4.2, DESIGN 7): cluster pairs, a whole replica
set on each half of the nodes, plain exchanges inside a set. One node's crash fails its
whole set (the others are told to stop, as zombies they are fenced), the other set
carries the dataflow alone, and its output is the failure-free run's, through crashes,
checkpoints, restarts and writers on the nodes. A lost set is not rebuilt (why:
docs/design/divergence.md), so a crash in the other set loses pairs."""
from __future__ import annotations

import pytest

from flux.sim.__main__ import schedules
from flux.sim.schedule import PAIR_LOST, VIOLATION, SimParams

pytestmark = [pytest.mark.sim, pytest.mark.timeout(900)]


def failures(results):
    return "\n".join(f"seed {r.seed}: {r.reason}" for r in results if r.status == VIOLATION)


@pytest.mark.parametrize("shape", [
    dict(crashes=2, standbys=1),
    dict(crashes=2, standbys=2, checkpoints=3, restarts=1),
    dict(crashes=2, stages=3, dataflow="packets-ttl", partitioned_egress=True,
         writers_on_nodes=True, checkpoints=2),
], ids=["crashes", "checkpoints-restarts", "packets-writers"])
def test_one_set_carries_the_dataflow_when_the_other_fails(shape):
    results = schedules(SimParams(placement="cluster-pairs", **shape), range(1, 81))
    assert not failures(results), failures(results)
    assert not any(r.catchups for r in results)  # nothing is rebuilt
    # a crash fails the other nodes of its set too: they ran on, and were fenced
    assert sum(len(r.zombies) for r in results) > 40


def test_a_crash_in_each_set_loses_pairs_without_a_checkpoint():
    results = schedules(SimParams(placement="cluster-pairs", crashes=2, standbys=1,
                                  victims=(0, 2)), range(1, 21))
    assert not failures(results), failures(results)
    assert all(r.status == PAIR_LOST for r in results), [r.status for r in results]
