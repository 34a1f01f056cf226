"""The batch as the protocol's item (DESIGN 11): an item's rows carry the per-record SNs,
so splitting at every producer and merging at every consumer gives, item after item,
exactly the per-record failure-free output, SN for SN and in order."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.partitioner import HashPartitioner
from exchange.rows import Rows, merge
from flux.reference import reference_output
from flux.testing.dataflows import counting_dataflow, packet_dataflow
from flux.testing.workloads import keyed_workload, packet_workload

pytestmark = pytest.mark.timeout(120)


def batch_run(dataflow, inputs, partitions, sizes):
    """A failure-free, unreplicated run with items: the ingress cuts ``inputs`` into
    items of ``sizes`` rows (in turn), every stage partition takes the merge of the
    sub-items its producers routed to it, item by item; the egress merges the last
    stage's. Returns ``(sn, record)`` per output, as a sink would get them."""
    route = HashPartitioner(partitions)
    chains = [[stage.build_chain() for _ in range(partitions)] for stage in dataflow.stages]
    out, start, b = [], 0, 0
    while start < len(inputs):
        size = sizes[b % len(sizes)]
        b += 1
        items = [Rows.of_inputs(start + 1, inputs[start:start + size])]
        start += size
        for s, stage in enumerate(dataflow.stages):
            key_route = route.router(stage.key)
            arrived = [[] for _ in range(partitions)]
            for item in items:  # one per producer that had rows for this item
                routed = np.fromiter((key_route(r) for r in item.records), dtype=np.int64,
                                     count=len(item))
                for d, sub in enumerate(item.split(routed, partitions)):
                    if sub is not None:
                        arrived[d].append(sub)
            items = []
            for d, parts in enumerate(arrived):
                if parts:
                    merged = merge(parts)
                    items.append(merged.outputs(chains[s][d].process_many(merged.records)))
            items = [item for item in items if len(item)]
        if items:
            out.extend(merge(items).pairs())
    return out


@settings(max_examples=40, deadline=None)
@given(stages=st.integers(1, 4), partitions=st.integers(1, 5),
       sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4),
       seed=st.integers(0, 10 ** 6), fanout=st.integers(1, 4))
def test_items_give_the_per_record_output_in_order(stages, partitions, sizes, seed, fanout):
    inputs = keyed_workload(150, seed, keys=7)
    dataflow = counting_dataflow(stages, fanout_every=fanout)
    expected = reference_output(dataflow, inputs, partitions)
    assert batch_run(counting_dataflow(stages, fanout_every=fanout), inputs, partitions,
                     sizes) == expected


@pytest.mark.parametrize("sizes", [[1], [7], [64, 3, 200], [1000]])
def test_the_papers_dataflow_over_items(sizes):
    inputs = packet_workload(600, 3, pairs=40, apps=3, sources=5, concurrent=6)
    expected = reference_output(packet_dataflow(4), inputs, 3)
    assert expected, "the workload gives outputs"
    assert batch_run(packet_dataflow(4), inputs, 3, sizes) == expected


def test_an_item_splits_and_merges_back():
    item = Rows.of_inputs(4, list("abcdef"))
    parts = item.split(np.array([2, 0, 2, 0, 0, 2]), 4)
    assert [None if p is None else p.records for p in parts] == [["b", "d", "e"], None,
                                                                 ["a", "c", "f"], None]
    merged = merge([parts[2], parts[0]])
    assert list(merged.pairs()) == list(item.pairs())


def test_outputs_number_each_rows_outputs_from_one():
    item = Rows.of_inputs(2, ["x", "y", "z"])
    out = item.outputs([["x1", "x2"], [], ["z1"]])
    assert out.pairs() == [((2, 1), "x1"), ((2, 2), "x2"), ((4, 1), "z1")]
    assert len(item.outputs([[], [], []])) == 0


def test_parts_of_different_depths_are_refused():
    a, b = Rows.of_inputs(1, ["a"]), Rows.of_inputs(2, ["b"]).outputs([["c"]])
    with pytest.raises(ValueError, match="one length"):
        merge([a, b])


def test_an_item_crosses_msgpack_whole():
    import msgpack
    item = Rows.of_inputs(7, [["a", 1], ["b", 2]]).outputs([["x"], ["y", "z"]])
    back = Rows.from_state(msgpack.unpackb(msgpack.packb(item.to_state())))
    assert back.pairs() == item.pairs()
