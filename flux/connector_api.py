"""What a replayable source and an exactly-once sink promise (DESIGN 10).

A ``Source`` is an iterator of records that can say where it is: ``position``
after the record it returned last, and ``open(position)`` to go on from there
after a restart, so every input is read again in the same order and gets the
same input SN. It yields ``NOT_YET`` (flux.connectors.sources) when nothing has
arrived, and ends with ``StopIteration``.

A ``Sink`` takes the outputs ``(sn, record)`` in SN order, ``write(items)``,
and makes everything written so far durable with ``commit(sn)``, atomically
with ``sn``; ``committed()`` reads that SN back after a restart, and the sink
drops every output whose SN is not above it: replay regenerates exactly those,
so the sink's content has no gap and no duplicate. A plain callable sink
(``sink(item)``) has no ``committed()``: it is at-least-once across restarts.
"""
from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import (Any, Callable, Iterable, Iterator, List, Optional, Protocol, Sequence,
                    Tuple, runtime_checkable)

SN = Tuple[int, ...]


#: ``Source.replay_order``: opened again at a position, the source gives the same records
#: in the same order (a file, a sequence, one Kafka partition): the position is enough
BY_POSITION = "position"
#: the order depends on arrival (partitions of its own interleaved as they come, Kafka's):
#: the ingress logs which partition each input came from before it leaves, and a restart
#: has the source replay that order (``PartitionedSource``: ``last`` and ``replay``)
LOGGED = "logged"
REPLAY_ORDERS = (BY_POSITION, LOGGED)


@runtime_checkable
class Source(Protocol):
    """Besides ``position`` and ``open``, a source a job checkpoints declares
    ``replay_order`` (``BY_POSITION`` or ``LOGGED``, a class attribute will do); a wrapper
    around a source forwards its ``replay_order``, and for ``LOGGED`` its ``last`` and
    ``replay`` too. It is not part of the ``isinstance`` check: ``replay_order_of`` asks
    for it, with an error saying what to declare."""

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
class PartitionedBatches(Protocol):
    """A ``PartitionedSource`` that hands over Arrow batches (``KafkaSource(schema=...)``):
    the input log needs the partition of every row, in the batch's order."""

    @property
    def last_rows(self) -> Sequence[Tuple[Any, int]]:
        """``(partition, offset)`` of each row of the batch returned last."""


@runtime_checkable
class SplitSource(Protocol):
    """A source split into parts that ingresses on the executors read, each split by a
    pair of ingresses of its own (DESIGN 12, docs/design/parallel_io.md): no input
    crosses the driver. It is pickled to the executors, so it holds only what pickles
    (lists, paths, a bootstrap string), never an open client.

    ``read_split(split, skip)`` gives split ``split``'s inputs (records, or Arrow batches
    whose rows are inputs) from its ``skip``-th on: the same inputs in the same order
    every time, as both replicas of a pair read it and a replica rebuilt on a standby
    reads on from where its twin was. It may yield ``NOT_YET`` when nothing has arrived."""

    def splits(self) -> int:
        """How many splits (two or more: each is numbered in epochs of its own)."""

    def read_split(self, split: int, skip: int) -> Iterator[Any]:
        """Split ``split``'s inputs after its first ``skip``."""


@runtime_checkable
class SplitReader(Protocol):
    """What ``read_split`` of a ``SeekableSplits`` returns: an iterator that knows where
    its split goes on after the input it returned last."""

    @property
    def position(self) -> Any:
        """Where the split goes on after the last input returned (JSON-able; Kafka: the
        offset after its record)."""


@runtime_checkable
class SeekableSplits(Protocol):
    """A ``SplitSource`` whose readers know their position (``SplitReader``) and that
    reads a split from one: a restart seeks to the position a checkpoint recorded beside
    the split's count, instead of reading the split again from its origin."""

    def read_split_from(self, split: int, position: Any, skip: int) -> Iterator[Any]:
        """Split ``split``'s inputs from ``position`` on, after the first ``skip`` of
        them."""


@runtime_checkable
class SplitOrigin(Protocol):
    """A ``SplitSource`` whose splits begin where it was made (Kafka: ``start="latest"``
    or the earliest offset kept, both moving): the counts a checkpoint and the splits'
    logs hold are counts from that origin, so a job run again at the same checkpoint
    location reads from the origin recorded by its first run (``at_origin``), as
    Structured Streaming's ``startingOffsets`` apply only to a new query."""

    def origin(self) -> Any:
        """Where each split begins (and ends, if it does), JSON-able."""

    def at_origin(self, origin: Any) -> "SplitOrigin":
        """The same source reading from ``origin`` (one ``origin()`` gave)."""


def replay_order_of(source: Any) -> str:
    """How a restart reads ``source`` again in the order it had (DESIGN 10): its declared
    ``replay_order``, checked; a source that declares none but replays a logged order
    (``last`` and ``replay``) is ``LOGGED`` (logging is always safe); anything else is
    refused (``SourceOrderUnknown``): the job cannot tell a source of one ordered stream
    from a wrapper that hides partitions interleaved by arrival."""
    from flux.errors import SourceOrderUnknown

    name = describe_source(source)
    try:
        order = getattr(source, "replay_order", None)
    except SourceOrderUnknown as exc:  # a wrapper asked the source it wraps
        raise SourceOrderUnknown(f"source {name} wraps a source whose replay order is "
                                 f"unknown: {exc}") from None
    if order is None:
        if isinstance(source, PartitionedSource):
            return LOGGED
        raise SourceOrderUnknown(
            f"checkpoint= needs to know how source {name} is read again in the same order "
            f"after a restart, and it declares no replay_order: set replay_order = "
            f"'{BY_POSITION}' on its class if, opened again at a position, it gives the same "
            f"records in the same order (a file, a sequence), or '{LOGGED}' if it interleaves "
            f"partitions of its own as they arrive (then it needs last and replay too: "
            f"flux.PartitionedSource); a wrapper forwards its inner source's replay_order, "
            f"last and replay (as flux.Paced does)")
    if order not in REPLAY_ORDERS:
        raise SourceOrderUnknown(f"source {name} declares replay_order {order!r}: it must be "
                                 f"one of {REPLAY_ORDERS}")
    if order == LOGGED and not isinstance(source, PartitionedSource):
        raise SourceOrderUnknown(
            f"source {name} declares replay_order '{LOGGED}' but has no last and replay: a "
            f"restart could not replay its logged order (a wrapper forwards them from its "
            f"inner source, flux.PartitionedSource)")
    return order


def describe_source(source: Any) -> str:
    """A source's class, with the sources it wraps (``Paced(KafkaSource)``), for errors."""
    inner = getattr(source, "source", None)
    name = type(source).__name__
    if inner is not None and inner is not source and isinstance(inner, Source):
        return f"{name}({describe_source(inner)})"
    return name


# -- what a source may also do: each capability the runtime uses, named -----------------

@runtime_checkable
class TimedSource(Protocol):
    """A feed that knows when the record it returned last arrived: end-to-end latency
    counts from there, queueing in front of the ingress included (``RateLimited``,
    ``Paced``)."""

    @property
    def arrival(self) -> Optional[float]: ...


@runtime_checkable
class WaitingSource(Protocol):
    """A source that says ``NOT_YET`` until a record is due, and when that will be, so the
    ingress sleeps until then instead of polling it (``RateLimited``, ``Paced``)."""

    def due_in(self) -> float: ...


@runtime_checkable
class DroppingSource(Protocol):
    """A feed that cannot wait (``RateLimited``): while back-pressure keeps the ingress
    from reading, ``arrive()`` lets what came meanwhile arrive, and what overflowed its
    backlog is counted in ``dropped``."""

    dropped: int

    def arrive(self) -> None: ...


@runtime_checkable
class OffsetReporting(Protocol):
    """A source that reports positions elsewhere (Kafka's consumer group, for lag
    monitoring): it hears each complete checkpoint's position, never one of inputs no
    checkpoint covers yet."""

    def commit_offsets(self, position: Any) -> None: ...


@runtime_checkable
class Sink(Protocol):
    def write(self, items: Iterable[Tuple[SN, Any]]) -> None: ...

    def commit(self, sn: SN) -> None: ...

    def committed(self) -> Optional[SN]: ...


@runtime_checkable
class ClosingSink(Protocol):
    """A sink that holds something to release when the job ends (a file, a producer): the
    driver calls ``close()`` once, after the last output; a plain callable has none."""

    def close(self) -> None: ...


def is_exactly_once(sink: Any) -> bool:
    """Does ``sink`` commit by SN (else a restart may repeat outputs)?"""
    return isinstance(sink, Sink)


#: set while a sink is opened only to read what it committed
_OPENED_TO_READ = contextvars.ContextVar("flux_sink_opened_to_read", default=False)


def opened_to_read() -> bool:
    """Is the sink being made now opened only to read what it committed? The driver asks
    what the sinks of a running job's writers on the executors hold (a drained rescale):
    such an open must neither fence the partition's writer (a Kafka ``init_transactions``,
    a ``FileSink`` epoch) nor clean up after it, and the sink is only asked
    ``committed()`` and closed. A sink of one's own whose open fences reads this too."""
    return _OPENED_TO_READ.get()


def _open_to_read(open: Callable[[int], Any], partition: int) -> Any:
    token = _OPENED_TO_READ.set(True)
    try:
        return open(partition)
    finally:
        _OPENED_TO_READ.reset(token)


class SinkPerPartition:
    """A sink of its own for every last-stage partition, for ``ordered_output=False``
    (docs/design/parallel_io.md): each partition's outputs come in SN order, but the
    partitions' outputs interleave, so an exactly-once sink, which drops every SN not above
    its last, takes one partition's only. ``open(partition)`` returns that partition's sink
    (an exactly-once ``Sink`` or a plain callable), called once per partition when the job
    starts; each commits at the checkpoints' cuts by itself and reads its own last SN back
    after a restart. ``open`` must give each partition a place of its own (a folder, a Delta
    ``app_id``, a Kafka ``transactional_id``) and the same one on every run."""

    def __init__(self, open: Callable[[int], Any]):
        if not callable(open):
            raise TypeError(f"SinkPerPartition takes a function of the partition, got "
                            f"{type(open).__name__}")
        self._open = open

    def open(self, partition: int) -> Any:
        sink = self._open(partition)
        if not callable(sink) and not is_exactly_once(sink):
            raise TypeError(f"SinkPerPartition: the sink of partition {partition} is a "
                            f"{type(sink).__name__}, neither a flux.Sink nor a callable")
        return sink

    def open_many(self, partitions: Iterable[int], to_read: bool = False) -> List[Any]:
        """The sinks of ``partitions``, in their order, opened at once (``open_at_once``);
        ``to_read``: only to read what they committed (``opened_to_read``)."""
        if to_read:
            return open_at_once(lambda p: _open_to_read(self.open, p), partitions)
        return open_at_once(self.open, partitions)


def open_at_once(open: Callable[[int], Any], partitions: Iterable[int]) -> List[Any]:
    """``open(p)`` for every partition, each on a thread of its own. A sink's open may
    wait for what the other partitions' sinks left open in a store they share, which
    only their own open ends: a Kafka transaction a crash left open holds every
    ``read_committed`` read of the state topic the sinks share until its transactional
    id starts again (or the broker's transaction timeout ends it). Opened one after the
    other, the first would wait for the next."""
    partitions = list(partitions)
    if len(partitions) < 2:
        return [open(p) for p in partitions]
    with ThreadPoolExecutor(len(partitions), thread_name_prefix="flux-sink-open") as pool:
        return list(pool.map(open, partitions))


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
