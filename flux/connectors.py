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

from typing import Any, Iterable, Iterator, Optional, Protocol, Tuple, runtime_checkable

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
class Sink(Protocol):
    def write(self, items: Iterable[Tuple[SN, Any]]) -> None: ...

    def commit(self, sn: SN) -> None: ...

    def committed(self) -> Optional[SN]: ...


def is_exactly_once(sink: Any) -> bool:
    """Does ``sink`` commit by SN (else a restart may repeat outputs)?"""
    return isinstance(sink, Sink)
