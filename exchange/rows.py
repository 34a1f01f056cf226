"""A batch of rows, the protocol's item on the batch-granular data plane (DESIGN 11).

An item's rows carry the SNs the per-record design gives each record, as an
int64 matrix ``sns`` with one row per record: at the ingress the n-th input
has ``(n,)``; the k-th output (k from 1) of a row with SN ``s`` gets
``s + (k,)`` (flux.sequence). Sorting rows by their SNs gives the per-record
order, so the output of a batch-granular run is the per-record reference, SN
for SN, record for record and in order. The item's own number is not in the
rows: it travels as the connection SN of each sub-item
(docs/design/batches.md).

Three operations keep that true through a dataflow:

- ``split``: a producer routes an item's rows to the partitions of the next
  stage, one sub-item per destination, rows in order (an empty one is never
  sent: a progress bound covers it);
- ``merge``: a consumer that holds every producer's sub-item of one item
  merges them into one, rows in SN order: rows of one input record may reach
  it from several producers, and the per-record order interleaves them;
- ``outputs``: an operator chain's outputs per row become the rows of the
  output item, with one SN column more.

``Rows`` holds a list of Python objects; ``exchange.columns.ArrowRows`` keeps the
same ``sns`` beside a ``pyarrow.RecordBatch`` (a columnar stage's item). Both are
``NumberedRows``: what the protocol does with an item needs only the SNs.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from itertools import chain
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

SN = Tuple[int, ...]


def is_columnar(run: Any) -> bool:
    """Is ``run`` a ``pyarrow.RecordBatch`` (inputs as columns), not a record or a list
    of records? (No object is one where pyarrow was never imported.)"""
    arrow = sys.modules.get("pyarrow")
    return arrow is not None and isinstance(run, arrow.RecordBatch)


class ColumnsError(ValueError):
    """Records that do not fit a stage's columns, or bytes that are not an item's Arrow
    batch; ``row``: the record's index in its item, where one record is at fault."""

    def __init__(self, message: str, row: Optional[int] = None):
        super().__init__(message)
        self.row = row


class NumberedRows:
    """What every form of an item's rows has: the SN matrix ``sns`` (int64, one row per
    record) and the operations of the module's docstring."""

    sns: np.ndarray
    #: the rows as a ``pyarrow.RecordBatch`` (a columnar item's), or None
    batch: Any = None

    def __len__(self) -> int:
        return self.sns.shape[0]

    def row_sn(self, r: int) -> SN:
        return tuple(self.sns[r].tolist())

    def first_sn(self) -> SN:
        return self.row_sn(0)

    def last_sn(self) -> SN:
        return self.row_sn(len(self) - 1)

    def sn_tuples(self) -> Iterator[SN]:
        # zip over the columns makes the SN tuples in C (twice as fast as tuple() per row)
        return zip(*[column.tolist() for column in self.sns.T])

    def split(self, partitions: np.ndarray, count: int) -> list:
        """Per destination ``0..count-1``, the sub-item of the rows routed there (row order
        kept), or None where no row goes: a bound, not an empty item, says so."""
        partitions = np.asarray(partitions)
        if partitions.shape != (len(self),):
            raise ValueError(f"one partition per row: {len(self)} rows, got {partitions.shape}")
        out: list = [None] * count
        if len(self) == 0:
            return out
        if count == 1 or (partitions == partitions[0]).all():
            out[int(partitions[0])] = self
            return out
        # one gather into destination order, then slices (a gather per destination cost
        # twice as much)
        order = np.argsort(partitions, kind="stable")
        bounds = np.searchsorted(partitions[order], np.arange(count + 1)).tolist()
        ordered = self.taken(order)
        for d in range(count):
            lo, hi = bounds[d], bounds[d + 1]
            if lo < hi:
                out[d] = ordered.sliced(lo, hi)
        return out

    def taken(self, order: np.ndarray) -> "NumberedRows":
        """The rows in the order of the indices ``order``."""
        raise NotImplementedError

    def sliced(self, lo: int, hi: int) -> "NumberedRows":
        """Rows ``lo`` to ``hi - 1``."""
        raise NotImplementedError

    def sn_state(self) -> list:
        """The SN matrix, msgpack-safe: its shape and its little-endian bytes."""
        rows, width = self.sns.shape
        return [rows, width, self.sns.astype("<i8").tobytes()]

    def to_state(self) -> list:
        """Msgpack-safe: ``sn_state()`` and the records (or their columns)."""
        raise NotImplementedError

    def as_records(self) -> "Rows":
        """The rows as Python records (what a per-record operator takes)."""
        raise NotImplementedError


def sns_of_state(rows: int, width: int, raw: bytes) -> np.ndarray:
    """The SN matrix of ``NumberedRows.sn_state``."""
    return np.frombuffer(raw, dtype="<i8").astype(np.int64).reshape(rows, width)


def output_sns(sns: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """The SNs of outputs made by the rows ``parents`` (non-decreasing indices into
    ``sns``): the k-th output of a row (k from 1) gets ``row SN + (k,)``."""
    total = len(parents)
    if not total:
        return np.empty((0, sns.shape[1] + 1), dtype=np.int64)
    # k restarts at 1 for every row: position minus the position of the row's first output
    new_row = np.empty(total, dtype=bool)
    new_row[0] = True
    np.not_equal(parents[1:], parents[:-1], out=new_row[1:])
    firsts = np.flatnonzero(new_row)
    starts = np.repeat(firsts, np.diff(np.append(firsts, total)))
    ks = (np.arange(total, dtype=np.int64) - starts + 1).reshape(-1, 1)
    return np.hstack([sns[parents], ks])


@dataclass(frozen=True, eq=False)  # == on the SN matrix would be an array, not a bool
class Rows(NumberedRows):
    """Rows of one item: per row its SN (a row of ``sns``) and its record."""

    sns: np.ndarray  # int64, shape (len(records), SN length)
    records: List[Any]

    def __post_init__(self) -> None:
        if self.sns.ndim != 2 or self.sns.shape[0] != len(self.records):
            raise ValueError(f"{len(self.records)} records need an SN matrix of "
                             f"{len(self.records)} rows, got shape {self.sns.shape}")

    def as_records(self) -> "Rows":
        return self

    @classmethod
    def of_inputs(cls, first: int, records: Sequence[Any]) -> "Rows":
        """The ingress's item: inputs numbered ``first``, ``first + 1``, ... in the order
        they were read."""
        sns = np.arange(first, first + len(records), dtype=np.int64).reshape(-1, 1)
        return cls(sns, list(records))

    @classmethod
    def empty(cls, width: int) -> "Rows":
        return cls(np.empty((0, width), dtype=np.int64), [])

    def pairs(self) -> List[Tuple[SN, Any]]:
        """``(sn, record)`` per row, in order: what the egress delivers to a sink."""
        return list(zip(self.sn_tuples(), self.records))

    def __iter__(self) -> Iterator[Tuple[SN, Any]]:
        return iter(self.pairs())

    def taken(self, order: np.ndarray) -> "Rows":
        records = self.records
        return Rows(self.sns[order], [records[i] for i in order.tolist()])

    def sliced(self, lo: int, hi: int) -> "Rows":
        return Rows(self.sns[lo:hi], self.records[lo:hi])

    def outputs(self, produced: Sequence[Sequence[Any]]) -> "Rows":
        """The output rows: per row, in order, its outputs ``produced[r]``, the k-th with SN
        ``row SN + (k,)``."""
        if len(produced) != len(self):
            raise ValueError(f"{len(self)} rows need {len(self)} output lists, "
                             f"got {len(produced)}")
        counts = np.fromiter(map(len, produced), dtype=np.int64, count=len(produced))
        parents = np.repeat(np.arange(len(self)), counts)
        return Rows(output_sns(self.sns, parents), list(chain.from_iterable(produced)))

    def to_state(self) -> list:
        return [*self.sn_state(), list(self.records)]

    @classmethod
    def from_state(cls, state: Sequence[Any]) -> "Rows":
        rows, width, raw, records = state
        return cls(sns_of_state(rows, width, raw), list(records))


    @classmethod
    def merge_parts(cls, parts: Sequence["Rows"], sns: np.ndarray, order: np.ndarray) -> "Rows":
        records = [record for part in parts for record in part.records]
        return Rows(sns[order], [records[i] for i in order.tolist()])


def merge(parts: Sequence[NumberedRows]) -> NumberedRows:
    """One item from the sub-items of it that reached a consumer from its producers,
    rows in SN order (rows of one input record may come from several producers).

    Each part is in order already and no SN occurs twice (a record is routed to one
    partition): a stable sort of the concatenation by the SN columns is the merge.
    The parts are of one form (one operator chain made them all)."""
    if not parts:
        raise ValueError("merge needs at least one part")
    width, form = parts[0].sns.shape[1], type(parts[0])
    for part in parts:
        if part.sns.shape[1] != width:
            raise ValueError(f"parts of one item have SNs of one length: {width} and "
                             f"{part.sns.shape[1]}")
        if type(part) is not form:
            raise ValueError(f"parts of one item are of one form: {form.__name__} and "
                             f"{type(part).__name__}")
    if len(parts) == 1:
        return parts[0]
    sns = np.vstack([part.sns for part in parts])
    return form.merge_parts(parts, sns, np.lexsort(sns.T[::-1]))
