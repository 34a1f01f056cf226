"""The job's outputs into the user's sink, each once, across restarts (DESIGN 10).

The egress delivers outputs in SN order; after a restart it delivers again, with the
same SNs, what came after the restored checkpoint's cut. One writer decides what the
sink is handed: nothing at or below the last SN this driver handed it (a restart's
replay), and for an exactly-once sink (``flux.Sink``) nothing at or below what the sink
had committed before this driver started (its own ``committed()``, applied by the sink:
``CommitsBySN``). It commits at every checkpoint's cut and before a restart, and says
what the sink holds, so a restart can check that the input log still covers it.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional, Tuple

from flux.connector_api import ClosingSink, is_exactly_once

SN = Tuple[int, ...]


class OutputWriter:
    def __init__(self, sink: Optional[Callable[[Any], None]], keep_output: bool,
                 on_outputs: Callable[[List[SN]], None] = lambda sns: None):
        self.sink = sink
        self.exactly_once = is_exactly_once(sink)
        self.keep_output = keep_output
        #: the outputs so far, in order, when kept (``keep_output``)
        self.delivered: List[Any] = []
        #: per last-stage partition with an egress of its own (else all in 0): its last
        #: output handed, below which a restart's replay is dropped
        self._last_of: dict = {}
        self._on_outputs = on_outputs

    def deliver(self, items: Iterable[Tuple[SN, Any]], partition: int = 0) -> None:
        """Outputs from the egress (of ``partition``), in SN order: those not handed yet
        go to the sink."""
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
        self._on_outputs([sn for sn, _ in items])
        if self.exactly_once:
            self.sink.write(items)
        elif self.sink is not None:
            for item in items:
                self.sink(item)

    @property
    def last_sn(self) -> Optional[SN]:
        """The last output handed to the sink by this driver (of any partition)."""
        return max(self._last_of.values(), default=None)

    def commit(self) -> Optional[SN]:
        """Make what the sink was handed durable (an exactly-once sink commits; a callable
        has it already); returns the last SN the sink holds for certain."""
        if not self.exactly_once:
            return self.last_sn
        committed = self.sink.committed()
        if self.last_sn is not None and (committed is None or self.last_sn > committed):
            self.sink.commit(self.last_sn)
        return self.sink.committed()

    def holds(self) -> Optional[SN]:
        """The last SN the sink may hold: committed before this driver, or handed since."""
        have = [sn for sn in (self.last_sn, self.sink.committed() if self.exactly_once
                              else None) if sn is not None]
        return max(have) if have else None

    def close(self) -> None:
        if isinstance(self.sink, ClosingSink):  # a callable sink may have nothing to close
            self.sink.close()
