"""``TransformWithStateInPandas``: a per-key handler with state, on Arrow batches, as
PySpark 4's ``groupBy(...).transformWithStateInPandas`` runs one (DESIGN 5, 11).

One rule shapes it (docs/design/batches.md, "Columns"): items are cut anywhere and a
restart may cut them elsewhere, so a batch must give what its rows give one at a
time, and every output is numbered from the input row that caused it (DESIGN 4.1).
Two ways to call the handler keep that rule:

- ``calls="per row"`` (the default): ``handleInputRows`` gets one row at a time, in
  row order, and all it yields belongs to that row. Any processor written for PySpark
  runs unchanged (its micro-batch is one row); one pandas call per row.
- ``calls="per key"``: one call per key and batch with all that key's rows, the rows
  keeping their positions in the batch as their index; every output row's index must
  name the row it comes from (as ``MapInPandas``'s), and the handler must give what it
  would give one row at a time (a running count per row, not one count per call). The
  deploy check runs batches of uneven sizes against one-row batches and says so when
  a handler breaks it; an index not among the call's rows is refused at once.

With ``time_mode="EventTime"`` the rows carry their event time (``event_time``, a
column of int ms or timestamps) and the watermark is the largest event time seen by the
partition minus ``watermark_delay_ms``, advanced after each row, so it is the same at
every row whatever the cut. Rows go to the handler one at a time in row order; a row
older than the watermark is late and dropped (as PySpark drops it); after each row every
timer at or below the watermark fires (``handleExpiredTimer``), in (expiry, key) order,
its outputs that row's. The watermark is state too (under the key ``()``).

The state is a ``KeyedState`` (the key: a tuple of the key columns' values; the value:
the key's named states and timers), so catch-up moves it in parts and checkpoints take
only the changed keys (DESIGN 10).
"""
from __future__ import annotations

import warnings
from typing import Any, List, Sequence, Tuple

import numpy as np

from flux.keyed_state import KeyedOperator, KeyedState
from flux.stateful_processor import (
    TIMERS,
    ExpiredTimerInfo,
    KeyStates,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    _plain,
)
from flux.keys import HANDLER_WATERMARK
from flux.timer_index import TimerIndex

PER_ROW, PER_KEY = "per row", "per key"
TIME_MODES = ("None", "EventTime")
#: the store's key of the partition's watermark (a handler's keys have one value or more)
WATERMARK = HANDLER_WATERMARK


def _key(values: tuple) -> tuple:
    """A key as the store holds it: plain values, a null (None or NaN: pandas' view of
    a null) as None, so all of a null key's rows meet in one entry, as PySpark groups them."""
    return tuple(None if v is None or v != v else _plain(v) for v in values)


def _timers_of(key: Any, stored: Any) -> tuple:
    return tuple(stored.get(TIMERS) or ()) if key != WATERMARK and stored else ()


class TransformWithStateInPandas(KeyedOperator):
    """``processor`` (a ``StatefulProcessor``, or a function making one) per key of the
    ``key`` columns, its outputs in ``output_schema`` (a ``pyarrow.Schema``)."""

    def __init__(self, processor: Any, key: Any, output_schema: Any,
                 calls: str = PER_ROW, time_mode: str = "None",
                 event_time: Any = None, watermark_delay_ms: int = 0):
        import pyarrow as pa

        self.key: Tuple[str, ...] = (key,) if isinstance(key, str) else tuple(key)
        if not self.key or not all(isinstance(c, str) for c in self.key):
            raise ValueError(f"key must name columns (a str or a tuple of str), got {key!r}")
        if not isinstance(output_schema, pa.Schema):
            raise TypeError(f"output_schema must be a pyarrow.Schema, got "
                            f"{type(output_schema).__name__}")
        if calls not in (PER_ROW, PER_KEY):
            raise ValueError(f"calls is {PER_ROW!r} or {PER_KEY!r}, got {calls!r}")
        if time_mode not in TIME_MODES:
            raise NotImplementedError(f"time_mode {time_mode!r}: only {TIME_MODES} (processing "
                                      f"time is a clock replicas do not share, DESIGN 4.8)")
        self.event_time = event_time if time_mode == "EventTime" else None
        if time_mode == "EventTime":
            if not isinstance(event_time, str):
                raise ValueError("time_mode='EventTime' needs event_time=, the column of "
                                 "each row's event time (int ms or timestamps)")
            if calls != PER_ROW:
                raise ValueError("time_mode='EventTime' calls the handler per row (a timer "
                                 "fires between two rows): leave calls='per row'")
        self.watermark_delay_ms = int(watermark_delay_ms)
        self.output_schema, self.calls = output_schema, calls
        self.processor = processor() if not isinstance(processor, StatefulProcessor) \
            else processor
        if not isinstance(self.processor, StatefulProcessor):
            raise TypeError(f"processor must be a flux.StatefulProcessor (or make one), got "
                            f"{type(self.processor).__name__}")
        self.state = KeyedState()
        self._key_states = KeyStates()
        self._timers = TimerValues()
        self._index = TimerIndex(_timers_of)
        handle = StatefulProcessorHandle(self._key_states, event_time=self.event_time is not None)
        self.processor.init(handle)
        if not handle.declared:
            raise ValueError(f"{type(self.processor).__name__}.init declared no state: "
                             f"a stateless function is MapInPandas's")

    # -- the batch -----------------------------------------------------------------
    def process_arrow(self, batch: Any) -> tuple:
        import pyarrow as pa

        needed = self.key + ((self.event_time,) if self.event_time else ())
        missing = [c for c in needed if c not in batch.schema.names]
        if missing:
            raise KeyError(f"columns {missing} are not in the batch's columns "
                           f"{batch.schema.names}")
        frame = batch.to_pandas()
        rows: List[np.ndarray] = []
        outputs: List[Any] = []
        if self.event_time is not None:
            self._in_event_time(batch, frame, rows, outputs)
        else:
            for key, positions in self._groups(frame):
                self._load(key)
                if self.calls == PER_ROW:
                    for p in positions:
                        self._call(key, frame.iloc[p:p + 1], rows, outputs, row=int(p))
                else:
                    self._call(key, frame.iloc[positions], rows, outputs, row=None)
                self._store(key)
        if not outputs:
            return np.zeros(0, np.int64), pa.RecordBatch.from_pylist(
                [], schema=self.output_schema)
        return self._assemble(rows, outputs)

    def _in_event_time(self, batch: Any, frame: Any, rows: list, outputs: list) -> None:
        """Row by row: the handler (unless the row is late), the watermark, due timers."""
        times = self._event_times(batch)
        keys = [_key(row) for row in zip(*[frame[c].tolist() for c in self.key])]
        store, index = self.state, self._index
        index.follow(store)
        watermark = store.get(WATERMARK)
        for r, (key, at) in enumerate(zip(keys, times.tolist())):
            if watermark is None or at >= watermark:
                self._timers = TimerValues(watermark)
                self._load(key)
                self._call(key, frame.iloc[r:r + 1], rows, outputs, row=r)
                self._store(key)
            if watermark is None or at - self.watermark_delay_ms > watermark:
                watermark = at - self.watermark_delay_ms
            self._timers = TimerValues(watermark)
            for expiry, due in index.pop_due(watermark, store):
                self._load(due)
                self._key_states.put(TIMERS, tuple(
                    t for t in self._key_states.timers() if t != expiry) or None)
                out = self.processor.handleExpiredTimer(due, self._timers,
                                                        ExpiredTimerInfo(expiry))
                self._collect(out, rows, outputs, r, None)
                self._store(due)
        if watermark is not None and watermark != store.get(WATERMARK):
            store[WATERMARK] = watermark

    def _event_times(self, batch: Any) -> np.ndarray:
        import pyarrow as pa

        column = batch.column(self.event_time)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("ms"), safe=False).cast(pa.int64())
        elif not pa.types.is_integer(column.type):
            raise TypeError(f"event_time column {self.event_time!r} holds {column.type}: "
                            f"int ms or timestamps")
        if column.null_count:
            raise ValueError(f"event_time column {self.event_time!r} has a null at row "
                             f"{column.is_null().to_pylist().index(True)}")
        return column.to_numpy().astype(np.int64, copy=False)

    def _load(self, key: tuple) -> None:
        self._key_states.load(self.state.get(key))

    def _store(self, key: tuple) -> None:
        """The key's states back into the store, its new timers into the index."""
        states = self._key_states
        for expiry in states.registered:
            self._index.add(key, expiry)
        states.registered = []
        if states.changed:
            stored = states.stored()
            if stored is None:
                self.state.pop(key, None)
            else:
                self.state[key] = stored

    def _groups(self, frame: Any) -> List[Tuple[tuple, np.ndarray]]:
        """(key, its rows' positions), keys in the order of their first row."""
        groups = frame.groupby(list(self.key), sort=False, dropna=False).indices
        out = []
        for k, positions in groups.items():
            key = _key(k if isinstance(k, tuple) else (k,))
            out.append((key, np.asarray(positions, np.int64)))
        out.sort(key=lambda kp: kp[1][0])
        return out

    def _call(self, key: tuple, rows_frame: Any, rows: List[np.ndarray],
              outputs: List[Any], row: Any) -> None:
        yielded = self.processor.handleInputRows(key, iter([rows_frame]), self._timers)
        self._collect(yielded, rows, outputs, row, rows_frame)

    def _collect(self, yielded: Any, rows: List[np.ndarray], outputs: List[Any], row: Any,
                 rows_frame: Any) -> None:
        """A call's outputs, each with the row it comes from: ``row``, or (per key) the
        output's index, which must name one of ``rows_frame``'s rows."""
        import pandas as pd

        for out in yielded or ():
            if not isinstance(out, pd.DataFrame):
                raise TypeError(f"the handler must yield pandas DataFrames, got "
                                f"{type(out).__name__}")
            if not len(out):
                continue
            if row is not None:
                made_by = np.full(len(out), row, np.int64)
            else:
                made_by = np.asarray(out.index)
                if made_by.dtype.kind not in "iu" or not np.isin(
                        made_by, rows_frame.index.to_numpy()).all():
                    raise ValueError(
                        f"with calls='per key' each output row's index names the input "
                        f"row it comes from (one of {list(rows_frame.index)[:8]}...); got "
                        f"{list(out.index)[:8]}: keep the rows' index, or use "
                        f"calls='per row'")
                made_by = made_by.astype(np.int64)
            rows.append(made_by)
            outputs.append(out)

    def _assemble(self, rows: Sequence[np.ndarray], outputs: Sequence[Any]) -> tuple:
        """The outputs in the order of the rows that made them (one row's in the order
        they were yielded), as one batch of ``output_schema`` (one conversion for all:
        ~0.2 ms each)."""
        import pandas as pd
        import pyarrow as pa

        made_by = np.concatenate(rows)
        if len(outputs) == 1:
            frame = outputs[0]
        else:
            with warnings.catch_warnings():
                # pandas warns that it will stop ignoring all-null columns (a null key's)
                # when it infers a column's dtype; output_schema decides the types below
                # either way, so the inference pandas changes is not used
                warnings.filterwarnings("ignore", "The behavior of DataFrame concatenation",
                                        FutureWarning)
                frame = pd.concat(outputs, ignore_index=True)
        try:
            batch = pa.RecordBatch.from_pandas(frame, schema=self.output_schema,
                                               preserve_index=False)
        except (KeyError, pa.ArrowException, TypeError, ValueError) as exc:
            raise ValueError(f"the handler's outputs do not fit output_schema "
                             f"{self.output_schema}: {exc}") from exc
        order = np.argsort(made_by, kind="stable")
        return made_by[order], batch.take(pa.array(order))
