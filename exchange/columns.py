"""A columnar item: the rows' SNs beside a ``pyarrow.RecordBatch`` (DESIGN 11).

A stage whose operators take whole Arrow batches (``process_arrow``) gets its
items as ``ArrowRows``: the same SN matrix as ``exchange.rows.Rows`` (so the
protocol, the merge and the output's numbering are unchanged) and the records
as columns. On the wire and in buffer and checkpoint states the batch is Arrow
IPC bytes: no per-row work, and the bytes are made once for both replicas.

A row's record, where a per-record operator or a sink needs one, is the tuple of
its values in column order (``to_records``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from collections.abc import Mapping
from typing import Any, List, Sequence, Tuple

import numpy as np
import pyarrow as pa

from exchange.rows import SN, ColumnsError, NumberedRows, Rows, output_sns, sns_of_state


def to_records(batch: pa.RecordBatch) -> list:
    """A batch's rows as tuples of their values in column order."""
    if batch.num_columns == 0:
        return [()] * batch.num_rows
    return list(zip(*(column.to_pylist() for column in batch.columns)))


def to_batch(records: Sequence[Any], schema: pa.Schema) -> pa.RecordBatch:
    """Per-record tuples (or lists) of values in the schema's order, or dicts by column
    name, as a batch of ``schema``; a record that does not fit is named
    (``ColumnsError``)."""
    if records and isinstance(records[0], Mapping):
        return _dicts_to_batch(records, schema)
    width = len(schema)
    try:
        if any(len(record) != width for record in records):
            raise ValueError("wrong width")
        columns = list(zip(*records)) if records else [()] * width
        arrays = [pa.array(column, type=field.type) for column, field in zip(columns, schema)]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    except (TypeError, ValueError, pa.ArrowException):
        for i, record in enumerate(records):  # which record: convert them one by one
            try:
                if len(record) != width:
                    raise ValueError(f"{len(record)} values for {width} columns")
                for value, field in zip(record, schema):
                    pa.array([value], type=field.type)
            except Exception as exc:
                raise ColumnsError(f"record {record!r:.120} does not fit the columns "
                                   f"{schema.names}: {type(exc).__name__}: {exc}",
                                   row=i) from None
        raise


def _dicts_to_batch(records: Sequence[Any], schema: pa.Schema) -> pa.RecordBatch:
    """Dict records (a column name to its value) as a batch of ``schema``: a missing
    column is a null, a name not in the schema an error naming the record."""
    names = set(schema.names)
    try:
        for i, record in enumerate(records):
            if not isinstance(record, Mapping) or not names.issuperset(record):
                raise ColumnsError(f"record {record!r:.120} does not fit the columns "
                                   f"{schema.names}: a dict of those names (or a tuple of "
                                   f"their values) expected", row=i)
        return pa.RecordBatch.from_pylist(list(records), schema=schema)
    except (TypeError, pa.ArrowException):
        for i, record in enumerate(records):
            try:
                pa.RecordBatch.from_pylist([record], schema=schema)
            except Exception as exc:
                raise ColumnsError(f"record {record!r:.120} does not fit the columns "
                                   f"{schema.names}: {type(exc).__name__}: {exc}",
                                   row=i) from None
        raise


@dataclass(frozen=True, eq=False)  # == on the SN matrix would be an array, not a bool
class ArrowRows(NumberedRows):
    """Rows of one item as columns: per row its SN (a row of ``sns``) and a row of
    ``batch``."""

    sns: np.ndarray  # int64, shape (batch.num_rows, SN length)
    batch: pa.RecordBatch

    def __post_init__(self) -> None:
        if self.sns.ndim != 2 or self.sns.shape[0] != self.batch.num_rows:
            raise ValueError(f"a batch of {self.batch.num_rows} rows needs an SN matrix of "
                             f"as many rows, got shape {self.sns.shape}")

    @classmethod
    def of(cls, rows: NumberedRows, schema: pa.Schema) -> "ArrowRows":
        """``rows`` as columns of ``schema`` (a columnar stage's input from records, or
        from a columnar source whose batches have other types: cast where Arrow can)."""
        if isinstance(rows, ArrowRows):
            if rows.batch.schema.equals(schema):
                return rows
            try:
                return cls(rows.sns, rows.batch.select(schema.names).cast(schema))
            except (KeyError, ValueError, pa.ArrowException) as exc:
                raise ColumnsError(f"a batch of columns {rows.batch.schema.names} "
                                   f"({', '.join(map(str, rows.batch.schema.types))}) does "
                                   f"not fit the columns {schema.names}: {exc}") from None
        return cls(rows.sns, to_batch(rows.records, schema))

    @cached_property
    def records(self) -> List[tuple]:
        """The rows as tuples (for a per-record operator, a key function or a sink)."""
        return to_records(self.batch)

    def as_records(self) -> Rows:
        return Rows(self.sns, self.records)

    def pairs(self) -> List[Tuple[SN, Any]]:
        """``(sn, record)`` per row, in order: what the egress delivers to a sink."""
        return list(zip(self.sn_tuples(), self.records))

    def taken(self, order: np.ndarray) -> "ArrowRows":
        return ArrowRows(self.sns[order], self.batch.take(pa.array(order)))

    def sliced(self, lo: int, hi: int) -> "ArrowRows":
        return ArrowRows(self.sns[lo:hi], self.batch.slice(lo, hi - lo))  # zero-copy

    def outputs(self, parents: np.ndarray, batch: pa.RecordBatch) -> "ArrowRows":
        """The output rows ``batch``, output i made by row ``parents[i]`` (non-decreasing),
        numbered as record by record."""
        return ArrowRows(output_sns(self.sns, parents), batch)

    def to_state(self) -> list:
        """Msgpack-safe: ``sn_state()`` and the batch as Arrow IPC."""
        return [*self.sn_state(), to_ipc(self.batch)]

    @classmethod
    def from_state(cls, state: Sequence[Any]) -> "ArrowRows":
        rows, width, raw, ipc = state
        return cls(sns_of_state(rows, width, raw), from_ipc(ipc, rows))

    @classmethod
    def merge_parts(cls, parts: Sequence["ArrowRows"], sns: np.ndarray,
                    order: np.ndarray) -> "ArrowRows":
        schema = parts[0].batch.schema
        for part in parts:
            if not part.batch.schema.equals(schema):
                raise ColumnsError(f"parts of one item have one schema: {schema} and "
                                   f"{part.batch.schema}")
        batch = pa.concat_batches([part.batch for part in parts])
        return cls(sns[order], batch.take(pa.array(order)))


def to_ipc(batch: pa.RecordBatch) -> bytes:
    """A batch as an Arrow IPC stream (schema and one batch)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def from_ipc(data: Any, rows: int) -> pa.RecordBatch:
    """The one batch of ``rows`` rows an Arrow IPC stream holds; anything else is a
    ``ColumnsError`` (a peer's bytes are never trusted, DESIGN 4.4)."""
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        batches = list(reader)
        if len(batches) != 1:
            raise ColumnsError(f"an item's columns are one batch, got {len(batches)}")
        batch = batches[0]
        batch.validate(full=True)
    except pa.ArrowException as exc:
        raise ColumnsError(f"an item's columns are not an Arrow IPC batch: {exc}") from None
    if batch.num_rows != rows:
        raise ColumnsError(f"an item of {rows} rows has a batch of {batch.num_rows}")
    return batch
