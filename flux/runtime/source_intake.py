"""What the ingress's process takes from its source, and why it stops taking.

The ingress accepts records in order until a partition's buffer is full
(back-pressure, paper 3.1.2): the record it refused is kept and offered
first next time, and only an ack (a message, which wakes the poll) can make
room, so the loop waits for it rather than spin. A source that says
``NOT_YET`` is asked again when it says a record is due. What the source can
do (hand over runs, time arrivals, wait, drop) is asked once, here.
"""
from __future__ import annotations

from typing import Any, Iterator, List, Optional, Protocol, runtime_checkable

from flux.connector_api import DroppingSource, TimedSource, WaitingSource
from flux.connectors.sources import NOT_YET
from exchange.rows import is_columnar
from flux.runtime.metrics import Metrics


@runtime_checkable
class RunSource(Protocol):
    """A source that hands records over in runs (the ingress process's feed,
    ``flux.runtime.ingress_process.FeedSource``): taken a run at a time, what
    back-pressure holds put back first; ``finished`` once none will come."""

    finished: bool

    def take(self, limit: int) -> List[Any]: ...

    def put_back(self, records: List[Any]) -> None: ...


class SourceIntake:
    """The source of the ingress's process, the record the ingress refused, and
    whether taking more now could help."""

    def __init__(self, source: Optional[Iterator[Any]], metrics: Optional[Metrics] = None):
        self.source = source
        self.metrics = metrics
        # what the source can do, asked once: a protocol's isinstance reads every member
        self._runs = isinstance(source, RunSource)
        self._timed = isinstance(source, TimedSource)
        self._waits = isinstance(source, WaitingSource)
        self._drops = isinstance(source, DroppingSource)
        self._next_record: Any = None
        #: records taken from the source, not yet accepted (``_feed_gathered``)
        self._gathered: List[Any] = []
        self._next_arrival: Optional[float] = None
        self.waiting = False  # the source said NOT_YET: idle a little, do not spin
        #: the ingress refused the next input (a full buffer): only an ack, which comes as
        #: a message and wakes the poll, can make room; waiting for it, not spinning, leaves
        #: the core to the nodes that will send it
        self.held_back = False
        self.done = source is None

    def ready(self) -> bool:
        """Could taking from the source now move anything?"""
        return not (self.done or self.waiting or self.held_back)

    def drained(self) -> bool:
        """Did the ingress accept everything read from the source so far (so the source's
        position is that of the last input accepted)?"""
        return self._next_record is None and not self._gathered

    def due_in(self) -> Optional[float]:
        """Seconds until a waiting source has its next record (None: not waiting)."""
        return self.source.due_in() if self.waiting and self._waits else None

    def feed(self, ingress, limit: int = 1000) -> bool:
        """The ingress accepts up to ``limit`` records; did it accept any?"""
        self.waiting = self.held_back = False
        if self._runs:
            return self._feed_run(ingress, limit)
        if not (self._timed or self._drops):
            return self._feed_gathered(ingress, limit)
        source = self.source
        timed = self._timed
        accept = ingress.accept
        arrivals: List[Optional[float]] = []
        for _ in range(limit):
            if self._next_record is None:
                record = next(source, None)
                if record is NOT_YET:
                    self.waiting = True
                    break
                if record is None:
                    self.done = True
                    break
                self._next_record = record
                self._next_arrival = source.arrival if timed else None
            if is_columnar(self._next_record):  # a batch of inputs as columns
                if not self._accept_batch(ingress, arrivals):
                    break
                continue
            if accept(self._next_record) is None:
                if self._drops:
                    source.arrive()  # a feed that cannot wait drops meanwhile: count it now
                self.held_back = True
                break  # back-pressure: that partition's buffer is full
            self._next_record = None
            arrivals.append(self._next_arrival)
        if self.metrics is not None:
            self.metrics.inputs_taken(arrivals)
            if self._drops:
                self.metrics.inputs_dropped(source.dropped)
        return bool(arrivals)

    def _feed_gathered(self, ingress, limit: int) -> bool:
        """A source whose records need no arrival time and drop nothing (a split read on
        an executor, an iterable): the records at hand gathered into a run, accepted in
        one call (``accept`` per record pays a call, a list and the item's checks per
        input); what back-pressure refuses waits, first, for the next call. A batch of inputs as
        columns is accepted as it is."""
        source, run = self.source, self._gathered
        while len(run) < limit and not is_columnar(self._next_record):
            record = next(source, None)
            if record is NOT_YET:
                self.waiting = True
                break
            if record is None:
                self.done = not run
                break
            if is_columnar(record):
                self._next_record = record  # after the run's records, in order
                break
            run.append(record)
        taken = 0
        if run:
            taken = ingress.accept_many(run)
            del run[:taken]
            if run:  # back-pressure: that partition's buffer is full
                self.held_back = True
                return taken > 0
        if self._next_record is not None:
            rows: List[Optional[float]] = []
            self._accept_batch(ingress, rows)
            taken += len(rows)
        if self.metrics is not None and taken:
            self.metrics.inputs_taken([None] * taken)
        return taken > 0

    def _accept_batch(self, ingress, arrivals: List[Optional[float]]) -> bool:
        """The ingress accepts what it can of a columnar source's batch (its rows are
        inputs, arrived together); the rest waits. Did it take it all?"""
        batch = self._next_record
        n = ingress.accept_many(batch)
        arrivals.extend([self._next_arrival] * n)
        if n < len(batch):
            self._next_record = batch[n:]
            self.held_back = True
            return False
        self._next_record = None
        return True

    def _feed_run(self, ingress, limit: int) -> bool:
        """A source that hands records over in runs (the ingress process's feed, which
        keeps no arrival times, positions or partitions: the driver's feed has those):
        the ingress accepts a run in one call; what back-pressure holds goes back."""
        source = self.source
        records = source.take(limit)
        if not records:
            if source.finished:
                self.done = True
            else:
                self.waiting = True
            return False
        n = ingress.accept_many(records)
        if n < len(records):
            source.put_back(records[n:])  # back-pressure: that partition's buffer is full
            self.held_back = True
        return n > 0
