"""Keyed state as columns: the same state, parts, deltas and checkpoint changes as a
KeyedState given the same writes; a batch operator on it catches up in parts through a
kill with the output exact."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux.columnar_state import ColumnarKeyedState
from flux.dataflow import Dataflow, Stage
from flux.keyed_state import KeyedOperator, KeyedState
from flux.operator import OperatorChain, wire_form
from flux.snapshot_chain import rebuild
from thread_runs import assert_exact_and_caught_up_in_parts, run

pytestmark = pytest.mark.timeout(120)

KEYS = st.one_of(st.integers(0, 12), st.tuples(st.sampled_from("abc"), st.integers(0, 3)))
WRITE = st.tuples(st.just("put"), st.lists(KEYS, min_size=1, max_size=6),
                  st.integers(-50, 50))
DELETE = st.tuples(st.just("delete"), st.lists(KEYS, min_size=1, max_size=3), st.just(0))
MARK = st.tuples(st.sampled_from(["clear_dirty", "start_changes"]), st.just([]), st.just(0))
OPS = st.lists(st.one_of(WRITE, WRITE, DELETE, MARK), max_size=30)


def store():
    return ColumnarKeyedState(total=np.int64, count=np.int64)


def apply(ops, columnar, model):
    """The same writes on both: per key, total += x and count += 1 (a key written twice
    in one call counts once, as a vectorized write does), or deletions."""
    for op, keys, x in ops:
        if op == "put":
            slots = columnar.slots(keys)
            distinct = list(dict.fromkeys(keys))
            first = columnar.slots(distinct)
            totals = columnar.get("total", first) + x
            counts = columnar.get("count", first) + 1
            columnar.put("total", first, totals)
            columnar.put("count", first, counts)
            assert (columnar.get("total", slots) == totals[[distinct.index(k) for k in keys]]).all()
            for k in distinct:
                t, c = model.get(k, [0, 0])
                model[k] = [t + x, c + 1]
        elif op == "delete":
            columnar.delete(columnar.find([k for k in keys if k in columnar]))
            for k in keys:
                model.pop(k, None)
        else:
            getattr(columnar, op)()
            getattr(model, op)()


@settings(max_examples=150, deadline=None)
@given(OPS, OPS)
def test_the_same_writes_give_the_same_state_parts_deltas_and_changes(before, after):
    columnar, model = store(), KeyedState()
    apply(before, columnar, model)
    assert columnar.snapshot() == model.snapshot()
    columnar.clear_dirty(), model.clear_dirty()
    columnar.start_changes(), model.start_changes()
    parts = list(columnar.parts(3))  # a catch-up's phase 1, then more writes
    apply([o for o in after if o[0] in ("put", "delete")], columnar, model)
    assert columnar.snapshot() == model.snapshot()
    assert columnar.delta() == model.delta()
    assert columnar.changes() == model.changes()
    rebuilt = store()  # the new replica: the parts, then phase 2's delta (over msgpack)
    for keys, values in parts:
        rebuilt.install_part(*wire_form([keys, values]))
    rebuilt.apply_delta(wire_form(columnar.delta()))
    assert rebuilt.snapshot() == columnar.snapshot()
    assert len(rebuilt) == len(columnar)


def test_a_checkpoint_chain_of_its_changes_rebuilds_it():
    columnar = store()
    apply([("put", [1, 2, 3], 5)], columnar, {})
    full = {"checkpoint": 1, "operators": [wire_form(columnar.snapshot())]}
    columnar.start_changes()
    apply([("put", [3, 4], 1), ("delete", [1], 0)], columnar, {})
    delta = {"checkpoint": 2, "base": 1, "operators": [None],
             "changes": [[0, wire_form(columnar.changes())]]}
    assert rebuild([full, delta]) == [wire_form(columnar.snapshot())]


def test_keys_from_columns_are_python_values_and_the_column_is_read_only():
    columnar = store()
    slots = columnar.slots((pa.array(["x", "y", "x"]), np.array([1, 2, 1])))
    assert slots[0] == slots[2] != slots[1]
    assert columnar.keys_of(slots[:2]) == [("x", 1), ("y", 2)]
    assert columnar.find(pa.array([7])).tolist() == [-1]
    with pytest.raises(ValueError, match="read-only"):
        columnar.column("total")[0] = 1
    with pytest.raises(ValueError, match="at least one column"):
        ColumnarKeyedState()


# -- on a running dataflow ------------------------------------------------------------

SCHEMA = pa.schema([("k", pa.int64()), ("x", pa.int64())])


class ColumnarSums(KeyedOperator):
    """Per row (k, the running sum of x for k), vectorized, state in columns."""

    def __init__(self):
        self.state = ColumnarKeyedState(total=np.int64)

    def process_arrow(self, batch):
        keys, xs = batch.column("k"), batch.column("x").to_numpy()
        slots = self.state.slots(keys)
        order = np.argsort(slots, kind="stable")  # each key's rows together, in order
        ordered, x = slots[order], xs[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        ends = np.r_[starts[1:], len(x)] - 1
        running = np.cumsum(x)
        running -= np.repeat(running[starts] - x[starts], np.diff(np.r_[starts, len(x)]))
        running += self.state.get("total", ordered)
        self.state.put("total", ordered[ends], running[ends])
        sums = np.empty_like(running)
        sums[order] = running
        return np.arange(batch.num_rows), pa.RecordBatch.from_arrays(
            [keys, pa.array(sums, pa.int64())], names=["k", "sum"])


@pytest.mark.slow  # a cluster run or a long property run: CI, not the quick suite
def test_a_batch_operator_on_columnar_state_catches_up_in_parts_through_a_kill():
    assert OperatorChain([ColumnarSums()]).keyed_stores()[0] is not None
    dataflow = Dataflow([Stage("sums", "k", (ColumnarSums,), schema=SCHEMA)])
    records = [(i % 3000, i % 11) for i in range(18_000)]
    cluster, expected = run(dataflow, records, partitions=2, kill="node1", batch_rows=128)
    assert_exact_and_caught_up_in_parts(cluster, expected)


def test_the_state_speed_experiment_writes_both_stores_figures(tmp_path):
    from experiments import keyed_state_speed

    assert keyed_state_speed.main(["--batches", "5", "--rows", "256", "--keys", "1000",
                                   "--rounds", "2", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    for record in ("not_recording", "recording_changes"):
        assert summary[record]["columnar"]["ns_per_row_median"] > 0
        assert summary[record]["speed_columnar_over_keyed_state"] > 0


def test_keys_left_behind_by_event_time_expire_and_the_record_says_so():
    columnar = ColumnarKeyedState(last=np.int64, count=np.int64)
    slots = columnar.slots([1, 2, 3, (float("-inf"),)])
    columnar.put("last", slots, [100, 250, 300, 400])  # the last key keeps a watermark
    columnar.start_changes()
    assert columnar.expire("last", 260, keep=[(float("-inf"),)]) == 2
    assert columnar.keys() == [3, (float("-inf"),)]
    assert columnar.changes() == {"set": [], "deleted": [1, 2]}
    assert columnar.expire("last", 0) == 0
