"""The driver's side of the ingress process (DESIGN 4.7 and 10).

The source stays in the driver (it may be a generator; a Kafka consumer's
group lives there) and this thread alone reads it, as the ingress's thread
did: records in order, each timed when it arrives, at most ``window`` ahead
of what the ingress process accepted (back-pressure: a full partition's
buffer there stops the reading here; a feed that cannot wait counts its
drops). A source with partitions of its own has each input's partition made
durable in the input log before the input is handed over, so nothing leaves
the driver unlogged (DESIGN 10); inputs an earlier run logged are handed
over at once, in the logged order the source replays. A checkpoint's cut is
chosen here, between two handed-over inputs, with the source's position
after the last of them; it travels to the ingress process in order with the
records, and the ingress cuts its batches there.
"""
from __future__ import annotations

import math
import sys
import time
from collections import deque
from typing import Any, Deque, List, Optional, Tuple

from flux.runtime.ingress_process import (
    ACCEPTED,
    CUT,
    END,
    FAILED,
    RECORDS,
    STATS,
    IngressProcess,
)
from flux.connector_api import (
    DroppingSource,
    PartitionedBatches,
    Source,
    TimedSource,
    WaitingSource,
)
from flux.connectors.sources import NOT_YET
from flux.errors import DataflowError

#: records handed over ahead of what the ingress accepted: enough to cover the round trip
#: to the process at full rate, few enough to keep the feed's queue short
FEED_WINDOW = 2048
#: records read from the source at most in one step
READ_LIMIT = 1000


class IngressFeed:
    """Reads the source, logs, and hands the records to the ingress process."""

    def __init__(self, process: IngressProcess, source, metrics=None, accepted: int = 0,
                 input_log=None, logged_before: int = 0, window: int = FEED_WINDOW):
        """``accepted``: the inputs before the source's next one (a restart's cut);
        ``input_log``: an ``InputLogWriter`` for a source with partitions of its own;
        ``logged_before``: the last input an earlier run logged (replayed in that order)."""
        self.process, self.source, self.metrics = process, source, metrics
        self.window = window
        #: input numbers: the last read from the source, handed over, accepted there
        self.read = self.handed = self.accepted = accepted
        #: the source's position after the last input handed over (what a cut records)
        self._placed = isinstance(source, Source)
        self.position: Any = source.position if self._placed else None
        self.source_done = False  # the source has no more: ``read`` is the last input
        #: a drained rescale's (DESIGN 13): the source is read no further once ``read``
        #: reaches this input (None: read on)
        self.hold_from: Optional[int] = None
        self.stats = None  # the ingress's counters, as it last reported them
        #: the last view the ingress process applied whole, as it last reported it
        self.view = 0
        self.last_cut: Optional[int] = None  # the input the last checkpoint's cut follows
        self.input_log, self.logged_before = input_log, logged_before
        self._submitted = accepted  # the last input given to the log's writer
        #: read and waiting for the log: [first input, runs, partitions, position after,
        #: inputs]
        self._unlogged: Deque[list] = deque()
        self._ended = False  # END was sent
        self._source_waits_until = 0.0
        self._timed = isinstance(source, TimedSource)
        self._waits = isinstance(source, WaitingSource)
        self._drops = isinstance(source, DroppingSource)
        #: a logged source's batches name each row's partition (``last_rows``)
        self._row_partitions = isinstance(source, PartitionedBatches)
        self._checked = time.monotonic()

    # -- one step of the driver's thread -------------------------------------------
    def step(self, timeout_ms: int = 5) -> None:
        """Hear the process, read and hand over what the window allows, log; wait up to
        ``timeout_ms`` for the process when nothing could move."""
        self._hear(0)
        moved = self._read()
        if self.input_log is not None:
            moved |= self._log()
        if self.source_done and not self._unlogged and not self._ended:
            self._ended = True
            self.process.send(END)
        if not moved:
            wait = timeout_ms
            if self.input_log is not None and self.input_log.busy:
                wait = min(wait, 1)
            if self._source_waits_until:  # rounded up: never a spin until the next one
                wait = min(wait, max(1, math.ceil((self._source_waits_until - time.monotonic())
                                                  * 1000)))
            self._hear(wait)
        now = time.monotonic()
        if now - self._checked >= 0.1:
            self._checked = now
            if self.process.exit_code() is not None:
                self._hear(0)  # its last word first, if it said one
                self.process.check_alive()

    def _hear(self, timeout_ms: int) -> None:
        for msg in self.process.receive(timeout_ms):
            kind = msg[0]
            if kind == ACCEPTED:
                self.accepted = msg[1]
            elif kind == STATS:
                self.stats, self.view = msg[1], msg[2]
            elif kind == FAILED:  # the user's error as itself, anything else as its text
                raise msg[1] if isinstance(msg[1], BaseException) else RuntimeError(msg[1])

    def _read(self) -> bool:
        if self.source_done or self.hold_from is not None and self.read >= self.hold_from:
            return False
        source = self.source
        room = self.window - (self.read - self.accepted)
        if room <= 0:
            if self._drops:
                source.arrive()  # a feed that cannot wait drops meanwhile: count it now
            self._dropped()
            return False
        limit = min(room, READ_LIMIT)
        if self.read < self.logged_before:  # replayed inputs apart from new ones
            limit = min(limit, self.logged_before - self.read)
        arrivals: List[Optional[float]] = []
        parts: List[Any] = []
        logs, timed = self.input_log is not None, self._timed
        self._source_waits_until = 0.0
        count = 0  # inputs read: a columnar source's batch is as many as its rows
        #: lists of records and batches of inputs as columns, in order
        runs: List[Any] = []
        arrow = sys.modules.get("pyarrow")  # no batch is one where it was never imported
        batch_type = arrow.RecordBatch if arrow is not None else ()
        while count < limit:
            record = next(source, None)
            if record is NOT_YET:
                self._source_waits_until = time.monotonic() + (
                    source.due_in() if self._waits else 0.001)
                break
            if record is None:
                self.source_done = True
                break
            if isinstance(record, batch_type):  # a columnar source's: a run of inputs
                n = len(record)
                if logs:  # its partitions' interleaving is logged per input, a row each
                    if not self._row_partitions:
                        raise DataflowError(
                            f"source {type(source).__name__} interleaves partitions of its "
                            f"own and hands over Arrow batches, but does not say each row's "
                            f"partition (last_rows, flux.connector_api.PartitionedBatches)")
                    rows = source.last_rows
                    if len(rows) != n:
                        raise DataflowError(f"source {type(source).__name__} named the "
                                            f"partitions of {len(rows)} rows of a batch of {n}")
                    parts.extend(p for p, _ in rows)
                if n:  # an empty batch holds no input
                    runs.append(record)
                    count += n
                    arrivals.extend([source.arrival if timed else None] * n)
                continue
            if not runs or not isinstance(runs[-1], list):
                runs.append([])
            runs[-1].append(record)
            count += 1
            arrivals.append(source.arrival if timed else None)
            if logs:
                parts.append(source.last[0])
        self._dropped()
        if not runs:
            return self.source_done
        if self.metrics is not None:
            self.metrics.inputs_taken(arrivals)
        first = self.read + 1
        self.read += count
        position = source.position if self._placed else None
        if logs and first > self.logged_before:
            self._unlogged.append([first, runs, parts, position, count])
        else:
            self._hand_over(runs, position, count)
        return True

    def _dropped(self) -> None:
        if self.metrics is not None and self._drops:
            self.metrics.inputs_dropped(self.source.dropped)

    def _log(self) -> bool:
        """What the writer made durable is handed over; what was read since goes to the
        writer (one append at a time, DESIGN 10)."""
        writer, moved = self.input_log, False
        last = writer.done()
        if last is not None:
            while self._unlogged and self._unlogged[0][0] + self._unlogged[0][4] - 1 <= last:
                _, runs, _, position, count = self._unlogged.popleft()
                self._hand_over(runs, position, count)
                moved = True
        if not writer.busy:
            todo = [c for c in self._unlogged if c[0] > self._submitted]
            if todo:
                writer.submit(todo[0][0], [p for c in todo for p in c[2]])
                self._submitted = todo[-1][0] + todo[-1][4] - 1
                moved = True
        return moved

    def _hand_over(self, runs: List[Any], position: Any, count: int) -> None:
        """``runs``: lists of records and batches of inputs as columns (pickled as Arrow
        buffers), ``count`` inputs in all."""
        self.process.send(RECORDS, runs)
        self.handed += count
        self.position = position

    # -- checkpoints ---------------------------------------------------------------
    def has_new_inputs(self) -> bool:
        """Did inputs come since the last cut (or is there none yet)?"""
        return self.last_cut is None or self.handed != self.last_cut

    def drained(self) -> bool:
        """Held (``hold_from``) and everything read was handed over: a cut now is after
        the last input this attempt gives."""
        held = self.source_done or self.hold_from is not None and self.read >= self.hold_from
        return held and self.handed == self.read

    def choose_cut(self, number: int, moves=()) -> Tuple[int, Any]:
        """Checkpoint ``number`` covers every input handed over so far: its cut and the
        source's position after it (DESIGN 10). The ingress cuts its batches there, and
        the cut carries the live ``moves`` of key groups (``GroupMove``s, DESIGN 13)."""
        self.process.send(CUT, number, *([[m.to_wire() for m in moves]] if moves else []))
        self.last_cut = self.handed
        return self.handed, self.position
