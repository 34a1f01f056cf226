"""The paper's two operators on whole Arrow batches, for the columnar data plane (DESIGN 11).

A batch operator takes a whole batch as a ``pyarrow.RecordBatch``, as PySpark's
``mapInArrow`` hands it, and must give exactly what its per-record twin gives
fed the rows one by one: the same outputs in the same order (they are numbered
from the input's SN, DESIGN 4.1) and, after every batch, the same
``get_state()``, so a replica can catch up from either kind (DESIGN 5).
``VectorizedSessions`` is ``SessionReconstruction``'s twin, ``VectorizedStats``
``WindowedDurationStats``'s.

Columns, by name (others are ignored):

- packets, into ``VectorizedSessions``: ``src``, ``dst`` (the key: integers or
  strings), ``app`` (string), ``kind`` (string, "start" or "end"), ``ts``
  (integer event time);
- sessions, out of it and into ``VectorizedStats``: ``app`` (string), ``src``
  (as it came in), ``duration``, ``ts_end`` (int64);
- stats, out of ``VectorizedStats``: ``app`` (string), ``src``,
  ``max_duration`` (int64), ``avg_duration`` (float64), ``newest`` (int64).

A key that repeats inside a batch keeps its sequential meaning without a loop
over rows: the rows are sorted by ``(key, row)``, so a key's rows are contiguous
and in input order, and each row reads what the row before it of its key did (a
group-wise shift) or, for the key's first row, the state. Sessions need nothing
more. A stats window at a row is the key's entries not cut yet: an entry stays
from its row up to the first later row whose ``newest - window`` reaches it, a
range of rows, so window sums are difference arrays and window maxima a stabbing
query over ranges (``_stab_max``); event time out of order within a key is
exact the same way. Expiry (``flux.expiry``) is replayed with running maxima,
one loop step per sweep, none per row.

The state is columnar (``_Slots``): a key is two int64s (a column's integers, or
codes of its strings), found by one gather when the keys fill a small rectangle
(``_Box``: the paper's ids) and by a vectorized hash table otherwise
(``_PairMap``), and a key's slot indexes numpy columns; the stats' windows are
segments of two flat arrays (``_Entries``). Python objects appear only in
``get_state``/``install_state`` and for a batch's distinct strings.

Exact within int64 (the per-record operators' Python ints have no bound): event
times, durations and a window's sum of durations must fit; an average is divided
in float64 while the sum is below 2**53 (then it is the correctly rounded
quotient, as Python's) and in Python above. A key column keeps one kind, ints or
strings, where a Python dict would take both. A batch with a bad row raises
before it changes the state, where the per-record operator would have processed
the rows before it.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exchange.columns import to_batch, to_records  # noqa: F401 (the examples' records)
from flux.examples.stats import DEFAULT_WINDOW
from flux.expiry import WATERMARK_KEY
from flux.keys import sorted_keys, tuplify
from flux.operator import BatchOperator


#: the batch operator API (``flux.operator.BatchOperator``), by the name this module used
ArrowOperator = BatchOperator


PACKET_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("app", pa.string()),
                           ("kind", pa.string()), ("ts", pa.int64())])
SESSION_SCHEMA = pa.schema([("app", pa.string()), ("src", pa.int64()),
                            ("duration", pa.int64()), ("ts_end", pa.int64())])
STATS_SCHEMA = pa.schema([("app", pa.string()), ("src", pa.int64()),
                          ("max_duration", pa.int64()), ("avg_duration", pa.float64()),
                          ("newest", pa.int64())])

_I64_MIN = np.iinfo(np.int64).min
#: a table of keys is rebuilt once its dead slots outnumber its live ones and this
_COMPACT_SLOTS = 4096
#: the stats' windows are rebuilt once their garbage outweighs the live entries and this
_COMPACT_ENTRIES = 65536
_EXACT = 2 ** 53  # below it an int64 converts to float64 exactly
_FAR = 2.0 ** 62  # shifted times stay below it (_shifts)


def run_chain(operators: Sequence[ArrowOperator],
              batch: pa.RecordBatch) -> tuple[np.ndarray, pa.RecordBatch]:
    """``operators`` one after the other on ``batch``: the last one's outputs and, per
    output, the row of ``batch`` that caused it (the rows compose)."""
    rows = np.arange(batch.num_rows, dtype=np.int64)
    for op in operators:
        produced, batch = op.process_arrow(batch)
        rows = rows[produced]
    return rows, batch


# --- columns in ---------------------------------------------------------------------------

def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    try:
        column = batch.column(name)
    except KeyError:
        raise ValueError(f"a batch needs a column {name!r}; it has {batch.schema.names}") from None
    if column.null_count:
        raise ValueError(f"column {name!r} has {column.null_count} nulls")
    return column


def _ints(batch: pa.RecordBatch, name: str) -> np.ndarray:
    column = _column(batch, name)
    if not pa.types.is_integer(column.type):
        raise ValueError(f"column {name!r} must be integers, got {column.type}")
    return _int64(column)


def _int64(column: pa.Array) -> np.ndarray:
    return (column if column.type == pa.int64() else column.cast(pa.int64())).to_numpy()


def _objects(items: Any) -> np.ndarray:
    """A 1-d object array of ``items`` (tuples stay tuples, never a 2-d array)."""
    return np.fromiter(items, dtype=object, count=len(items))


def _is_string(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_start(kinds: pa.Array) -> np.ndarray:
    """Per row: "start" (True) or "end" (False); anything else is the per-record ValueError."""
    if not (_is_string(kinds.type) or pa.types.is_dictionary(kinds.type)):
        raise ValueError(f"column 'kind' must be strings, got {kinds.type}")
    start = pc.equal(kinds, "start").to_numpy(zero_copy_only=False)
    good = start | pc.equal(kinds, "end").to_numpy(zero_copy_only=False)
    if not good.all():
        bad = kinds[int(np.flatnonzero(~good)[0])].as_py()
        raise ValueError(f"packet kind must be 'start' or 'end', got {bad!r}")
    return start


# --- the columnar state ----------------------------------------------------------------------

def _grown(array: np.ndarray, size: int) -> np.ndarray:
    bigger = np.zeros(size, dtype=array.dtype)
    bigger[:len(array)] = array
    return bigger


class _Strings:
    """Strings as stable dense codes (``values[code]``), so they can be a key part or a value
    column: a batch looks up its distinct strings (Arrow's dictionary encoding finds them)
    once each, never a row."""

    def __init__(self) -> None:
        self.values: list = []
        self.code_of: dict = {}
        self._cache: tuple = (0, _objects([]), pa.array([], pa.string()))

    def encode(self, column: pa.Array) -> np.ndarray:
        encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
        return self.python(encoded.dictionary.to_pylist())[encoded.indices.to_numpy()]

    def python(self, values: Sequence[Any]) -> np.ndarray:
        code_of = self.code_of
        new = [v for v in dict.fromkeys(values) if v not in code_of]
        if new:
            code_of.update(zip(new, range(len(self.values), len(self.values) + len(new))))
            self.values.extend(new)
        return np.fromiter(map(code_of.__getitem__, values), np.int64, len(values))

    def decode(self, codes: np.ndarray) -> np.ndarray:
        return self._cached()[1][codes]

    def take(self, codes: np.ndarray) -> pa.Array:
        return self._cached()[2].take(pa.array(codes, type=pa.int64()))

    def _cached(self) -> tuple:
        if self._cache[0] != len(self.values):
            self._cache = (len(self.values), _objects(self.values),
                           pa.array(self.values, pa.string()))
        return self._cache


_MULTIPLIERS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9),
                np.uint64(0x94D049BB133111EB))


class _PairMap:
    """``(int64, int64) -> slot`` by open addressing with double hashing, each probe step
    vectorized over the keys still probing: a batch costs a few numpy passes. At most a
    quarter full, so few keys probe twice; nothing is deleted (the owner rebuilds it).
    A row of ``table`` is ``(first, second, slot)``, slot -1 where empty."""

    def __init__(self, first: np.ndarray, second: np.ndarray,
                 slots: Optional[np.ndarray] = None) -> None:
        """The keys ``(first[i], second[i])`` (distinct) at ``slots[i]`` (default: ``i``)."""
        self.count, self.bits = 0, max(6, int(4 * len(first) + 1).bit_length())
        self.table = np.zeros((1 << self.bits, 3), dtype=np.int64)
        self.table[:, 2] = -1
        self._insert(first, second, np.arange(len(first)) if slots is None else slots)

    def _probe(self, first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each key's first place and its (odd) step."""
        a, b, c = _MULTIPLIERS
        h = first.view(np.uint64) * a + second.view(np.uint64)
        h = (h ^ (h >> np.uint64(30))) * b
        h = (h ^ (h >> np.uint64(27))) * c
        h ^= h >> np.uint64(31)
        mask = np.uint64((1 << self.bits) - 1)
        return ((h >> np.uint64(64 - self.bits)).astype(np.int64),
                ((h & mask) | np.uint64(1)).astype(np.int64))

    def get(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """Per key its slot, -1 if absent."""
        out = np.full(len(first), -1, dtype=np.int64)
        todo, mask = np.arange(len(first)), len(self.table) - 1
        at, step = self._probe(first, second)
        while len(todo):
            row = self.table[at]
            held = row[:, 2] >= 0
            hit = held & (row[:, 0] == first[todo]) & (row[:, 1] == second[todo])
            out[todo[hit]] = row[hit, 2]
            more = held & ~hit
            todo, at, step = todo[more], (at[more] + step[more]) & mask, step[more]
        return out

    def put(self, first: np.ndarray, second: np.ndarray, slots: np.ndarray) -> None:
        """Add distinct keys that are absent."""
        if 4 * (self.count + len(first)) > len(self.table):  # rebuilt twice as big
            held = self.table[self.table[:, 2] >= 0]
            self.__init__(np.concatenate([held[:, 0], first]), np.concatenate([held[:, 1], second]),
                          np.concatenate([held[:, 2], slots]))
        else:
            self._insert(first, second, slots)

    def _insert(self, first: np.ndarray, second: np.ndarray, slots: np.ndarray) -> None:
        todo, mask = np.arange(len(first)), len(self.table) - 1
        at, step = self._probe(first, second)
        claim = np.empty(len(self.table), dtype=np.int64)
        while len(todo):
            free = np.flatnonzero(self.table[at, 2] < 0)
            claim[at[free]] = free  # of the keys aiming at one free place, one wins it
            won = free[claim[at[free]] == free]
            index = todo[won]
            self.table[at[won]] = np.stack([first[index], second[index], slots[index]], axis=1)
            lost = np.ones(len(todo), dtype=bool)
            lost[won] = False
            todo, at, step = todo[lost], (at[lost] + step[lost]) & mask, step[lost]
        self.count += len(first)


_BOX_CELLS = (1 << 20, 64, 1 << 22)  # cells: up to 8 MB, or 64 a key up to 32 MB


class _Box:
    """``(first, second) -> slot`` for keys in a small rectangle of integers: one gather per
    key (the paper's ids are such keys). ``None`` from ``around`` when the keys are too
    spread out for that, and then a ``_PairMap`` does it."""

    def __init__(self, lo: tuple, hi: tuple) -> None:
        self.lo, self.hi = lo, hi
        self.width = hi[1] - lo[1] + 1
        self.cells = np.full((hi[0] - lo[0] + 1) * self.width, -1, dtype=np.int64)

    @classmethod
    def around(cls, first: np.ndarray, second: np.ndarray, keys: int) -> Optional["_Box"]:
        """A box over ``first``, ``second`` and some room to grow, if small enough."""
        if not len(first):
            return cls((0, 0), (0, 0))
        lo, hi = (int(first.min()), int(second.min())), (int(first.max()), int(second.max()))
        room = [(high - low) // 4 + 1 for low, high in zip(lo, hi)]
        lo, hi = (lo[0] - room[0], lo[1] - room[1]), (hi[0] + room[0], hi[1] + room[1])
        cells = (hi[0] - lo[0] + 1) * (hi[1] - lo[1] + 1)
        small, per_key, most = _BOX_CELLS
        return cls(lo, hi) if cells <= min(most, max(small, per_key * keys)) else None

    def covers(self, first: np.ndarray, second: np.ndarray) -> bool:
        return (self.lo[0] <= int(first.min()) and int(first.max()) <= self.hi[0]
                and self.lo[1] <= int(second.min()) and int(second.max()) <= self.hi[1])

    def get(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        return self.cells[(first - self.lo[0]) * self.width + (second - self.lo[1])]

    def put(self, first: np.ndarray, second: np.ndarray, slots: np.ndarray) -> None:
        self.cells[(first - self.lo[0]) * self.width + (second - self.lo[1])] = slots


def _index(first: np.ndarray, second: np.ndarray, also: tuple = ()) -> Any:
    """The index of the keys ``(first[i], second[i])`` at slot ``i``: a ``_Box`` if they (and
    the keys ``also``, not added) fit one, else a ``_PairMap``."""
    box = _Box.around(np.concatenate([first, *also[:1]]), np.concatenate([second, *also[1:]]),
                      len(first) + (len(also[0]) if also else 0))
    if box is None:
        return _PairMap(first, second)
    box.put(first, second, np.arange(len(first)))
    return box


class _Slots:
    """Key -> slot, and numpy columns per slot: a keyed state in columns (DESIGN 5).

    A key is two int64 parts, a column's own integers or its strings' ``_Strings``
    codes (a column keeps its kind), found in a ``_Box`` or a ``_PairMap``; every key a batch
    brings gets a slot at once, and ``live`` says which slots hold a key in the
    state now. A key deleted keeps its slot and gets it back if it returns; once
    the dead slots outnumber the live ones the table is rebuilt from the live ones,
    so an endless feed of new keys under expiry stays bounded (a string column's
    codes are not: they grow with its distinct strings)."""

    def __init__(self, **dtypes: Any) -> None:
        self.dtypes = dtypes
        self.kinds: list = [None, None]
        self.strings = (_Strings(), _Strings())
        self.install([], {})

    def install(self, keys: Sequence[tuple], columns: dict) -> None:
        """Replace everything by ``keys`` (live) and their ``columns``' values."""
        self.kinds = [None, None]
        parts = [self._python(i, [key[i] for key in keys]) for i in (0, 1)]
        self._fill(parts[0], parts[1], {name: np.asarray(columns.get(name, ()), dtype=dtype)
                                        for name, dtype in self.dtypes.items()})

    def _fill(self, first: np.ndarray, second: np.ndarray, columns: dict) -> None:
        n = self.size = len(first)
        capacity = max(16, n)
        self.live = _grown(np.ones(n, dtype=bool), capacity)
        self.k1, self.k2 = _grown(first, capacity), _grown(second, capacity)
        self.cols = {name: _grown(col, capacity) for name, col in columns.items()}
        self.index = _index(first, second)

    def _kind(self, i: int, kind: str) -> None:
        if self.kinds[i] is None:
            self.kinds[i] = kind
        elif self.kinds[i] != kind:
            raise ValueError(f"key column {i + 1} held {self.kinds[i]}s, now {kind}s")

    def _part(self, i: int, column: pa.Array) -> np.ndarray:
        if pa.types.is_integer(column.type):
            self._kind(i, "int")
            return _int64(column)
        if _is_string(column.type) or pa.types.is_dictionary(column.type):
            self._kind(i, "str")
            return self.strings[i].encode(column)
        raise ValueError(f"a key column must be integers or strings, got {column.type}")

    def _python(self, i: int, values: list) -> np.ndarray:
        if not values:
            return np.zeros(0, dtype=np.int64)
        if all(type(v) is int for v in values):
            self._kind(i, "int")
            return np.array(values, dtype=np.int64)
        if all(type(v) is str for v in values):
            self._kind(i, "str")
            return self.strings[i].python(values)
        raise ValueError(f"keys whose part {i + 1} is neither all ints nor all strs")

    def slots(self, first: pa.Array, second: pa.Array) -> np.ndarray:
        """Per row, the slot of its key ``(first, second)``; new keys get new, dead slots."""
        a, b = self._part(0, first), self._part(1, second)
        if isinstance(self.index, _Box) and not self.index.covers(a, b):  # grow, or fall back
            self.index = _index(self.k1[:self.size], self.k2[:self.size], (a, b))
        slots = self.index.get(a, b)
        missing = np.flatnonzero(slots < 0)
        if len(missing):
            ma, mb = a[missing], b[missing]
            order = np.lexsort((mb, ma))
            ma, mb = ma[order], mb[order]
            new = np.ones(len(ma), dtype=bool)
            new[1:] = (ma[1:] != ma[:-1]) | (mb[1:] != mb[:-1])
            start, stop = self.size, self.size + int(new.sum())
            if stop > len(self.live):
                capacity = max(stop, 2 * len(self.live))
                self.live = _grown(self.live, capacity)
                self.k1, self.k2 = _grown(self.k1, capacity), _grown(self.k2, capacity)
                self.cols = {name: _grown(col, capacity) for name, col in self.cols.items()}
            self.k1[start:stop], self.k2[start:stop] = ma[new], mb[new]
            self.index.put(ma[new], mb[new], np.arange(start, stop))
            self.size = stop
            slots[missing[order]] = start + np.cumsum(new) - 1
        return slots

    def keys(self, slots: np.ndarray) -> list:
        """The per-record operator's key tuples of ``slots``."""
        parts = [self.strings[i].decode(k[slots]) if self.kinds[i] == "str" else k[slots]
                 for i, k in enumerate((self.k1, self.k2))]
        return list(zip(parts[0].tolist(), parts[1].tolist()))

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.live[:self.size])

    def compact(self) -> None:
        live = self.live_slots()
        if self.size - len(live) > max(len(live), _COMPACT_SLOTS):
            self._fill(self.k1[live], self.k2[live],
                       {name: col[live] for name, col in self.cols.items()})


def _keyed_pairs(state: Optional[list]) -> Tuple[list, Optional[tuple]]:
    """A per-record operator's snapshot as its ``(key, value)`` pairs (keys as tuples) and
    the expiry's watermark entry, which is kept apart."""
    pairs, watermark = [], None
    for key, value in state or ():
        key = tuplify(key)
        if key == WATERMARK_KEY:
            watermark = tuple(value)
        else:
            pairs.append((key, value))
    return pairs, watermark


def _snapshot(keys: list, values: list, watermark: Optional[tuple]) -> list:
    """``KeyedState.snapshot()`` of the per-record twin: ``[key, value]`` in key order."""
    data = dict(zip(keys, values))
    if watermark is not None:
        data[WATERMARK_KEY] = watermark
    return [[key, data[key]] for key in sorted_keys(data)]


# --- a batch's rows by key -------------------------------------------------------------------

class _Groups(NamedTuple):
    """A batch's rows grouped by key: ``order`` sorts them by ``(key, row)``, so a key's rows
    are contiguous and in input order; ``gid`` is each sorted position's group, ``starts``
    and ``ends`` each group's first and one-past-last sorted position, ``slots`` its slot."""

    order: np.ndarray
    gid: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    slots: np.ndarray

    @property
    def last_rows(self) -> np.ndarray:
        return self.order[self.ends - 1]


def _group(slots: np.ndarray, size: int) -> _Groups:
    """Group rows by their slot (< ``size``): a radix sort while slots fit 16 bits."""
    n = len(slots)
    if size <= 1 << 16:
        order = np.argsort(slots.astype(np.uint16), kind="stable")
    else:
        order = np.argsort(slots * n + np.arange(n))
    ordered = slots[order]
    new = np.empty(n, dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    return _Groups(order, np.cumsum(new) - 1, starts, np.append(starts[1:], n), ordered[starts])


def _shifts(lo: np.ndarray, hi: np.ndarray) -> Optional[np.ndarray]:
    """Per segment, the offset that moves its values ``[lo, hi + 1]`` above every earlier
    segment's once ``lo`` is subtracted: then one running max, or one sorted array, serves
    all segments at once. None if that would leave int64 (then the callers use ranks)."""
    if len(lo) and (hi.max() >= _FAR or lo.min() <= -_FAR
                    or float(np.sum(hi.astype(np.float64) - lo + 2)) >= _FAR):
        return None
    width = hi - lo + 2
    return np.cumsum(width) - width


def _running_max(values: np.ndarray, starts: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """The running max of ``values``, restarting at each of ``starts`` (``segment`` gives
    each position's)."""
    lo, hi = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)
    base = _shifts(lo, hi)
    if base is None:
        uniques, ranks = np.unique(values, return_inverse=True)
        return uniques[_running_max(ranks.astype(np.int64), starts, segment)]
    shift = base[segment] - lo[segment]
    return np.maximum.accumulate(values + shift) - shift


def _first_reaching(low: np.ndarray, starts: np.ndarray, ends: np.ndarray, run: np.ndarray,
                    t: np.ndarray, t_run: np.ndarray) -> np.ndarray:
    """Per query ``(t, t_run)``: the first position of run ``t_run`` whose ``low`` is at
    least ``t`` (the run's end if none); ``low`` is non-decreasing within each run, the
    runs are ``[starts, ends)`` in order, ``run`` gives each position's."""
    lo, hi = low[starts], low[ends - 1]
    base = _shifts(lo, hi)
    if base is None:
        uniques = np.unique(np.concatenate([low, t]))
        return _first_reaching(np.searchsorted(uniques, low), starts, ends, run,
                               np.searchsorted(uniques, t), t_run)
    shifted = low - lo[run] + base[run]
    query = np.minimum(np.maximum(t, lo[t_run]), hi[t_run] + 1) - lo[t_run] + base[t_run]
    return np.searchsorted(shifted, query)


# --- event-time expiry -------------------------------------------------------------------------

class _Expiry(NamedTuple):
    """``flux.expiry.Expiry`` in integers: ``x < watermark - ttl`` is ``x < watermark - cut``
    for integer times, and ``ts - swept >= ttl / 2`` is ``ts >= swept + gap``."""

    cut: int
    gap: int

    @classmethod
    def of(cls, ttl: Optional[float]) -> Optional["_Expiry"]:
        if ttl is None:
            return None
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0 (event-time units), got {ttl!r}")
        return cls(math.floor(ttl), math.ceil(ttl / 2))

    def advance(self, ts: np.ndarray, kept: Optional[tuple]) -> tuple:
        """``Expiry.advance`` over a batch: the watermark after each row, the kept
        ``(watermark, last sweep)`` after it, and the row of its last sweep (-1: none).
        A sweep needs the last one's time: one loop step per sweep, none per row."""
        high, swept = kept if kept is not None else (int(ts[0]), int(ts[0]))
        watermark = np.maximum(np.maximum.accumulate(ts), high)
        before = np.empty_like(watermark)
        before[0] = high
        before[1:] = watermark[:-1]
        rising = np.flatnonzero(ts > before)
        peaks = ts[rising]
        last, j = -1, 0
        while True:
            j += int(np.searchsorted(peaks[j:], swept + self.gap))
            if j == len(peaks):
                break
            last, swept = int(rising[j]), int(peaks[j])
            j += 1
        top = int(watermark[-1])
        return watermark, (high if top == high else top, swept), last


# --- session reconstruction ------------------------------------------------------------------

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


# --- windowed duration statistics ------------------------------------------------------------

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


class VectorizedStats:
    """``WindowedDurationStats`` on whole batches (``ArrowOperator``), same outputs, same state.

    A key's rows since its last fresh start (a new key, or one idle past
    ``idle_ttl``) form a run: a row's update count is its rank in the run plus the
    state's count, its newest the running max. Each window entry (the state's, and
    each row's) lives over a range of the run's rows, up to the first whose
    ``newest - window`` reaches its ``ts_end``: window sums are difference arrays,
    maxima ``_stab_max``; the key's last row's window is its state."""

    def __init__(self, window: int = DEFAULT_WINDOW, emit_every: int = 2,
                 idle_ttl: Optional[int] = None) -> None:
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        if emit_every < 1:
            raise ValueError(f"emit_every must be >= 1, got {emit_every}")
        self.window, self.emit_every, self.idle_ttl = window, emit_every, idle_ttl
        self._expiry = _Expiry.of(idle_ttl)
        self.table = _Slots(newest=np.int64, updates=np.int64, off=np.int64, cnt=np.int64)
        self.entries = _Entries()
        self.watermark: Optional[tuple] = None  # the per-record state's (-inf,) entry

    def process_arrow(self, batch: pa.RecordBatch) -> tuple[np.ndarray, pa.RecordBatch]:
        app, src = _column(batch, "app"), _column(batch, "src")
        if not (_is_string(app.type) or pa.types.is_dictionary(app.type)):
            raise ValueError(f"column 'app' must be strings, got {app.type}")
        duration, ts = _ints(batch, "duration"), _ints(batch, "ts_end")
        n, table = len(ts), self.table
        if n == 0:
            return ts, self._outputs(app, src, ts, ts, ts, np.zeros(0))
        groups = _group(table.slots(app, src), table.size)
        alive = table.live[groups.slots]
        watermark, sweep, horizon = None, -1, 0
        if self._expiry is not None:
            watermark, self.watermark, sweep = self._expiry.advance(ts, self.watermark)
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
        n, gid, cols = len(t), groups.gid, self.table.cols
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
        cols, n, run = self.table.cols, len(t), runs.run
        owner = groups.slots[runs.group]
        kept = np.where(runs.based, cols["cnt"][owner], 0)
        size = kept + runs.end - runs.pos
        off = np.cumsum(size) - size
        b = np.flatnonzero(kept)
        kept_t, kept_d = self.entries.gather(cols["off"][owner[b]], kept[b])
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
        table, cols, last, slots = self.table, self.table.cols, groups.ends - 1, groups.slots
        final = np.zeros(len(runs.pos), dtype=bool)
        final[runs.run[last]] = True
        stay = final[window.run] & (window.until == runs.end[window.run])
        t, d, run = window.t[stay], window.d[stay], window.run[stay]
        if not np.all((run[1:] != run[:-1]) | (t[1:] > t[:-1])
                      | ((t[1:] == t[:-1]) & (d[1:] >= d[:-1]))):  # out of order: sort
            ordered = np.lexsort((d, t, run))
            t, d, run = t[ordered], d[ordered], run[ordered]
        counts = np.bincount(runs.group[run], minlength=len(last))
        start = self.entries.append(t, d)
        self.entries.garbage += int(cols["cnt"][slots[alive]].sum())
        table.live[slots] = True
        cols["newest"][slots], cols["updates"][slots] = runs.newest[last], runs.updates[last]
        cols["off"][slots], cols["cnt"][slots] = start + np.cumsum(counts) - counts, counts
        if sweep >= 0:  # idle before the last sweep, more than idle_ttl before it
            size = table.size
            doomed = table.live[:size] & (cols["newest"][:size] < horizon)
            doomed[slots[groups.last_rows >= sweep]] = False
            self.entries.garbage += int(cols["cnt"][:size][doomed].sum())
            table.live[:size] &= ~doomed
        table.compact()
        cols, live = table.cols, table.live_slots()
        moved = self.entries.compact(cols["off"][live], cols["cnt"][live])
        if moved is not None:
            cols["off"][live] = moved

    @staticmethod
    def _outputs(app: pa.Array, src: pa.Array, rows: np.ndarray, high: np.ndarray,
                 newest: np.ndarray, average: np.ndarray) -> pa.RecordBatch:
        at = pa.array(rows, type=pa.int64())
        apps = app.take(at)
        return pa.RecordBatch.from_arrays(
            [apps if apps.type == pa.string() else apps.cast(pa.string()), src.take(at),
             pa.array(high, type=pa.int64()), pa.array(average, type=pa.float64()),
             pa.array(newest, type=pa.int64())], names=STATS_SCHEMA.names)

    def get_state(self) -> list:
        """What ``WindowedDurationStats.get_state()`` gives: sorted ``[(app, src), (newest,
        updates, ((ts_end, duration), ...))]`` pairs, and the watermark's with an idle_ttl."""
        table, cols = self.table, self.table.cols
        live = table.live_slots()
        counts = cols["cnt"][live]
        t, d = self.entries.gather(cols["off"][live], counts)
        pairs = list(zip(t.tolist(), d.tolist()))
        ends = np.cumsum(counts).tolist()
        windows = [tuple(pairs[a:b]) for a, b in zip([0] + ends[:-1], ends)]
        values = zip(cols["newest"][live].tolist(), cols["updates"][live].tolist(), windows)
        return _snapshot(table.keys(live), list(values), self.watermark)

    def install_state(self, state: Optional[list]) -> None:
        keys, newest, updates, counts, t, d = [], [], [], [], [], []
        pairs, self.watermark = _keyed_pairs(state)
        for key, value in pairs:
            keys.append(key)
            newest.append(value[0])
            updates.append(value[1])
            counts.append(len(value[2]))
            t.extend(entry[0] for entry in value[2])
            d.extend(entry[1] for entry in value[2])
        self.entries = _Entries(t, d)
        counts = np.array(counts, dtype=np.int64)
        self.table.install(keys, {"newest": newest, "updates": updates,
                                  "off": np.cumsum(counts) - counts, "cnt": counts})


def _aggregates(window: _Window, n: int, emit: np.ndarray) -> tuple:
    """At the emitting positions: the window max, sum and count of durations."""
    live = window.until > window.since
    starts, stops, values = window.since[live], window.until[live], window.d[live]
    count = np.cumsum(np.bincount(starts, minlength=n + 1) - np.bincount(stops, minlength=n + 1))
    diff = np.zeros(n + 1, dtype=np.int64)
    np.add.at(diff, starts, values)
    np.add.at(diff, stops, -values)
    return _stab_max(starts, stops, values, n)[emit], np.cumsum(diff)[emit], count[emit]
