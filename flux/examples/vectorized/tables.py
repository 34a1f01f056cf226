"""The operators' keyed state in columns (``flux.examples.vectorized``): a key is two
int64s, found by one gather (``_Box``) or a vectorized hash table (``_PairMap``), and its
slot indexes numpy columns (``KeyTable``); while a catch-up or incremental checkpoints
need them, change records (``Marks``) are columns of the slots too (DESIGN 10)."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flux.examples.vectorized.columns import _int64, _is_string, _objects

#: a table of keys is rebuilt once its dead slots outnumber its live ones and this
_COMPACT_SLOTS = 4096


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


class Marks:
    """A change record with ``flux.keyed_changes``' meaning, as columns of the slots:
    ``changed`` since the baseline, ``was`` held at it; and the watermark then. A key held
    at the baseline and deleted since is a slot with ``was`` that is not live: the slot
    stays through the table's rebuilds while a record needs it, so a deletion costs no
    Python object, and a batch's writes are marked in one numpy call."""

    __slots__ = ("changed", "was", "watermark")

    def __init__(self, live: np.ndarray, watermark: Optional[tuple]) -> None:
        self.changed = np.zeros(len(live), dtype=bool)
        self.was = live.copy()
        self.watermark = watermark

    def grow(self, capacity: int) -> None:
        self.changed, self.was = _grown(self.changed, capacity), _grown(self.was, capacity)

    def take(self, kept: np.ndarray, capacity: int) -> None:
        """The marks of the slots ``kept``, renumbered in order (a rebuild of the table)."""
        self.changed = _grown(self.changed[kept], capacity)
        self.was = _grown(self.was[kept], capacity)


class KeyTable:
    """Key -> slot, and numpy columns per slot: a keyed state in columns (DESIGN 5).

    A key is two int64 parts, a column's own integers or its strings' ``_Strings``
    codes (a column keeps its kind), found in a ``_Box`` or a ``_PairMap``; every key a batch
    brings gets a slot at once, and ``live`` says which slots hold a key in the
    state now. A key deleted keeps its slot and gets it back if it returns; once
    the dead slots outnumber the live ones the table is rebuilt from the live ones,
    so an endless feed of new keys under expiry stays bounded (a string column's
    codes are not: they grow with its distinct strings).

    The operators write the columns and ``live`` themselves and call ``mark`` with the
    slots a batch wrote; deletions need no mark (``Marks``)."""

    _dirty: Optional[Marks]
    _since: Optional[Marks]

    def __init__(self, **dtypes: Any) -> None:
        self.dtypes = dtypes
        self.strings = (_Strings(), _Strings())
        self._dirty = self._since = None
        self.size, self.live = 0, np.zeros(0, dtype=bool)
        self.k1 = self.k2 = np.zeros(0, dtype=np.int64)
        self.cols = {name: np.zeros(0, dtype=dtype) for name, dtype in dtypes.items()}
        self._clear()

    def _clear(self) -> None:
        """Hold no key (the strings keep their codes)."""
        self.kinds: list = [None, None]
        self._rebuild(np.zeros(0, dtype=np.int64))

    def _rebuild(self, kept: np.ndarray) -> None:
        """Keep only the slots ``kept``, renumbered in order, their records' marks with them."""
        first, second = self.k1[kept], self.k2[kept]
        n = self.size = len(kept)
        capacity = max(16, n)
        self.live = _grown(self.live[kept], capacity)
        self.k1, self.k2 = _grown(first, capacity), _grown(second, capacity)
        self.cols = {name: _grown(col[kept], capacity) for name, col in self.cols.items()}
        for record in (self._dirty, self._since):
            if record is not None:
                record.take(kept, capacity)
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

    def encode(self, keys: Sequence[tuple]) -> tuple:
        """The two int64 parts of the per-record operator's key tuples."""
        return self._python(0, [key[0] for key in keys]), self._python(1, [key[1] for key in keys])

    def slots(self, first: pa.Array, second: pa.Array) -> np.ndarray:
        """Per row, the slot of its key ``(first, second)``; new keys get new, dead slots."""
        return self.slots_of(self._part(0, first), self._part(1, second))

    def slots_of(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per key ``(a[i], b[i])`` (encoded), its slot; new keys get new, dead slots."""
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
                self._grow(max(stop, 2 * len(self.live)))
            self.k1[start:stop], self.k2[start:stop] = ma[new], mb[new]
            self.index.put(ma[new], mb[new], np.arange(start, stop))
            self.size = stop
            slots[missing[order]] = start + np.cumsum(new) - 1
        return slots

    def _grow(self, capacity: int) -> None:
        self.live = _grown(self.live, capacity)
        self.k1, self.k2 = _grown(self.k1, capacity), _grown(self.k2, capacity)
        self.cols = {name: _grown(col, capacity) for name, col in self.cols.items()}
        for record in (self._dirty, self._since):
            if record is not None:
                record.grow(capacity)

    def find(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per key ``(a[i], b[i])`` (encoded), its slot if the state holds it now, else -1."""
        index = self.index
        if isinstance(index, _Box):  # a key outside the box was never held
            inside = ((index.lo[0] <= a) & (a <= index.hi[0])
                      & (index.lo[1] <= b) & (b <= index.hi[1]))
            slots = np.full(len(a), -1, dtype=np.int64)
            slots[inside] = index.get(a[inside], b[inside])
        else:
            slots = index.get(a, b)
        held = slots >= 0
        held[held] = self.live[slots[held]]
        return np.where(held, slots, -1)

    def keys(self, slots: np.ndarray) -> list:
        """The per-record operator's key tuples of ``slots``."""
        parts = [self.strings[i].decode(k[slots]) if self.kinds[i] == "str" else k[slots]
                 for i, k in enumerate((self.k1, self.k2))]
        return list(zip(parts[0].tolist(), parts[1].tolist()))

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.live[:self.size])

    def mark(self, slots: np.ndarray) -> None:
        """The keys of ``slots`` were written: changed, for each record kept."""
        for record in (self._dirty, self._since):
            if record is not None:
                record.changed[slots] = True

    def compact(self) -> None:
        """Rebuild from the live slots once the dead outnumber them, keeping the dead
        slots whose keys a record's baseline held (their deletion is read from them)."""
        live = self.live_slots()
        if self.size - len(live) <= max(len(live), _COMPACT_SLOTS):
            return
        keep = self.live[:self.size].copy()
        for record in (self._dirty, self._since):
            if record is not None:
                keep |= record.was[:self.size]
        kept = np.flatnonzero(keep)
        if self.size - len(kept) > max(len(kept), _COMPACT_SLOTS):
            self._rebuild(kept)
