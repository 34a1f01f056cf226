"""Sinks' writers on the nodes, modelled in the simulator (docs/design/parallel_io.md):
each last-stage partition's egress runs beside one replica of its partition, acks both
replicas only at its sink's commits, and starts again beside the survivor when its node
dies; every sink partition holds exactly its failure-free output, through crashes,
catch-ups, false suspicions, checkpoints and restarts; a writer that acks on receipt is
caught."""
from __future__ import annotations

import pytest

from flux.sim.__main__ import schedules
from flux.sim.schedule import VIOLATION, SimParams

pytestmark = [pytest.mark.sim, pytest.mark.timeout(900)]


def run(params, seeds):
    return schedules(params, seeds)


@pytest.mark.parametrize("shape", [
    dict(stages=2, partitions=4, crashes=2, standbys=1),
    dict(stages=3, partitions=3, crashes=3, standbys=2, dataflow="packets"),
    dict(stages=2, partitions=4, crashes=2, standbys=1, checkpoints=2, restarts=1),
    dict(stages=2, partitions=4, crashes=2, standbys=2, false_suspicions=2, cuts=1),
], ids=["2x4", "3x3-packets", "checkpoints-restarts", "zombies"])
def test_each_partition_gets_its_failure_free_output(shape):
    results = run(SimParams(writers_on_nodes=True, **shape), range(1, 41))
    bad = [r for r in results if r.status == VIOLATION]
    assert not bad, "\n".join(f"seed {r.seed}: {r.reason}" for r in bad)
    assert sum(r.writer_moves for r in results) > 10  # writers really started again


def test_a_writer_acking_before_its_commit_is_caught():
    results = run(SimParams(writers_on_nodes=True, stages=2, partitions=4, crashes=2,
                            standbys=1, variant="eager-writer-acks"), range(1, 121))
    assert any(r.status == VIOLATION for r in results)
