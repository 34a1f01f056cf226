"""A batch of rows, the protocol's item on the batch-granular data plane (DESIGN 11).

An item carries one SN, ``item``; its rows carry the SNs the per-record design
gives each record, as an int64 matrix ``sns`` of one row per record: the
columns after the item's SN, i.e. a row's full SN is ``item + tuple(sns[r])``.
At the ingress a row's SN is ``item + (r,)`` (r from 1); the k-th output
(k from 1) of a row with SN ``s`` gets ``s + (k,)``, exactly as per record
(flux.sequence). So sorting rows by their SNs gives the per-record order, and
the output of a batch-granular run is the per-record reference, record for
record and in order.

Three operations keep that true through a dataflow:

- ``split``: a producer routes an item's rows to the partitions of the next
  stage, one sub-item per destination, each with the item's SN and its rows in
  order (an empty one is never sent: a progress bound covers it);
- ``merge``: a consumer that holds, from every producer, the sub-item of SN x
  (or a bound past x) merges them into one item x, rows in SN order: rows of
  one input record may reach it from several producers, and the per-record
  order interleaves them;
- ``outputs``: an operator chain's outputs per row become the rows of the
  output item, with one SN column more.

``records`` is a list of Python objects here; a columnar item keeps the same
``sns`` beside a ``pyarrow.RecordBatch``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

SN = Tuple[int, ...]


@dataclass(frozen=True, eq=False)  # == on the SN matrix would be an array, not a bool
class Rows:
    """One item: its SN, and per row the SN columns after it and the record."""

    item: SN
    sns: np.ndarray  # int64, shape (len(records), depth)
    records: List[Any]

    def __post_init__(self) -> None:
        if self.sns.ndim != 2 or self.sns.shape[0] != len(self.records):
            raise ValueError(f"an item of {len(self.records)} records needs an SN matrix of "
                             f"{len(self.records)} rows, got shape {self.sns.shape}")

    def __len__(self) -> int:
        return len(self.records)

    @classmethod
    def of_inputs(cls, item: SN, records: Sequence[Any]) -> "Rows":
        """The ingress's item: rows numbered 1..n in the order they were read."""
        sns = np.arange(1, len(records) + 1, dtype=np.int64).reshape(-1, 1)
        return cls(item, sns, list(records))

    def row_sn(self, r: int) -> SN:
        return self.item + tuple(int(v) for v in self.sns[r])

    def pairs(self) -> Iterator[Tuple[SN, Any]]:
        """``(sn, record)`` per row, in order: what the egress delivers to a sink."""
        for r, record in enumerate(self.records):
            yield self.row_sn(r), record

    def split(self, partitions: np.ndarray, count: int) -> List[Optional["Rows"]]:
        """Per destination ``0..count-1``, the sub-item of the rows routed there (row order
        kept), or None where no row goes: a bound, not an empty item, says so."""
        partitions = np.asarray(partitions)
        if partitions.shape != (len(self),):
            raise ValueError(f"one partition per row: {len(self)} rows, got {partitions.shape}")
        out: List[Optional[Rows]] = [None] * count
        if len(self) == 0:
            return out
        order = np.argsort(partitions, kind="stable")
        bounds = np.searchsorted(partitions[order], np.arange(count + 1))
        for d in range(count):
            lo, hi = bounds[d], bounds[d + 1]
            if lo < hi:
                taken = order[lo:hi]
                out[d] = Rows(self.item, self.sns[taken], [self.records[i] for i in taken])
        return out

    def outputs(self, produced: Sequence[Sequence[Any]]) -> "Rows":
        """The output item: per row, in order, its outputs ``produced[r]``, the k-th with SN
        ``row SN + (k,)``."""
        if len(produced) != len(self):
            raise ValueError(f"{len(self)} rows need {len(self)} output lists, "
                             f"got {len(produced)}")
        counts = np.fromiter((len(p) for p in produced), dtype=np.int64, count=len(produced))
        total = int(counts.sum())
        parents = np.repeat(np.arange(len(self)), counts)
        # k restarts at 1 for every row: position in the output minus the row's first position
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        ks = (np.arange(total, dtype=np.int64) - starts + 1).reshape(-1, 1)
        sns = np.hstack([self.sns[parents], ks]) if total else np.empty(
            (0, self.sns.shape[1] + 1), dtype=np.int64)
        return Rows(self.item, sns, [out for outs in produced for out in outs])


def merge(parts: Sequence[Rows]) -> Rows:
    """One item from the sub-items of one SN that reached a consumer from its producers,
    rows in SN order (rows of one input record may come from several producers).

    Each part is in order already and no SN occurs twice (a record is routed to one
    partition): a stable sort of the concatenation by the SN columns is the merge."""
    if not parts:
        raise ValueError("merge needs at least one part")
    item, depth = parts[0].item, parts[0].sns.shape[1]
    for part in parts:
        if part.item != item or part.sns.shape[1] != depth:
            raise ValueError(f"parts of one item share its SN and depth: {item}/{depth} and "
                             f"{part.item}/{part.sns.shape[1]}")
    if len(parts) == 1:
        return parts[0]
    sns = np.vstack([part.sns for part in parts])
    records = [record for part in parts for record in part.records]
    order = np.lexsort(sns.T[::-1])
    return Rows(item, sns[order], [records[i] for i in order])
