"""The columns the paper's operators on batches take and give, and how they are read
(``flux.examples.vectorized``): the schemas, the checks of a batch's columns, and a chain
of batch operators run one after the other."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exchange.columns import to_batch, to_records  # noqa: F401 (the examples' records)
from flux.operator import BatchOperator


#: the batch operator API (``flux.operator.BatchOperator``), by the name this module used
ArrowOperator = BatchOperator


PACKET_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("app", pa.string()),
                           ("kind", pa.string()), ("ts", pa.int64())])
SESSION_SCHEMA = pa.schema([("app", pa.string()), ("src", pa.int64()),
                            ("duration", pa.int64()), ("ts_end", pa.int64())])
STATS_SCHEMA = pa.schema([("app", pa.string()), ("src", pa.int64()),
                          ("max_duration", pa.int64()), ("avg_duration", pa.float64()),
                          ("newest", pa.int64())])


def run_chain(operators: Sequence[ArrowOperator],
              batch: pa.RecordBatch) -> tuple[np.ndarray, pa.RecordBatch]:
    """``operators`` one after the other on ``batch``: the last one's outputs and, per
    output, the row of ``batch`` that caused it (the rows compose)."""
    rows = np.arange(batch.num_rows, dtype=np.int64)
    for op in operators:
        produced, batch = op.process_arrow(batch)
        rows = rows[produced]
    return rows, batch



# --- columns in ---------------------------------------------------------------------------

def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    try:
        column = batch.column(name)
    except KeyError:
        raise ValueError(f"a batch needs a column {name!r}; it has {batch.schema.names}") from None
    if column.null_count:
        raise ValueError(f"column {name!r} has {column.null_count} nulls")
    return column


def _ints(batch: pa.RecordBatch, name: str) -> np.ndarray:
    column = _column(batch, name)
    if not pa.types.is_integer(column.type):
        raise ValueError(f"column {name!r} must be integers, got {column.type}")
    return _int64(column)


def _int64(column: pa.Array) -> np.ndarray:
    return (column if column.type == pa.int64() else column.cast(pa.int64())).to_numpy()


def _objects(items: Any) -> np.ndarray:
    """A 1-d object array of ``items`` (tuples stay tuples, never a 2-d array)."""
    return np.fromiter(items, dtype=object, count=len(items))


def _is_string(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_start(kinds: pa.Array) -> np.ndarray:
    """Per row: "start" (True) or "end" (False); anything else is the per-record ValueError."""
    if not (_is_string(kinds.type) or pa.types.is_dictionary(kinds.type)):
        raise ValueError(f"column 'kind' must be strings, got {kinds.type}")
    start = pc.equal(kinds, "start").to_numpy(zero_copy_only=False)
    good = start | pc.equal(kinds, "end").to_numpy(zero_copy_only=False)
    if not good.all():
        bad = kinds[int(np.flatnonzero(~good)[0])].as_py()
        raise ValueError(f"packet kind must be 'start' or 'end', got {bad!r}")
    return start
