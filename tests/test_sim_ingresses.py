"""Several ingresses, modelled in the simulator (DESIGN 12, docs/design/parallel_io.md):
each reads a source partition of its own and numbers its inputs in epochs; every merge
still finds one order, so the sink holds exactly the failure-free output of the inputs
in SN order, through crashes, catch-ups, zombies, writers on the nodes, checkpoints cut
at an epoch's end and restarts that replay the logged epochs; an ingress that moves its
bound to the next epoch before its pending item leaves, or past what its log holds, is
caught."""
from __future__ import annotations

import random
import re

import pytest

from flux.sim.__main__ import schedules
from flux.sim.ingresses import EpochPlan
from flux.sim.schedule import VIOLATION, SimParams

pytestmark = [pytest.mark.sim, pytest.mark.timeout(900)]

#: what a broken order looks like to the oracles (not a crash of the simulator itself)
ORDER_BROKEN = re.compile(r"^output #\d+|SNs must increase|duplicate or out of order")


def run(params, seeds):
    return schedules(params, seeds)


def test_the_plan_numbers_each_partition_in_order_and_orders_all_by_sn():
    plan = EpochPlan(list(range(200)), 3, random.Random(1))
    for reads in plan.reads:
        assert [r for _, _, r in reads] == sorted(r for _, _, r in reads)  # source order
        assert [sn for _, sn, _ in reads] == sorted(sn for _, sn, _ in reads)
    assert plan.numbers == sorted(plan.numbers) and len(set(plan.numbers)) == 200
    assert sorted(plan.inputs) == list(range(200))
    assert plan.inputs != list(range(200))  # the epochs interleave the partitions


@pytest.mark.parametrize("shape", [
    dict(ingresses=2, stages=2, partitions=4, crashes=2, standbys=1),
    dict(ingresses=3, stages=3, partitions=3, crashes=3, standbys=2, dataflow="packets"),
    dict(ingresses=3, stages=2, partitions=4, crashes=2, standbys=1, writers_on_nodes=True),
    dict(ingresses=2, stages=2, partitions=4, crashes=2, standbys=2, false_suspicions=2,
         cuts=1),
    dict(ingresses=2, stages=2, partitions=4, crashes=3, standbys=1, checkpoints=3),
    dict(ingresses=3, stages=2, partitions=4, crashes=2, standbys=1, checkpoints=2,
         restarts=1, writers_on_nodes=True),
], ids=["2x4", "3x3-packets", "writers-on-nodes", "zombies", "checkpoints", "restarts"])
def test_every_output_is_the_failure_free_one_of_the_inputs_in_sn_order(shape):
    results = run(SimParams(**shape), range(1, 41))
    bad = [r for r in results if r.status == VIOLATION]
    assert not bad, "\n".join(f"seed {r.seed}: {r.reason}" for r in bad)
    assert sum(len(r.catchups) for r in results) > 10  # failures really were masked
    if shape.get("checkpoints"):  # restarts really replayed from a checkpoint's epoch
        assert any(k is not None for r in results for k in r.restarts)


def test_a_bound_sent_before_the_epochs_last_item_is_caught():
    results = run(SimParams(ingresses=2, stages=2, partitions=4, crashes=2, standbys=1,
                            variant="epoch-bound-first"), range(1, 41))
    assert any(r.status == VIOLATION and ORDER_BROKEN.search(r.reason) for r in results)


def test_a_bound_past_the_input_log_is_caught():
    """A restart numbers the inputs the log did not hold anew: under a bound told before,
    other ingresses' outputs are committed out of the new order."""
    results = run(SimParams(ingresses=2, stages=2, partitions=4, crashes=2, standbys=1,
                            checkpoints=3, restarts=2, variant="unlogged-epoch-bound"),
                  range(1, 41))
    assert any(r.status == VIOLATION and ORDER_BROKEN.search(r.reason) for r in results)


def test_several_ingresses_read_one_source_partition_each():
    with pytest.raises(ValueError, match="one source partition"):
        SimParams(ingresses=2, source_partitions=2).validate()


def test_a_catch_up_of_a_stage_1_replica_waits_for_every_ingress_to_fold_it_in():
    """Seed 154 (2 ingresses, checkpoints, two crashes of neighbours with a rebuild
    between): the controller counted only ingress 0 among stage 1's producers, so a
    catch-up was done before ingress 1 folded the new replica in; its active then died,
    the new replica's csync waited at ingress 1 for the active's forever, and the pause of
    the next catch-up behind it: the job stalled."""
    from controller.placement import placement_for
    from controller.topology import Topology

    topology = Topology.numbered(placement_for("flux", 2, 4), 2, 4, ingresses=3)
    assert [a.partition for a in topology.stage1_producers] == [0, 1, 2]
    (result,) = run(SimParams(ingresses=2, checkpoints=3, crashes=2, standbys=2), [154])
    assert result.status != VIOLATION, result.reason
