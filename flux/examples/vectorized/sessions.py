"""Session reconstruction on whole batches (``flux.examples.vectorized``)."""
from __future__ import annotations

from typing import Any, List, Optional

import numpy as np
import pyarrow as pa

from flux.examples.vectorized.columns import SESSION_SCHEMA, _column, _ints, _is_start, _is_string
from flux.examples.vectorized.rows import _Expiry, _group, _Groups
from flux.examples.vectorized.store import SlotStore
from flux.examples.vectorized.tables import _Strings
from flux.keyed_state import KeyedOperator


class SessionTable(SlotStore):
    """The open sessions: per ``(src, dst)`` the start's app (a code of ``apps``) and
    time; its values ``(app, ts_start)`` as ``SessionReconstruction`` keeps them."""

    def __init__(self) -> None:
        self.apps = _Strings()
        super().__init__(app=np.int64, ts=np.int64)

    def _values(self, slots: np.ndarray) -> list:
        return list(zip(self.apps.decode(self.cols["app"][slots]).tolist(),
                        self.cols["ts"][slots].tolist()))

    def _put(self, slots: np.ndarray, values: List[Any]) -> None:
        self.cols["app"][slots] = self.apps.python([value[0] for value in values])
        self.cols["ts"][slots] = np.array([value[1] for value in values], dtype=np.int64)


class VectorizedSessions(KeyedOperator):
    """``SessionReconstruction`` on whole batches (``ArrowOperator``), same outputs, same state.

    An "end" closes what the row before it of its key left: that row's session if
    it was a "start", nothing if it was an "end", the state's open session if it is
    the key's first row in the batch. The key's last row decides the state. With
    ``ttl``, an end whose start is more than ``ttl`` behind the watermark emits
    nothing, and the batch's last sweep drops what the per-record sweeps drop (an
    earlier one drops nothing the last would keep). The state is ``self.state``, a
    ``SessionTable``: a ``flux.KeyedStore`` with the twin's wire form."""

    def __init__(self, ttl: Optional[int] = None) -> None:
        """``ttl``: event-time units after which an open session expires (None: never)."""
        self.ttl = ttl
        self._expiry = _Expiry.of(ttl)
        self.state = SessionTable()

    def process_arrow(self, batch: pa.RecordBatch) -> tuple[np.ndarray, pa.RecordBatch]:
        src, dst = _column(batch, "src"), _column(batch, "dst")
        app_column, ts = _column(batch, "app"), _ints(batch, "ts")
        if not (_is_string(app_column.type) or pa.types.is_dictionary(app_column.type)):
            raise ValueError(f"column 'app' must be strings, got {app_column.type}")
        starts = _is_start(_column(batch, "kind"))
        table = self.state
        apps, n = table.apps.encode(app_column), len(ts)
        if n == 0:
            return np.zeros(0, dtype=np.int64), self._outputs(src, apps, apps, ts, ts)
        slots = table.slots(src, dst)
        groups = _group(slots, table.size)
        order = groups.order
        prev = np.full(n, -1, dtype=np.int64)  # the row before, of the same key
        prev[order[1:]] = np.where(groups.gid[1:] == groups.gid[:-1], order[:-1], -1)
        had, p = prev >= 0, np.maximum(prev, 0)
        is_open = np.where(had, starts[p], table.live[slots])
        start_app = np.where(had, apps[p], table.cols["app"][slots])
        start_ts = np.where(had, ts[p], table.cols["ts"][slots])
        emit = is_open & ~starts
        sweep = -1
        if self._expiry is not None:
            watermark, table.watermark, sweep = self._expiry.advance(ts, table.watermark)
            emit &= start_ts >= watermark - self._expiry.cut
        rows = np.flatnonzero(emit)
        self._keep(groups, starts, apps, ts, sweep)
        return rows, self._outputs(src, rows, start_app[rows], start_ts[rows], ts[rows])

    def _outputs(self, src: pa.Array, rows: np.ndarray, start_app: np.ndarray,
                 start_ts: np.ndarray, ends: np.ndarray) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [self.state.apps.take(start_app), src.take(pa.array(rows, type=pa.int64())),
             pa.array(ends - start_ts, type=pa.int64()), pa.array(ends, type=pa.int64())],
            names=SESSION_SCHEMA.names)

    def _keep(self, groups: _Groups, starts: np.ndarray, apps: np.ndarray, ts: np.ndarray,
              sweep: int) -> None:
        """The state after the batch: each key's last row opens or closes its session."""
        table, last = self.state, groups.last_rows
        opened = starts[last]
        kept = groups.slots[opened]
        table.mark(groups.slots)
        table.live[kept] = True
        table.live[groups.slots[~opened]] = False
        table.cols["app"][kept] = apps[last[opened]]
        table.cols["ts"][kept] = ts[last[opened]]
        if sweep >= 0:  # what started before the last sweep, more than ttl before it
            size = table.size
            doomed = table.live[:size] & (table.cols["ts"][:size] < ts[sweep] - self._expiry.cut)
            doomed[kept[last[opened] >= sweep]] = False
            table.live[:size] &= ~doomed
        table.compact()
