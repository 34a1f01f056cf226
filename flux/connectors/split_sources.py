"""Sources split into parts that ingresses on the executors read (``flux.SplitSource``,
DESIGN 12): records kept in lists, one list a split.

A split is read by both replicas of its pair of ingresses, and again from a count by a
replica rebuilt on a standby (``read_split(split, skip)``), so it must give the same
inputs in the same order every time; lists do. ``skip_inputs`` is what any split
source can do when it cannot seek: read and drop, counting the rows of Arrow batches.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

from exchange.partitioner import HashPartitioner
from exchange.rows import is_columnar
from flux.connectors.sources import Paced


def skip_inputs(inputs: Iterable[Any], skip: int) -> Iterator[Any]:
    """``inputs`` after the first ``skip`` (a batch's rows count one each: a batch that
    straddles the count is sliced)."""
    it = iter(inputs)
    while skip > 0:
        item = next(it, None)
        if item is None:
            return
        n = len(item) if is_columnar(item) else 1
        if n > skip:
            yield item[skip:]
            skip = 0
            break
        skip -= n
    yield from it


class ListSplits:
    """Records in ``splits`` lists (or any sequences), list k read by ingress k.

    ``ListSplits.by_key(records, n, key)`` deals records to ``n`` splits by a stable hash
    of ``key(record)``: every record of a key in one split, in the records' order, as a
    Kafka topic's keyed partitions hold them (a keyed operator's output per key is then
    the same whichever way the splits interleave)."""

    def __init__(self, splits: Sequence[Sequence[Any]], rate: Optional[float] = None):
        """``rate``: each split read no faster than this many records a second (a steady
        feed, ``flux.Paced``; it waits, it never drops: both replicas of a pair must read
        the same inputs); None: as fast as they are taken."""
        self.parts: List[Sequence[Any]] = [p if isinstance(p, Sequence) else list(p)
                                           for p in splits]
        if len(self.parts) < 2:
            raise ValueError(f"a split source has two or more splits, got {len(self.parts)} "
                             "(one: pass the records themselves, read by the driver's ingress)")
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be > 0 records per second, got {rate!r}")
        self.rate = rate

    @classmethod
    def by_key(cls, records: Iterable[Any], splits: int, key: Callable[[Any], Any],
               rate: Optional[float] = None) -> "ListSplits":
        route = HashPartitioner(splits, key_groups=None).router(key)
        parts: List[List[Any]] = [[] for _ in range(splits)]
        for record in records:
            parts[route(record)].append(record)
        return cls(parts, rate)

    def splits(self) -> int:
        return len(self.parts)

    def read_split(self, split: int, skip: int) -> Iterator[Any]:
        part = self.parts[split]
        if len(part) and is_columnar(part[0]):  # batches: their rows are inputs
            return skip_inputs(part, skip)
        return iter(part[skip:]) if self.rate is None else Paced(part[skip:], self.rate)

    def __len__(self) -> int:
        """Inputs in all (rows of batches counted one each)."""
        return sum(len(r) if is_columnar(r) else 1 for p in self.parts for r in p)

    def __repr__(self) -> str:
        return f"ListSplits({len(self.parts)} splits, {len(self)} inputs)"
