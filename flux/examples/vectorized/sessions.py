"""Session reconstruction on whole batches (``flux.examples.vectorized``)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from flux.examples.vectorized.columns import SESSION_SCHEMA, _column, _ints, _is_start, _is_string
from flux.examples.vectorized.rows import _Expiry, _group, _Groups
from flux.examples.vectorized.tables import _keyed_pairs, _Slots, _snapshot, _Strings


class VectorizedSessions:
    """``SessionReconstruction`` on whole batches (``ArrowOperator``), same outputs, same state.

    An "end" closes what the row before it of its key left: that row's session if
    it was a "start", nothing if it was an "end", the state's open session if it is
    the key's first row in the batch. The key's last row decides the state. With
    ``ttl``, an end whose start is more than ``ttl`` behind the watermark emits
    nothing, and the batch's last sweep drops what the per-record sweeps drop (an
    earlier one drops nothing the last would keep)."""

    def __init__(self, ttl: Optional[int] = None) -> None:
        """``ttl``: event-time units after which an open session expires (None: never)."""
        self.ttl = ttl
        self._expiry = _Expiry.of(ttl)
        self.apps = _Strings()
        self.table = _Slots(app=np.int64, ts=np.int64)
        self.watermark: Optional[tuple] = None  # the per-record state's (-inf,) entry

    def process_arrow(self, batch: pa.RecordBatch) -> tuple[np.ndarray, pa.RecordBatch]:
        src, dst = _column(batch, "src"), _column(batch, "dst")
        app_column, ts = _column(batch, "app"), _ints(batch, "ts")
        if not (_is_string(app_column.type) or pa.types.is_dictionary(app_column.type)):
            raise ValueError(f"column 'app' must be strings, got {app_column.type}")
        starts = _is_start(_column(batch, "kind"))
        apps, n = self.apps.encode(app_column), len(ts)
        if n == 0:
            return np.zeros(0, dtype=np.int64), self._outputs(src, apps, apps, ts, ts)
        table = self.table
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
            watermark, self.watermark, sweep = self._expiry.advance(ts, self.watermark)
            emit &= start_ts >= watermark - self._expiry.cut
        rows = np.flatnonzero(emit)
        self._keep(groups, starts, apps, ts, sweep)
        return rows, self._outputs(src, rows, start_app[rows], start_ts[rows], ts[rows])

    def _outputs(self, src: pa.Array, rows: np.ndarray, start_app: np.ndarray,
                 start_ts: np.ndarray, ends: np.ndarray) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [self.apps.take(start_app), src.take(pa.array(rows, type=pa.int64())),
             pa.array(ends - start_ts, type=pa.int64()), pa.array(ends, type=pa.int64())],
            names=SESSION_SCHEMA.names)

    def _keep(self, groups: _Groups, starts: np.ndarray, apps: np.ndarray, ts: np.ndarray,
              sweep: int) -> None:
        """The state after the batch: each key's last row opens or closes its session."""
        table, last = self.table, groups.last_rows
        opened = starts[last]
        kept = groups.slots[opened]
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

    def get_state(self) -> list:
        """What ``SessionReconstruction.get_state()`` gives: sorted
        ``[(src, dst), (app, ts_start)]`` pairs, and the watermark's with a ttl."""
        table = self.table
        live = table.live_slots()
        values = zip(self.apps.decode(table.cols["app"][live]).tolist(),
                     table.cols["ts"][live].tolist())
        return _snapshot(table.keys(live), list(values), self.watermark)

    def install_state(self, state: Optional[list]) -> None:
        keys, apps, ts = [], [], []
        pairs, self.watermark = _keyed_pairs(state)
        for key, value in pairs:
            keys.append(key)
            apps.append(value[0])
            ts.append(value[1])
        self.table.install(keys, {"app": self.apps.python(apps), "ts": ts})
