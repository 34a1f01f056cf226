"""Windowed duration statistics on whole batches (``flux.examples.vectorized``)."""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence

import numpy as np
import pyarrow as pa

from flux.examples.stats import DEFAULT_WINDOW
from flux.examples.vectorized.columns import STATS_SCHEMA, _column, _ints, _is_string
from flux.examples.vectorized.rows import _Expiry, _first_reaching, _group, _Groups, _running_max
from flux.examples.vectorized.store import SlotStore
from flux.examples.vectorized.tables import _grown
from flux.keyed_state import KeyedOperator

_I64_MIN = np.iinfo(np.int64).min
#: the stats' windows are rebuilt once their garbage outweighs the live entries and this
_COMPACT_ENTRIES = 65536
_EXACT = 2 ** 53  # below it an int64 converts to float64 exactly


def _ragged(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The positions of the segments ``[starts[i], starts[i] + counts[i])``, one after another."""
    ends = np.cumsum(counts)
    return np.arange(ends[-1] if len(ends) else 0) + np.repeat(starts - ends + counts, counts)


class _Entries:
    """Per key, its window's sorted ``(ts_end, duration)`` entries as a segment of two flat
    int64 arrays; an update appends the key's new segment and leaves the old as garbage,
    rebuilt away once it outweighs the live entries."""

    def __init__(self, t: Sequence[int] = (), d: Sequence[int] = ()) -> None:
        self.t, self.d = np.array(t, dtype=np.int64), np.array(d, dtype=np.int64)
        self.used, self.garbage = len(self.t), 0

    def gather(self, off: np.ndarray, cnt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = _ragged(off, cnt)
        return self.t[at], self.d[at]

    def append(self, t: np.ndarray, d: np.ndarray) -> int:
        start, stop = self.used, self.used + len(t)
        if stop > len(self.t):
            capacity = max(stop, 2 * len(self.t))
            self.t, self.d = _grown(self.t, capacity), _grown(self.d, capacity)
        self.t[start:stop], self.d[start:stop] = t, d
        self.used = stop
        return start

    def compact(self, off: np.ndarray, cnt: np.ndarray) -> Optional[np.ndarray]:
        """The new offsets of the live segments ``(off, cnt)`` if it rebuilt, else None."""
        if self.garbage <= max(self.used - self.garbage, _COMPACT_ENTRIES):
            return None
        t, d = self.gather(off, cnt)
        self.t, self.d, self.used, self.garbage = t, d, len(t), 0
        return np.cumsum(cnt) - cnt


class StatsTable(SlotStore):
    """Per ``(app, src)``: the newest ``ts_end``, the update count, and the window as a
    segment (``off``, ``cnt``) of ``entries``; its values ``(newest, updates, ((ts_end,
    duration), ...))`` as ``WindowedDurationStats`` keeps them."""

    def __init__(self) -> None:
        self.entries = _Entries()
        super().__init__(newest=np.int64, updates=np.int64, off=np.int64, cnt=np.int64)

    def _clear(self) -> None:
        self.entries = _Entries()
        super()._clear()

    def _values(self, slots: np.ndarray) -> list:
        cols = self.cols
        counts = cols["cnt"][slots]
        t, d = self.entries.gather(cols["off"][slots], counts)
        pairs = list(zip(t.tolist(), d.tolist()))
        ends = np.cumsum(counts).tolist()
        windows = [tuple(pairs[a:b]) for a, b in zip([0] + ends[:-1], ends)]
        return list(zip(cols["newest"][slots].tolist(), cols["updates"][slots].tolist(), windows))

    def _put(self, slots: np.ndarray, values: List[Any]) -> None:
        cols, windows = self.cols, [value[2] for value in values]
        counts = np.fromiter(map(len, windows), np.int64, len(windows))
        start = self.entries.append(
            np.array([entry[0] for window in windows for entry in window], dtype=np.int64),
            np.array([entry[1] for window in windows for entry in window], dtype=np.int64))
        self.entries.garbage += int(cols["cnt"][slots[self.live[slots]]].sum())
        cols["newest"][slots] = np.array([value[0] for value in values], dtype=np.int64)
        cols["updates"][slots] = np.array([value[1] for value in values], dtype=np.int64)
        cols["off"][slots], cols["cnt"][slots] = start + np.cumsum(counts) - counts, counts

    def _drop(self, slots: np.ndarray) -> None:
        self.entries.garbage += int(self.cols["cnt"][slots].sum())
        super()._drop(slots)

    def compact(self) -> None:
        """The table's rebuild, then the windows' (their garbage is the dead keys' and
        the replaced segments)."""
        super().compact()
        cols, live = self.cols, self.live_slots()
        moved = self.entries.compact(cols["off"][live], cols["cnt"][live])
        if moved is not None:
            cols["off"][live] = moved


def _stab_max(starts: np.ndarray, stops: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Per position ``i < n``, the max of ``values[e]`` over the non-empty ranges with
    ``starts[e] <= i < stops[e]``: each range is two power-of-two blocks, a max per block,
    then the blocks pushed down level by level."""
    if not len(starts):
        return np.full(n, _I64_MIN, dtype=np.int64)
    level = np.frexp((stops - starts).astype(np.float64))[1].astype(np.int64) - 1
    table = np.full((int(level.max()) + 1, n), _I64_MIN, dtype=np.int64)
    flat = table.reshape(-1)
    np.maximum.at(flat, level * n + starts, values)
    np.maximum.at(flat, level * n + stops - (np.int64(1) << level), values)
    for k in range(len(table) - 1, 0, -1):
        half = 1 << (k - 1)
        np.maximum(table[k - 1], table[k], out=table[k - 1])
        if half < n:
            np.maximum(table[k - 1][half:], table[k][:n - half], out=table[k - 1][half:])
    return table[0]


class _Runs(NamedTuple):
    """Per sorted position: its run (a key's rows since its last fresh start), update count
    and newest ``ts_end``; per run: its first position, end, group, and whether it goes on
    from the state's value (``based``) or starts afresh."""

    run: np.ndarray
    updates: np.ndarray
    newest: np.ndarray
    pos: np.ndarray
    end: np.ndarray
    group: np.ndarray
    based: np.ndarray


class _Window(NamedTuple):
    """Every entry the runs' windows hold, laid out run by run (the state's kept entries,
    then the rows): its run, ``ts_end``, duration, and the positions ``[since, until)`` whose
    window holds it (empty: cut on arrival)."""

    run: np.ndarray
    t: np.ndarray
    d: np.ndarray
    since: np.ndarray
    until: np.ndarray


class VectorizedStats(KeyedOperator):
    """``WindowedDurationStats`` on whole batches (``ArrowOperator``), same outputs, same state.

    A key's rows since its last fresh start (a new key, or one idle past
    ``idle_ttl``) form a run: a row's update count is its rank in the run plus the
    state's count, its newest the running max. Each window entry (the state's, and
    each row's) lives over a range of the run's rows, up to the first whose
    ``newest - window`` reaches its ``ts_end``: window sums are difference arrays,
    maxima ``_stab_max``; the key's last row's window is its state. The state is
    ``self.state``, a ``StatsTable``: a ``flux.KeyedStore`` with the twin's wire form."""

    def __init__(self, window: int = DEFAULT_WINDOW, emit_every: int = 2,
                 idle_ttl: Optional[int] = None) -> None:
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        if emit_every < 1:
            raise ValueError(f"emit_every must be >= 1, got {emit_every}")
        self.window, self.emit_every, self.idle_ttl = window, emit_every, idle_ttl
        self._expiry = _Expiry.of(idle_ttl)
        self.state = StatsTable()

    def process_arrow(self, batch: pa.RecordBatch) -> tuple[np.ndarray, pa.RecordBatch]:
        app, src = _column(batch, "app"), _column(batch, "src")
        if not (_is_string(app.type) or pa.types.is_dictionary(app.type)):
            raise ValueError(f"column 'app' must be strings, got {app.type}")
        duration, ts = _ints(batch, "duration"), _ints(batch, "ts_end")
        n, table = len(ts), self.state
        if n == 0:
            return ts, self._outputs(app, src, ts, ts, ts, np.zeros(0))
        groups = _group(table.slots(app, src), table.size)
        alive = table.live[groups.slots]
        watermark, sweep, horizon = None, -1, 0
        if self._expiry is not None:
            watermark, table.watermark, sweep = self._expiry.advance(ts, table.watermark)
            horizon = int(ts[sweep]) - self._expiry.cut
        t = ts[groups.order]
        runs = self._runs(groups, t, alive, watermark)
        window = self._window(groups, runs, t, duration[groups.order])
        emit = np.flatnonzero(runs.updates % self.emit_every == 0)
        rows = groups.order[emit]
        by_row = np.argsort(rows)
        rows, emit = rows[by_row], emit[by_row]
        high, total, count = _aggregates(window, n, emit)
        average = total / count
        for i in np.flatnonzero(np.abs(total) >= _EXACT).tolist():  # Python's division
            average[i] = int(total[i]) / int(count[i])
        self._keep(groups, alive, runs, window, sweep, horizon)
        return rows, self._outputs(app, src, rows, high, runs.newest[emit], average)

    def _runs(self, groups: _Groups, t: np.ndarray, alive: np.ndarray,
              watermark: Optional[np.ndarray]) -> _Runs:
        n, gid, cols = len(t), groups.gid, self.state.cols
        prior_newest = np.where(alive, cols["newest"][groups.slots], _I64_MIN)
        first = np.zeros(n, dtype=bool)
        first[groups.starts] = True
        fresh = first & ~alive[gid]
        if watermark is not None:  # idle past the ttl before this row, swept or not: afresh
            before = np.empty(n, dtype=np.int64)
            before[1:] = _running_max(t, groups.starts, gid)[:-1]
            before[first] = _I64_MIN
            before = np.maximum(before, prior_newest[gid])
            fresh |= before < watermark[groups.order] - self._expiry.cut
        start = first | fresh
        run, pos = np.cumsum(start) - 1, np.flatnonzero(start)
        group = gid[pos]
        based = ~fresh[pos] & alive[group]
        base_updates = np.where(based, cols["updates"][groups.slots[group]], 0)
        updates = base_updates[run] + np.arange(n) - pos[run] + 1
        newest = np.maximum(_running_max(t, pos, run),
                            np.where(based, prior_newest[group], _I64_MIN)[run])
        return _Runs(run, updates, newest, pos, np.append(pos[1:], n), group, based)

    def _window(self, groups: _Groups, runs: _Runs, t: np.ndarray, d: np.ndarray) -> _Window:
        cols, n, run = self.state.cols, len(t), runs.run
        owner = groups.slots[runs.group]
        kept = np.where(runs.based, cols["cnt"][owner], 0)
        size = kept + runs.end - runs.pos
        off = np.cumsum(size) - size
        b = np.flatnonzero(kept)
        kept_t, kept_d = self.state.entries.gather(cols["off"][owner[b]], kept[b])
        at_kept = _ragged(off[b], kept[b])
        at_rows = off[run] + kept[run] + np.arange(n) - runs.pos[run]
        e_t, e_d, since = (np.empty(int(size.sum()), dtype=np.int64) for _ in range(3))
        e_t[at_kept], e_t[at_rows] = kept_t, t
        e_d[at_kept], e_d[at_rows] = kept_d, d
        since[at_kept], since[at_rows] = np.repeat(runs.pos[b], kept[b]), np.arange(n)
        e_run = np.repeat(np.arange(len(size)), size)
        reach = _first_reaching(runs.newest - self.window, runs.pos, runs.end, run, e_t, e_run)
        return _Window(e_run, e_t, e_d, since, np.maximum(reach, since))

    def _keep(self, groups: _Groups, alive: np.ndarray, runs: _Runs, window: _Window,
              sweep: int, horizon: int) -> None:
        """The state after the batch: each key's last row's value and window."""
        table, cols, last, slots = self.state, self.state.cols, groups.ends - 1, groups.slots
        final = np.zeros(len(runs.pos), dtype=bool)
        final[runs.run[last]] = True
        stay = final[window.run] & (window.until == runs.end[window.run])
        t, d, run = window.t[stay], window.d[stay], window.run[stay]
        if not np.all((run[1:] != run[:-1]) | (t[1:] > t[:-1])
                      | ((t[1:] == t[:-1]) & (d[1:] >= d[:-1]))):  # out of order: sort
            ordered = np.lexsort((d, t, run))
            t, d, run = t[ordered], d[ordered], run[ordered]
        counts = np.bincount(runs.group[run], minlength=len(last))
        start = table.entries.append(t, d)
        table.entries.garbage += int(cols["cnt"][slots[alive]].sum())
        table.live[slots] = True
        table.mark(slots)
        cols["newest"][slots], cols["updates"][slots] = runs.newest[last], runs.updates[last]
        cols["off"][slots], cols["cnt"][slots] = start + np.cumsum(counts) - counts, counts
        if sweep >= 0:  # idle before the last sweep, more than idle_ttl before it
            size = table.size
            doomed = table.live[:size] & (cols["newest"][:size] < horizon)
            doomed[slots[groups.last_rows >= sweep]] = False
            table.entries.garbage += int(cols["cnt"][:size][doomed].sum())
            table.live[:size] &= ~doomed
        table.compact()

    @staticmethod
    def _outputs(app: pa.Array, src: pa.Array, rows: np.ndarray, high: np.ndarray,
                 newest: np.ndarray, average: np.ndarray) -> pa.RecordBatch:
        at = pa.array(rows, type=pa.int64())
        apps = app.take(at)
        return pa.RecordBatch.from_arrays(
            [apps if apps.type == pa.string() else apps.cast(pa.string()), src.take(at),
             pa.array(high, type=pa.int64()), pa.array(average, type=pa.float64()),
             pa.array(newest, type=pa.int64())], names=STATS_SCHEMA.names)


def _aggregates(window: _Window, n: int, emit: np.ndarray) -> tuple:
    """At the emitting positions: the window max, sum and count of durations."""
    live = window.until > window.since
    starts, stops, values = window.since[live], window.until[live], window.d[live]
    count = np.cumsum(np.bincount(starts, minlength=n + 1) - np.bincount(stops, minlength=n + 1))
    diff = np.zeros(n + 1, dtype=np.int64)
    np.add.at(diff, starts, values)
    np.add.at(diff, stops, -values)
    return _stab_max(starts, stops, values, n)[emit], np.cumsum(diff)[emit], count[emit]
