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

``records`` is a list of Python objects here; a columnar item keeps the same
``sns`` beside a ``pyarrow.RecordBatch``.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

SN = Tuple[int, ...]


@dataclass(frozen=True, eq=False)  # == on the SN matrix would be an array, not a bool
class Rows:
    """Rows of one item: per row its SN (a row of ``sns``) and its record."""

    sns: np.ndarray  # int64, shape (len(records), SN length)
    records: List[Any]

    def __post_init__(self) -> None:
        if self.sns.ndim != 2 or self.sns.shape[0] != len(self.records):
            raise ValueError(f"{len(self.records)} records need an SN matrix of "
                             f"{len(self.records)} rows, got shape {self.sns.shape}")

    def __len__(self) -> int:
        return len(self.records)

    @classmethod
    def of_inputs(cls, first: int, records: Sequence[Any]) -> "Rows":
        """The ingress's item: inputs numbered ``first``, ``first + 1``, ... in the order
        they were read."""
        sns = np.arange(first, first + len(records), dtype=np.int64).reshape(-1, 1)
        return cls(sns, list(records))

    @classmethod
    def empty(cls, width: int) -> "Rows":
        return cls(np.empty((0, width), dtype=np.int64), [])

    def row_sn(self, r: int) -> SN:
        return tuple(self.sns[r].tolist())

    def first_sn(self) -> SN:
        return self.row_sn(0)

    def last_sn(self) -> SN:
        return self.row_sn(len(self) - 1)

    def pairs(self) -> List[Tuple[SN, Any]]:
        """``(sn, record)`` per row, in order: what the egress delivers to a sink."""
        # zip over the columns makes the SN tuples in C (twice as fast as tuple() per row)
        return list(zip(zip(*[column.tolist() for column in self.sns.T]), self.records))

    def __iter__(self) -> Iterator[Tuple[SN, Any]]:
        return iter(self.pairs())

    def split(self, partitions: np.ndarray, count: int) -> List[Optional["Rows"]]:
        """Per destination ``0..count-1``, the sub-item of the rows routed there (row order
        kept), or None where no row goes: a bound, not an empty item, says so."""
        partitions = np.asarray(partitions)
        if partitions.shape != (len(self),):
            raise ValueError(f"one partition per row: {len(self)} rows, got {partitions.shape}")
        out: List[Optional[Rows]] = [None] * count
        if len(self) == 0:
            return out
        if count == 1 or (partitions == partitions[0]).all():
            out[int(partitions[0])] = self
            return out
        order = np.argsort(partitions, kind="stable")
        bounds = np.searchsorted(partitions[order], np.arange(count + 1))
        records = self.records
        for d in range(count):
            lo, hi = bounds[d], bounds[d + 1]
            if lo < hi:
                taken = order[lo:hi]
                out[d] = Rows(self.sns[taken], [records[i] for i in taken.tolist()])
        return out

    def outputs(self, produced: Sequence[Sequence[Any]]) -> "Rows":
        """The output rows: per row, in order, its outputs ``produced[r]``, the k-th with SN
        ``row SN + (k,)``."""
        if len(produced) != len(self):
            raise ValueError(f"{len(self)} rows need {len(self)} output lists, "
                             f"got {len(produced)}")
        counts = np.array(list(map(len, produced)), dtype=np.int64)
        total = int(counts.sum())
        if not total:
            return Rows.empty(self.sns.shape[1] + 1)
        parents = np.repeat(np.arange(len(self)), counts)
        # k restarts at 1 for every row: position in the output minus the row's first position
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        ks = (np.arange(total, dtype=np.int64) - starts + 1).reshape(-1, 1)
        sns = np.hstack([self.sns[parents], ks])
        return Rows(sns, list(chain.from_iterable(produced)))

    def to_state(self) -> list:
        """Msgpack-safe: the SN matrix's shape and bytes, and the records."""
        rows, width = self.sns.shape
        return [rows, width, self.sns.astype("<i8").tobytes(), list(self.records)]

    @classmethod
    def from_state(cls, state: Sequence[Any]) -> "Rows":
        rows, width, raw, records = state
        sns = np.frombuffer(raw, dtype="<i8").astype(np.int64).reshape(rows, width)
        return cls(sns, list(records))


def merge(parts: Sequence[Rows]) -> Rows:
    """One item from the sub-items of it that reached a consumer from its producers,
    rows in SN order (rows of one input record may come from several producers).

    Each part is in order already and no SN occurs twice (a record is routed to one
    partition): a stable sort of the concatenation by the SN columns is the merge."""
    if not parts:
        raise ValueError("merge needs at least one part")
    width = parts[0].sns.shape[1]
    for part in parts:
        if part.sns.shape[1] != width:
            raise ValueError(f"parts of one item have SNs of one length: {width} and "
                             f"{part.sns.shape[1]}")
    if len(parts) == 1:
        return parts[0]
    sns = np.vstack([part.sns for part in parts])
    records = [record for part in parts for record in part.records]
    order = np.lexsort(sns.T[::-1])
    return Rows(sns[order], [records[i] for i in order.tolist()])
