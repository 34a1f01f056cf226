"""The job's outputs into the user's sink, each once, across restarts (DESIGN 10).

The egress delivers outputs in SN order; after a restart it delivers again, with the
same SNs, what came after the restored checkpoint's cut. One writer decides what the
sink is handed: nothing at or below the last SN this driver handed it (a restart's
replay), and for an exactly-once sink (``flux.Sink``) nothing at or below what the sink
had committed before this driver started (its own ``committed()``, applied by the sink:
``CommitsBySN``). It commits at every checkpoint's cut and before a restart, and says
what the sink holds, so a restart can check that the input log still covers it.

With an egress per partition (``ordered_output=False``) all of this holds per partition:
each partition's outputs come in SN order, and a ``SinkPerPartition`` gives each its own
sink, committing at the cuts that partition's egress passes.
"""
from __future__ import annotations

import gc
from typing import Any, Callable, Iterable, List, Optional, Tuple

from flux.connector_api import ClosingSink, SinkPerPartition, is_exactly_once

SN = Tuple[int, ...]

#: kept outputs between two freezes of the collector (``OutputWriter._freeze_kept``)
FREEZE_EVERY = 100_000


class OutputWriter:
    def __init__(self, sink: Any, keep_output: bool,
                 on_outputs: Callable[[List[SN]], None] = lambda sns: None,
                 partitions: int = 1, on_executors: bool = False):
        """``sink``: a callable, an exactly-once ``Sink``, or a ``SinkPerPartition``, opened
        here for each of the ``partitions`` (an egress per partition). ``on_executors``:
        the egresses write the ``SinkPerPartition``'s sinks on the executors, and this
        driver opens them only to read what they hold (``holds``), never to write."""
        self.on_executors = on_executors
        self.per_partition, self.partitions = sink, partitions
        #: the sink of each partition (``SinkPerPartition``), else the one sink, in [0]
        self.sinks: List[Any] = [] if on_executors else (
            sink.open_many(range(partitions))
            if isinstance(sink, SinkPerPartition) else [sink])
        kinds = {is_exactly_once(s) for s in self.sinks} or {True}
        if len(kinds) > 1:
            raise TypeError("SinkPerPartition opened exactly-once sinks for some partitions "
                            "and plain callables for others: a restart could repeat outputs "
                            "of some and not of others")
        self.exactly_once = kinds == {True}
        self.keep_output = keep_output
        #: the outputs so far, in order, when kept (``keep_output``)
        self.delivered: List[Any] = []
        self._frozen_at = 0
        #: per last-stage partition with an egress of its own (else all in 0): its last
        #: output handed, below which a restart's replay is dropped
        self._last_of: dict = {}
        self._on_outputs = on_outputs

    def _sink_of(self, partition: int) -> Any:
        return self.sinks[partition if len(self.sinks) > 1 else 0]

    def deliver(self, items: Iterable[Tuple[SN, Any]], partition: int = 0) -> None:
        """Outputs from the egress (of ``partition``), in SN order: those not handed yet
        go to the sink (of that partition)."""
        items = tuple(items)
        if not items:
            return
        last = self._last_of.get(partition)
        if last is not None and tuple(items[0][0]) <= last:
            # after a restart: given to the sink already
            items = tuple(it for it in items if tuple(it[0]) > last)
            if not items:
                return
        self._last_of[partition] = tuple(items[-1][0])
        if self.keep_output:
            self.delivered.extend(items)
            if len(self.delivered) - self._frozen_at >= FREEZE_EVERY:
                self._freeze_kept()
        self._on_outputs([sn for sn, _ in items])
        sink = self._sink_of(partition)
        if self.exactly_once:
            sink.write(items)
        elif sink is not None:
            for item in items:
                sink(item)

    def _freeze_kept(self) -> None:
        """The outputs kept so far out of the collector's way (``gc.freeze``): they live as
        long as the job. Millions of them (msgpack's lists: containers it tracks) made
        every full collection walk them all: 1.7-2.5 s each, mid-run, with 5M kept, the
        controller's thread (in this interpreter) not turning meanwhile, nodes losing
        its lease. Freezing costs nothing per output; what else is alive then and later
        becomes a cycle of garbage stays (a few objects a freeze)."""
        gc.freeze()
        self._frozen_at = len(self.delivered)

    @property
    def last_sn(self) -> Optional[SN]:
        """The last output handed to the sink by this driver (of any partition)."""
        return max(self._last_of.values(), default=None)

    def commit(self, partition: Optional[int] = None) -> Optional[SN]:
        """Make what the sink (of ``partition``; None: every one) was handed durable (an
        exactly-once sink commits; a callable has it already); returns the last SN it
        holds for certain (of every partition: the largest)."""
        parts = range(len(self.sinks)) if partition is None else (partition,)
        if not self.exactly_once:
            have = self._last_of.values() if partition is None else [
                self._last_of.get(partition)]
            return max((sn for sn in have if sn is not None), default=None)
        done = []
        for p in parts:
            sink, last = self._sink_of(p), self._last_of.get(p)
            committed = sink.committed()
            if last is not None and (committed is None or last > committed):
                sink.commit(last)
            done.append(sink.committed())
        return max((sn for sn in done if sn is not None), default=None)

    def holds(self, writers_running: bool = False) -> Optional[SN]:
        """The last SN the sink may hold: committed before this driver, or handed since;
        with the egresses on the executors, what the sinks committed, read now. With
        ``writers_running`` (a drained rescale) each is opened only to read
        (``opened_to_read``), fencing no writer; at the job's start and at a restart no
        writer runs, and an open as a writer's also ends what a crashed one left open (a
        Kafka transaction, which holds every read of the state topic until it times
        out)."""
        if self.on_executors:
            have = []
            for sink in self.per_partition.open_many(range(self.partitions),
                                                     to_read=writers_running):
                have.append(sink.committed())
                if isinstance(sink, ClosingSink):
                    sink.close()
            return max((sn for sn in have if sn is not None), default=None)
        have = [self.last_sn] + ([s.committed() for s in self.sinks] if self.exactly_once
                                 else [])
        return max((sn for sn in have if sn is not None), default=None)

    def rescaled(self, partitions: int) -> None:
        """The job goes on at ``partitions`` (a drained rescale, DESIGN 13): a sink for each
        new partition. The sinks of partitions it no longer has stay open and counted in
        ``holds``: they hold the outputs up to the rescale's cut."""
        if isinstance(self.per_partition, SinkPerPartition) and not self.on_executors:
            self.sinks.extend(self.per_partition.open_many(range(len(self.sinks), partitions)))
        self.partitions = max(self.partitions, partitions)

    def close(self) -> None:
        for sink in self.sinks:
            if isinstance(sink, ClosingSink):  # a callable sink may have nothing to close
                sink.close()
