"""The failure-free reference run (DESIGN 8), checked against outputs computed by hand."""
from __future__ import annotations

from exchange.partitioner import HashPartitioner
from flux.examples import paper_dataflow
from flux.testing.dataflows import counting_dataflow, packet_dataflow
from flux.reference import ReferenceRun, reference_output
from flux.testing.workloads import keyed_workload, packet_workload

INPUTS = [("a", 1), ("d", 2), ("a", 3), ("a", 4)]


def test_routes_the_hand_computation_relies_on():
    h = HashPartitioner(2)
    assert (h("a"), h("d")) == (1, 0)
    assert [h(("a", c)) for c in (1, 2, -2, 3)] == [0, 1, 1, 0]
    assert h(("d", 1)) == 0


def test_two_stage_two_partition_counting_by_hand():
    # Stage 1 routes on the key, stage 2 on (key, count); every 2nd count fans out.
    # (1,)  ("a",1) -> s1 p1 a=1: ("a",1,1)  -> s2 p0 a=1: ("a",1,1)
    # (2,)  ("d",2) -> s1 p0 d=1: ("d",1,2)  -> s2 p0 d=1: ("d",1,1)
    # (3,)  ("a",3) -> s1 p1 a=2: ("a",2,3)  -> s2 p1 a=1: ("a",1,2)
    #                             ("a",-2,3) -> s2 p1 a=2: ("a",2,-2), ("a",-2,-2)
    # (4,)  ("a",4) -> s1 p1 a=3: ("a",3,4)  -> s2 p0 a=2: ("a",2,3), ("a",-2,3)
    expected = [
        ((1, 1, 1), ("a", 1, 1)),
        ((2, 1, 1), ("d", 1, 1)),
        ((3, 1, 1), ("a", 1, 2)),
        ((3, 2, 1), ("a", 2, -2)),
        ((3, 2, 2), ("a", -2, -2)),
        ((4, 1, 1), ("a", 2, 3)),
        ((4, 1, 2), ("a", -2, 3)),
    ]
    flow = counting_dataflow(2, fanout_every=2)
    assert reference_output(flow, INPUTS, partitions=2) == expected
    run = ReferenceRun(flow, 2)
    fed = [run.feed(r) for r in INPUTS]
    assert fed == [expected[:1], expected[1:2], expected[2:5], expected[5:]]
    assert run.fed == 4
    states = [[chain.get_state() for chain in stage] for stage in run.chains]
    assert states == [
        [[[["d", 1]]], [[["a", 3]]]],
        [[[["a", 2], ["d", 1]]], [[["a", 2]]]],
    ]


def test_output_is_in_sn_order_with_one_sn_component_per_stage():
    flow = counting_dataflow(3)
    out = reference_output(flow, keyed_workload(300, seed=2), partitions=3)
    sns = [sn for sn, _ in out]
    assert sns == sorted(sns) and len(set(sns)) == len(sns)
    assert {len(sn) for sn in sns} == {4}
    assert len(out) > 300  # fan-out made more outputs than inputs


def test_incremental_feed_equals_batch_and_is_deterministic():
    inputs = packet_workload(2000, seed=3, pairs=200, apps=2, sources=10, concurrent=30)
    flow = paper_dataflow(window=500)
    batch = reference_output(flow, inputs, 2)
    run = ReferenceRun(flow, 2)
    incremental = [item for r in inputs for item in run.feed(r)]
    assert incremental == batch == reference_output(paper_dataflow(window=500), inputs, 2)
    assert batch and all(record[0].startswith("app") for _, record in batch)


def test_partition_count_changes_routing_not_the_sessions():
    # Sessions are per (src, dst), so the session stage's output does not depend on partitioning.
    inputs = packet_workload(1000, seed=4, pairs=100, apps=2, sources=10, concurrent=20)
    one = reference_output(packet_dataflow(1), inputs, 1)
    four = reference_output(packet_dataflow(1), inputs, 4)
    assert one == four and one
