"""Sources the ingress pulls from: any iterable, or an external feed at a steady rate.

A plain iterable is read as fast as the dataflow takes it (back-pressure
simply slows the reading). A real feed (a network tap, a message bus
without replay) does not wait: ``RateLimited`` models one, where record k
arrives at ``k / rate`` seconds after the first pull, and what the ingress
has not taken when more than ``backlog`` records wait is dropped and
counted, as the feed would. A source yields ``NOT_YET`` when nothing has
arrived, so the ingress can go on with other work instead of blocking.
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Any, Callable, Deque, Iterable, Iterator, Optional, Sequence, Tuple


class _NotYet:
    def __repr__(self) -> str:
        return "NOT_YET"


#: yielded by a source when no record has arrived yet (it is not the end)
NOT_YET = _NotYet()
_END = object()


class RateLimited:
    """``records`` arriving at ``rate`` per second; a backlog beyond ``backlog`` records is
    dropped (the oldest first). ``arrival`` is when the record just returned arrived:
    end-to-end latency counts from there, queueing in front of the ingress included."""

    def __init__(self, records: Iterable[Any], rate: float, backlog: int = 100_000,
                 clock: Callable[[], float] = time.monotonic):
        if not rate > 0:
            raise ValueError(f"rate must be > 0 records per second, got {rate!r}")
        if backlog < 1:
            raise ValueError(f"backlog must be >= 1, got {backlog!r}")
        self.records: Iterator[Any] = iter(records)
        self.rate = float(rate)
        self.backlog = backlog
        self.clock = clock
        self.start: Optional[float] = None
        self.read = 0  # records that have arrived (read from the feed)
        self.dropped = 0
        self.ended = False
        self.waiting: Deque[Tuple[int, Any]] = deque()  # (arrival number, record)
        self.arrival: Optional[float] = None

    def __iter__(self) -> "RateLimited":
        return self

    def arrive(self) -> None:
        """Take in what has arrived by now, dropping what overflows the backlog: called by
        ``__next__``, and by the ingress while back-pressure keeps it from reading, so the
        drops are counted when they happen."""
        if self.start is None:
            return  # the feed starts at the first pull
        arrived = int((self.clock() - self.start) * self.rate) + 1  # record 0 at once
        while self.read < arrived and not self.ended:
            record = next(self.records, _END)
            if record is _END:
                self.ended = True
                break
            if len(self.waiting) == self.backlog:  # the feed's buffer overflows
                self.waiting.popleft()
                self.dropped += 1
            self.waiting.append((self.read, record))
            self.read += 1

    def __next__(self) -> Any:
        if self.start is None:
            self.start = self.clock()
        self.arrive()
        if not self.waiting:
            if self.ended:
                raise StopIteration
            return NOT_YET
        number, record = self.waiting.popleft()
        self.arrival = self.start + number / self.rate
        return record

    def peek(self, n: int) -> list:
        """The next ``n`` records of the feed, without taking them (nor making them arrive)."""
        ahead = list(itertools.islice(self.records, n))
        self.records = itertools.chain(ahead, self.records)
        return ahead

    def due_in(self) -> float:
        """Seconds until the next record arrives (0 if one is waiting)."""
        if self.start is None or self.waiting:
            return 0.0
        due = self.start + self.read / self.rate
        return max(0.0, due - self.clock())


class SequenceSource:
    """A sequence as a replayable ``Source`` (flux.connectors): its position is the
    number of records read, so a restart goes on at the same record (DESIGN 10)."""

    replay_order = "position"  # flux.connectors.BY_POSITION: a sequence reads alike

    def __init__(self, records: Sequence[Any]):
        self.records = records
        self.index = 0

    @property
    def position(self) -> int:
        return self.index

    def open(self, position: Any) -> None:
        if not isinstance(position, int) or not 0 <= position <= len(self.records):
            raise ValueError(f"not a position of a sequence of {len(self.records)} records: "
                             f"{position!r}")
        self.index = position

    def __iter__(self) -> "SequenceSource":
        return self

    def __next__(self) -> Any:
        if self.index >= len(self.records):
            raise StopIteration
        record = self.records[self.index]
        self.index += 1
        return record


class Paced:
    """A replayable ``Source`` read no faster than ``rate`` records per second (a steady
    feed that, unlike ``RateLimited``, waits and can be read again: what an experiment
    of restarts needs). Its position is the wrapped source's. Over a sequence, record
    ``i`` arrives at ``i / rate`` seconds after the first read whatever happens later:
    opened again at an earlier position (a restart), it reads what arrived meanwhile as
    fast as it is taken, and ``arrival`` (for latency) is when the record first arrived."""

    def __init__(self, source: Any, rate: float, clock: Callable[[], float] = time.monotonic,
                 then: Sequence[Tuple[int, float]] = ()):
        """``then``: ``(n, rate)`` steps, each the rate from the ``n``-th record on (a
        feed whose rate changes, as an autoscaling experiment wants)."""
        for n, r in then:
            if not r > 0:
                raise ValueError(f"rate must be > 0 records per second, got {r!r}")
        if not rate > 0:
            raise ValueError(f"rate must be > 0 records per second, got {rate!r}")
        if list(then) != sorted(then) or len({n for n, _ in then}) < len(then):
            raise ValueError(f"then must be (record, rate) steps in increasing records, "
                             f"got {then!r}")
        self.source = replayable(source)
        if self.source is None:
            raise ValueError(f"Paced needs a replayable source, got {type(source).__name__}")
        self.rate, self.clock = float(rate), clock
        self.then = tuple((int(n), float(r)) for n, r in then)
        self.start: Optional[float] = None
        self.read = 0

    @property
    def position(self) -> Any:
        return self.source.position

    @property
    def replay_order(self) -> str:
        """The wrapped source's (flux.connectors.replay_order_of): pacing changes when
        records are read, never their order."""
        from flux.connector_api import replay_order_of

        return replay_order_of(self.source)

    @property
    def last(self) -> Any:
        """The wrapped source's partition and offset of the record returned last (a
        source whose order is logged)."""
        return self.source.last

    def replay(self, partitions: Sequence[Any]) -> None:
        """Forwarded: after ``open``, the wrapped source replays this logged order."""
        self.source.replay(partitions)

    def open(self, position: Any) -> None:
        self.source.open(position)
        if isinstance(self.source, SequenceSource) and self.start is not None:
            self.read = position  # the schedule stands: record i arrives at start + i/rate
        else:
            self.start, self.read = None, 0  # the pace starts again at the next read

    def peek(self, n: int) -> list:
        """The next ``n`` records, without taking them or starting the pace."""
        return peek(self.source, n)[0]

    @property
    def arrival(self) -> Optional[float]:
        """When the record returned last arrived."""
        return None if self.start is None else self.start + self._offset(self.read - 1)

    def __iter__(self) -> "Paced":
        return self

    def __next__(self) -> Any:
        if self.start is None:
            self.start = self.clock()
        if self.due_in() > 0:
            return NOT_YET
        record = next(self.source)
        if record is not NOT_YET:
            self.read += 1
        return record

    def due_in(self) -> float:
        if self.start is None:
            return 0.0
        return max(0.0, self.start + self._offset(self.read) - self.clock())

    def _offset(self, i: int) -> float:
        """Seconds after the first read when record ``i`` (from 0) arrives."""
        seconds, at, rate = 0.0, 0, self.rate
        for n, next_rate in self.then:
            if i <= n:
                break
            seconds, at, rate = seconds + (n - at) / rate, n, next_rate
        return seconds + (i - at) / rate


def replayable(source: Any) -> Any:
    """``source`` as a ``Source`` that can be opened at a position (a sequence is wrapped),
    or None if it cannot be replayed (an iterator, a feed without positions)."""
    from flux.connector_api import Source

    if isinstance(source, Sequence):
        return SequenceSource(source)
    return source if isinstance(source, Source) else None


def peek(source: Any, n: int) -> Tuple[list, Any]:
    """Up to ``n`` first records of ``source`` (for the checks before deploying), and the
    source to use from now on: a sequence is sliced, a ``Source`` read and opened again
    where it was, an iterator read ahead and chained back."""
    from flux.connector_api import Source

    if isinstance(source, Sequence):
        return list(source[:n]), source
    if isinstance(source, (RateLimited, Paced)):
        return source.peek(n), source
    if isinstance(source, SequenceSource):
        return list(source.records[source.index:source.index + n]), source
    if isinstance(source, Source):
        start = source.position
        ahead = []
        for record in source:
            if record is NOT_YET:
                break  # nothing more has arrived: check what has
            ahead.append(record)
            if len(ahead) >= n:
                break
        source.open(start)
        return ahead, source
    it = iter(source)
    ahead = list(itertools.islice(it, n))
    return [r for r in ahead if r is not NOT_YET], itertools.chain(ahead, it)
