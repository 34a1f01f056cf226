"""Rows routed per key group (``exchange.group_load``): every producer counts the rows it
routes to each key group of the next stage as it routes them, the same for a key
function and for key columns, and reports them with its counters (the rebalancing
policy's load, ``controller.rebalance``)."""
from __future__ import annotations

import numpy as np
import pytest

from exchange.group_load import GroupLoad
from exchange.partitioner import HashPartitioner
from exchange.routing import column_hash, router_for, routed
from exchange.rows import Rows
from flux.protocol.ingress import Ingress

pytestmark = pytest.mark.timeout(30)

RECORDS = [(f"k{i % 37}", i) for i in range(500)]


def expected_counts(groups=256):
    hp = HashPartitioner(4, groups)
    return np.bincount([hp.group(r[0]) for r in RECORDS], minlength=groups).tolist()


def test_a_key_function_counts_each_row_in_its_group_and_routes_as_before():
    router = router_for(lambda r: r[0], 4)
    load = GroupLoad()
    rows = Rows.of_inputs(1, RECORDS)
    _, routes = routed(router, rows, 4, load)
    assert list(routes) == [router.route(r) for r in RECORDS]
    assert list(load.totals()) == expected_counts()
    routed(router, rows, 4, load)  # counts add up
    assert list(load.totals()) == [2 * n for n in expected_counts()]


def test_key_columns_count_by_the_column_hash():
    pa = pytest.importorskip("pyarrow")
    batch = pa.RecordBatch.from_pylist([{"k": i % 37, "v": i} for i in range(500)])
    from exchange.columns import ArrowRows
    rows = ArrowRows(np.arange(1, 501, dtype=np.int64).reshape(-1, 1), batch)
    load = GroupLoad()
    routed(router_for(("k",), 4), rows, 4, load)
    groups = (column_hash(batch, ("k",)) % np.uint64(256)).astype(np.int64)
    assert list(load.totals()) == np.bincount(groups, minlength=256).tolist()


def test_nothing_is_counted_without_key_groups_or_with_one_partition():
    load = GroupLoad()
    rows = Rows.of_inputs(1, RECORDS)
    routed(router_for(lambda r: r[0], 4, key_groups=None), rows, 4, load)
    routed(router_for(lambda r: r[0], 1), rows, 1, load)
    assert load.totals() == ()


def test_the_ingress_reports_what_it_routed_to_stage_one_groups():
    ingress = Ingress(4, router_for(lambda r: r[0], 4), 64, 16, batch_rows=100)
    for record in RECORDS[:90]:  # cut at 100 inputs by itself, then by a checkpoint's cut
        ingress.accept(record)
    ingress.cut_item(force=True)
    for record in RECORDS[90:]:
        ingress.accept(record)
    ingress.cut_item(force=True)
    assert list(ingress.stats().routed) == expected_counts()
