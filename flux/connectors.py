"""What a replayable source and an exactly-once sink promise (DESIGN 10).

A ``Source`` is an iterator of records that can say where it is: ``position``
after the record it returned last, and ``open(position)`` to go on from there
after a restart, so every input is read again in the same order and gets the
same input SN. It yields ``NOT_YET`` (flux.runtime.sources) when nothing has
arrived, and ends with ``StopIteration``.

A ``Sink`` takes the outputs ``(sn, record)`` in SN order, ``write(items)``,
and makes everything written so far durable with ``commit(sn)``, atomically
with ``sn``; ``committed()`` reads that SN back after a restart, and the sink
drops every output whose SN is not above it: replay regenerates exactly those,
so the sink's content has no gap and no duplicate. A plain callable sink
(``sink(item)``) has no ``committed()``: it is at-least-once across restarts.
"""
from __future__ import annotations

from typing import (Any, Iterable, Iterator, Optional, Protocol, Sequence, Tuple,
                    runtime_checkable)

SN = Tuple[int, ...]


@runtime_checkable
class Source(Protocol):
    def __iter__(self) -> Iterator[Any]: ...

    def __next__(self) -> Any: ...

    @property
    def position(self) -> Any:
        """Where the next read starts (JSON-able): after the record returned last."""

    def open(self, position: Any) -> None:
        """Go on from ``position`` (one ``position`` returned earlier)."""


@runtime_checkable
class PartitionedSource(Source, Protocol):
    """A source that interleaves partitions of its own (Kafka's): its order is not
    repeatable, so the ingress logs which partition each input came from before the
    input leaves, and a restart hands that order back (DESIGN 10, the input log)."""

    @property
    def last(self) -> Tuple[Any, int]:
        """``(partition, offset)`` of the record returned last."""

    def replay(self, partitions: Sequence[Any]) -> None:
        """After ``open``: the next records come from ``partitions``, in this order."""


@runtime_checkable
class Sink(Protocol):
    def write(self, items: Iterable[Tuple[SN, Any]]) -> None: ...

    def commit(self, sn: SN) -> None: ...

    def committed(self) -> Optional[SN]: ...


def is_exactly_once(sink: Any) -> bool:
    """Does ``sink`` commit by SN (else a restart may repeat outputs)?"""
    return isinstance(sink, Sink)


class CommitsBySN:
    """The part every exactly-once sink shares: outputs wait in ``pending`` until
    ``commit(sn)`` hands them to ``_commit(rows, sn)`` (the sink's one atomic write), and
    outputs whose SN is not above the committed one are dropped (counted in ``skipped``).
    It commits by itself every ``commit_every`` outputs (committing more often than asked
    is always safe: a replay regenerates the same SNs), and at ``close``; it is also a
    plain sink (``sink(item)``)."""

    name = "sink"

    def __init__(self, committed: Optional[SN], commit_every: int):
        if commit_every < 1:
            raise ValueError(f"{self.name}: commit_every must be >= 1, got {commit_every!r}")
        self.commit_every = commit_every
        self._committed = committed
        self.pending: list = []
        self.skipped = 0

    def committed(self) -> Optional[SN]:
        return self._committed

    def write(self, items: Iterable[Tuple[SN, Any]]) -> None:
        from flux.operator import wire_form

        last = self._committed
        for sn, record in items:
            sn = tuple(sn)
            if last is not None and sn <= last:
                self.skipped += 1
                continue
            self.pending.append((sn, wire_form(record)))
        if len(self.pending) >= self.commit_every:  # memory stays bounded between cuts
            self.commit(self.pending[-1][0])

    def commit(self, sn: SN) -> None:
        """Make every output written so far durable, with ``sn`` as the last committed."""
        sn = tuple(sn)
        if self._committed is not None and sn < self._committed:
            raise ValueError(f"{self.name}: commit of {sn} after {self._committed}")
        if self.pending and self.pending[-1][0] > sn:
            raise ValueError(f"{self.name}: commit of {sn} with output {self.pending[-1][0]} "
                             f"written")
        self._commit(self.pending, sn)
        self._committed, self.pending = sn, []

    def _commit(self, rows: list, sn: SN) -> None:
        raise NotImplementedError

    def __call__(self, item: Tuple[SN, Any]) -> None:
        self.write([item])

    def close(self) -> None:
        if self.pending:
            self.commit(self.pending[-1][0])

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
