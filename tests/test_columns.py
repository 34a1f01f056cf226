"""Columnar items (exchange/columns.py, DESIGN 11): the rows' SNs beside an Arrow batch,
split, merged, numbered and carried on the wire exactly as ``Rows`` are; and the stable
hash of key columns that routes them (exchange/routing.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange import wire
from exchange.columns import ArrowRows, to_batch, to_records
from exchange.routing import ColumnRouter, column_hash
from exchange.row_states import rows_from_state, rows_to_state
from exchange.rows import ColumnsError, Rows, merge
from flux.addresses import Addr, P
from flux.data_messages import Batch
from flux.envelope import Envelope

pytestmark = pytest.mark.timeout(60)

SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string()), ("x", pa.float64())])


def item(first, records):
    return ArrowRows.of(Rows.of_inputs(first, records), SCHEMA)


RECORDS = [(i % 3, f"s{i % 5}", i / 2) for i in range(12)]


def test_columns_carry_the_records_and_their_sns():
    rows = item(5, RECORDS)
    assert rows.pairs() == [((5 + i,), r) for i, r in enumerate(RECORDS)]
    assert rows.as_records().pairs() == Rows.of_inputs(5, RECORDS).pairs()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40))
def test_split_then_merge_gives_the_item_back(routes):
    records = [(r, str(i), float(i)) for i, r in enumerate(routes)]
    rows = item(1, records)
    parts = [p for p in rows.split(np.array(routes), 4) if p is not None]
    for part in parts:  # each part keeps its rows' order
        assert part.sns[:, 0].tolist() == sorted(part.sns[:, 0].tolist())
    merged = merge(parts[::-1])
    assert merged.pairs() == rows.pairs()
    assert merge(parts).pairs() == Rows.of_inputs(1, records).pairs()


def test_outputs_are_numbered_as_record_by_record():
    rows = item(1, RECORDS[:4])
    out = pa.RecordBatch.from_pydict({"v": [10, 11, 30, 40, 41, 42]})
    got = rows.outputs(np.array([0, 0, 2, 3, 3, 3]), out)
    expected = Rows.of_inputs(1, RECORDS[:4]).outputs(
        [[(10,), (11,)], [], [(30,)], [(40,), (41,), (42,)]])
    assert got.pairs() == expected.pairs()


def test_a_state_round_trip_keeps_columns_and_sns():
    rows = item(3, RECORDS)
    back = rows_from_state(rows_to_state(rows))
    assert isinstance(back, ArrowRows) and back.batch.schema.equals(SCHEMA)
    assert back.pairs() == rows.pairs()
    assert isinstance(rows_from_state(rows_to_state(Rows.of_inputs(1, [1]))), Rows)


def test_columns_cross_the_wire_and_damaged_ones_are_refused():
    rows = item(1, RECORDS)
    env = Envelope(Addr(1, 0, P), Addr(2, 0, P), 0, Batch((((12, 0), rows),), (12,)), 1, 2)
    back = wire.decode(wire.encode(env))
    [(sn, got)] = back.msg.items
    assert sn == (12, 0) and isinstance(got, ArrowRows) and got.pairs() == rows.pairs()
    state = rows.to_state()
    for bad in (state[3][:-7], b"not arrow at all"):  # truncated, or not IPC
        with pytest.raises(wire.WireError, match="Arrow IPC|batch"):
            wire._rows([state[0], state[1], state[2], bad])
    with pytest.raises(wire.WireError, match="an item of 11 rows has a batch of 12"):
        wire._rows([11, 1, state[2][:88], state[3]])


def test_parts_of_one_item_are_of_one_form_and_one_schema():
    rows = item(1, RECORDS[:2])
    with pytest.raises(ValueError, match="one form"):
        merge([rows, Rows.of_inputs(3, [(0, "a", 1.0)])])
    other = ArrowRows(np.array([[9]]), pa.RecordBatch.from_pydict({"k": [1]}))
    with pytest.raises(ColumnsError, match="one schema"):
        merge([rows, other])


def test_a_record_that_does_not_fit_the_columns_is_named():
    with pytest.raises(ColumnsError, match=r"record \(1, 'b'\) does not fit") as caught:
        to_batch([(0, "a", 1.0), (1, "b"), (2, "c", 3.0)], SCHEMA)
    assert caught.value.row == 1
    with pytest.raises(ColumnsError, match="does not fit") as caught:
        to_batch([(0, "a", 1.0), ("x", "b", 2.0)], SCHEMA)
    assert caught.value.row == 1
    assert to_records(to_batch([], SCHEMA)) == []


def test_the_column_hash_is_one_function_of_the_values():
    """Equal keys hash alike whatever batch or position they are in; -0.0 is 0.0; a
    null is a key of its own; the partitions are spread."""
    batch = to_batch(RECORDS, SCHEMA)
    whole = column_hash(batch, ("k", "s"))
    for lo in range(len(RECORDS)):
        assert column_hash(batch.slice(lo, 1), ("k", "s"))[0] == whole[lo]
    by_key = {}
    for record, h in zip(RECORDS, whole.tolist()):
        assert by_key.setdefault(record[:2], h) == h
    assert len(set(by_key.values())) == len(by_key)
    floats = pa.RecordBatch.from_pydict({"x": pa.array([0.0, -0.0, None, 1.0])})
    h = column_hash(floats, ("x",))
    assert h[0] == h[1] and len({h[1], h[2], h[3]}) == 3
    routes = ColumnRouter(("k",), 4).partitions_of(
        ArrowRows.of(Rows.of_inputs(1, [(i, "", 0.0) for i in range(4000)]), SCHEMA))
    assert np.bincount(routes, minlength=4).min() > 800


def test_the_column_hash_is_the_same_in_every_process():
    """No salted hash(): another interpreter with another PYTHONHASHSEED agrees."""
    code = ("import pyarrow as pa; from exchange.routing import column_hash; "
            "b = pa.RecordBatch.from_pydict({'k': [1, 2, 3], 's': ['a', 'b', 'ü']}); "
            "print(column_hash(b, ('k', 's')).tolist())")
    here = column_hash(pa.RecordBatch.from_pydict({"k": [1, 2, 3], "s": ["a", "b", "ü"]}),
                       ("k", "s")).tolist()
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, timeout=30, check=True)
        assert out.stdout.strip() == str(here)


def test_a_key_column_that_cannot_be_hashed_is_named():
    batch = pa.RecordBatch.from_pydict({"l": pa.array([[1], [2]])})
    with pytest.raises(TypeError, match="key column 'l' of type list<item: int64> cannot"):
        column_hash(batch, ("l",))
    with pytest.raises(KeyError, match="key column 'nope' is not among"):
        column_hash(batch, ("nope",))


def test_dict_records_become_columns_by_name():
    batch = to_batch([{"k": 1, "s": "a", "x": 0.5}, {"s": "b", "k": 2}], SCHEMA)
    assert to_records(batch) == [(1, "a", 0.5), (2, "b", None)]  # a missing column: null
    with pytest.raises(ColumnsError, match=r"record \{'k': 3, 'y': 1\} does not fit") as caught:
        to_batch([{"k": 1}, {"k": 3, "y": 1}], SCHEMA)
    assert caught.value.row == 1
    with pytest.raises(ColumnsError, match="does not fit") as caught:
        to_batch([{"k": 1}, {"k": "three"}], SCHEMA)
    assert caught.value.row == 1
