"""An egress and a sink per last-stage partition, modelled in the simulator
(docs/design/parallel_io.md): each partition's sink holds exactly the failure-free
output of its partition, in order, through crashes, catch-ups, checkpoints (each sink
partition committing at the cuts by itself) and whole-job restarts; the ordered mode's
schedules are unchanged; broken variants are still caught."""
from __future__ import annotations

import random

import pytest

from flux.sim.__main__ import crash_window, schedules
from flux.sim.schedule import VIOLATION, SimParams, first_violation, make_world

pytestmark = pytest.mark.timeout(600)


def all_ok(params, seeds):
    results = schedules(params, seeds)
    bad = [r for r in results if r.status == VIOLATION]  # a corrupt store may stop a job
    assert not bad, "\n".join(f"seed {r.seed}: {r.reason}" for r in bad)
    return results


@pytest.mark.parametrize("shape", [
    dict(stages=2, partitions=4, crashes=2),
    dict(stages=3, partitions=3, crashes=2, dataflow="packets", standbys=1),
    dict(stages=2, partitions=3, crashes=1, checkpoints=3, restarts=1),
    dict(stages=2, partitions=3, crashes=1, checkpoints=3, source_partitions=2, restarts=1),
    # a last-stage replica's catch-up waits for its own partition's egress to fold it in
    # (the controller once waited for partition 0's, and the catch-up stalled)
    dict(stages=2, partitions=4, crashes=2, standbys=1, restarts=1),
], ids=["2x4", "3x3-packets-standby", "checkpoints-restarts", "input-log", "standby-restart"])
@pytest.mark.sim  # a long simulator run: CI, not the quick suite
def test_each_partition_gets_its_failure_free_output(shape):
    results = all_ok(SimParams(partitioned_egress=True, **shape), range(1, 31))
    assert sum(len(r.crashed) for r in results) > 20  # crashes really happened
    if shape.get("checkpoints"):
        assert sum(len(r.complete) for r in results) > 10
        assert sum(len(r.restarts) for r in results) > 5


def test_the_outputs_go_to_the_sink_of_their_partition():
    params = SimParams(partitioned_egress=True, partitions=4, crashes=0)
    world, reference, _, parts = make_world(params, 3, random.Random(3))
    assert len(world.egresses) == 4 and len({e.addr for e in world.egresses}) == 4
    assert len(set(parts)) > 1  # the reference's outputs come from several partitions
    ordered, _, _, none = make_world(SimParams(partitions=4), 3, random.Random(3))
    assert len(ordered.egresses) == 1 and none is None


def test_a_sink_partition_that_held_back_a_commit_keeps_the_checkpoint_open():
    from controller.checkpoints import CheckpointCoordinator

    c = CheckpointCoordinator(1, 2, "f", sinks=2)
    c.begin(1, 10)
    c.source_recorded(1, 10)
    c.part_written(1, 1, 0, "a")
    c.part_written(1, 1, 1, "b")
    assert c.sink_committed(1, (9, 1), partition=1) is None
    assert "the commits of sink partitions 0" in c.missing(1)
    manifest = c.sink_committed(1, (7, 1), partition=0)
    assert manifest["sink"] == [9, 1] and manifest["sinks"] == [[7, 1], [9, 1]]
    with pytest.raises(ValueError, match="no sink partition 2"):
        c.sink_committed(1, None, partition=2)


@pytest.mark.parametrize("variant, extra", [
    ("no-dup-filter", {}),
    ("early-evict", {}),
    ("no-reversal", dict(standbys=1)),
    ("late-snapshot", dict(checkpoints=3)),
])
def test_broken_variants_are_still_caught(variant, extra):
    params = SimParams(variant=variant, stages=2, partitions=3, crashes=1,
                       partitioned_egress=True, **extra)
    assert first_violation(params, range(1, 301), crash_window(params)) is not None


@pytest.mark.sim
@pytest.mark.parametrize("shape, schedules", [
    (dict(stages=2, partitions=4, crashes=2), 400),
    (dict(stages=3, partitions=5, crashes=2), 200),
    (dict(stages=2, partitions=4, crashes=2, checkpoints=4, restarts=2, source_partitions=2,
          corrupt_checkpoints=1), 300),
    (dict(stages=2, partitions=4, crashes=3, standbys=2, checkpoints=3, restarts=1,
          source_partitions=3), 300),
], ids=["2x4", "3x5", "checkpoints-restarts-corrupt", "standbys-checkpoints-restarts"])
def test_many_schedules_of_partitioned_egress_hold(shape, schedules):
    all_ok(SimParams(partitioned_egress=True, **shape), range(1, schedules + 1))
