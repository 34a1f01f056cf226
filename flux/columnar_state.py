"""Keyed state as columns: a slot per key, each value a row of numpy columns (DESIGN 11).

An operator on Arrow batches reads and writes a whole batch's keys at once:
``slots = state.slots(keys)`` (a slot per row; absent keys are created with zeros),
``state.get("total", slots)``, ``state.put("total", slots, values)``,
``state.delete(slots)``. Writes go through ``put`` and ``delete`` only (``column``
is a read-only view), because they also mark the slots changed, in one numpy call:
that is what the two-phase catch-up and incremental checkpoints read.

It is a ``flux.KeyedStore`` as ``KeyedState`` is, with the same transfer surface
and the same wire form (``[[key, [value per column]], ...]`` in key order), so a
``KeyedOperator`` keeping one in ``self.state`` gets catch-up in parts and
checkpoints of the changed keys, and a snapshot chain rebuilds it unchanged
(``flux.snapshot_chain``).

Keys are Python values (ints, strings, tuples of them): an array of keys is
factorized first, so each distinct key of a batch costs one dict lookup. Change
records keep, per slot, "changed since the baseline" and "created since the
baseline" as boolean columns, and the keys deleted since it that it held; the
net meaning is ``flux.keyed_changes``'. Pure: no I/O, no clock.
"""
from __future__ import annotations

from itertools import repeat
from typing import Any, Dict, Iterable, List, Optional

import numpy as np

from flux.columnar_transfer import ColumnarTransfer, Record
from flux.keys import sorted_keys, tuplify


class ColumnarKeyedState(ColumnarTransfer):
    """Per-key rows of the named numpy columns (``total=np.int64, ...``); the runtime's
    side (snapshots, parts, deltas, change records) is ``ColumnarTransfer``'s."""

    def __init__(self, pairs: Optional[Iterable] = None, **columns: Any):
        if not columns:
            raise ValueError("a ColumnarKeyedState needs at least one column: name=dtype")
        self.names = tuple(columns)
        self.dtypes = {name: np.dtype(dtype) for name, dtype in columns.items()}
        self.installs = 0
        self._clear()
        self._dirty: Optional[Record] = None
        self._since: Optional[Record] = None
        if pairs is not None:
            self.restore(pairs)

    def _clear(self, capacity: int = 64) -> None:
        self._index: Dict[Any, int] = {}
        self._keys: List[Any] = [None] * capacity
        self._live = np.zeros(capacity, bool)
        self._columns = {n: np.zeros(capacity, d) for n, d in self.dtypes.items()}
        self._free: List[int] = []
        self._size = 0  # slots ever used (live or free)

    # -- the operator's side -------------------------------------------------------
    def slots(self, keys: Any) -> np.ndarray:
        """The slot of each key (a list, a numpy array or a ``pyarrow.Array``); keys not
        held yet get a new slot, their values zero."""
        codes, distinct = _factorized(keys)
        found = self._lookup(distinct)
        missing = np.flatnonzero(found < 0)
        if len(missing):
            found[missing] = self._allocate([distinct[i] for i in missing])
        return found[codes] if codes is not None else found

    def find(self, keys: Any) -> np.ndarray:
        """The slot of each key, -1 where it is not held."""
        codes, distinct = _factorized(keys)
        found = self._lookup(distinct)
        return found[codes] if codes is not None else found

    def _lookup(self, distinct: list) -> np.ndarray:
        """The slot of each distinct key, -1 where it is not held (one C loop)."""
        return np.fromiter(map(self._index.get, distinct, repeat(-1)), np.int64,
                           len(distinct))

    def get(self, name: str, slots: np.ndarray) -> np.ndarray:
        return self._columns[name][slots]

    def column(self, name: str) -> np.ndarray:
        """All slots of one column, read-only (write with ``put``)."""
        view = self._columns[name][:self._size]
        view.flags.writeable = False
        return view

    def put(self, name: str, slots: np.ndarray, values: Any) -> None:
        """``column[slots] = values``; the slots are marked changed (one call)."""
        self._columns[name][slots] = values
        self._mark(slots)

    def delete(self, slots: np.ndarray) -> None:
        """Forget the keys of ``slots`` (each may appear once or more)."""
        slots = np.unique(np.asarray(slots, np.int64))
        slots = slots[self._live[slots]]
        for record in (self._dirty, self._since):
            if record is not None:
                held = slots[~record.fresh[slots]]
                record.deleted.update(self._keys[s] for s in held.tolist())
                record.changed[slots] = False
        for s in slots.tolist():
            del self._index[self._keys[s]]
            self._keys[s] = None
            for column in self._columns.values():
                column[s] = 0
        self._live[slots] = False
        self._free.extend(slots.tolist())

    def expire(self, name: str, before: Any, keep: Iterable[Any] = ()) -> int:
        """Forget every key whose ``name`` column is below ``before`` (event time: an
        operator passes its watermark minus a ttl, DESIGN 4.8), except the keys in
        ``keep`` (e.g. where it keeps its watermark); returns how many went. One scan
        of the column: call it when the watermark has moved enough to be worth one."""
        size = self._size
        old = self._live[:size] & (self._columns[name][:size] < before)
        for key in keep:
            slot = self._index.get(tuplify(key))
            if slot is not None:
                old[slot] = False
        slots = np.flatnonzero(old)
        self.delete(slots)
        return len(slots)

    def keys_of(self, slots: np.ndarray) -> list:
        keys = self._keys
        return [keys[s] for s in np.asarray(slots).tolist()]

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: Any) -> bool:
        return tuplify(key) in self._index

    def keys(self) -> list:
        """The keys in key order."""
        return sorted_keys(self._index)

    def _allocate(self, keys: List[Any]) -> np.ndarray:
        reuse = [self._free.pop() for _ in range(min(len(keys), len(self._free)))]
        start = self._size
        need = start + len(keys) - len(reuse)
        if need > len(self._live):
            self._grow(max(need, 2 * len(self._live)))
        slots = np.array(reuse + list(range(start, need)), np.int64)
        self._size = need
        for key, s in zip(keys, slots.tolist()):
            self._index[key] = s
            self._keys[s] = key
        self._live[slots] = True
        for record in (self._dirty, self._since):
            if record is not None:
                record.fresh[slots] = True
                record.changed[slots] = True
        return slots

    def _grow(self, capacity: int) -> None:
        self._keys.extend([None] * (capacity - len(self._keys)))
        live = np.zeros(capacity, bool)
        live[:len(self._live)] = self._live
        self._live = live
        for name, old in self._columns.items():
            new = np.zeros(capacity, old.dtype)
            new[:len(old)] = old
            self._columns[name] = new
        for record in (self._dirty, self._since):
            if record is not None:
                record.grow(capacity)

    def _mark(self, slots: np.ndarray) -> None:
        for record in (self._dirty, self._since):
            if record is not None:
                record.changed[slots] = True

def _factorized(keys: Any) -> tuple:
    """``(codes, distinct)``: each key's index into the distinct keys (None: the keys are
    distinct as given), the distinct keys as Python values. ``keys``: a list of keys, a
    numpy or Arrow array, or a tuple of arrays (one per key column: the keys are tuples)."""
    if isinstance(keys, list):
        keys = [tuplify(k) for k in keys] if keys and isinstance(keys[0], list) else keys
        if len(set(keys)) == len(keys):
            return None, keys
        distinct = list(dict.fromkeys(keys))
        position = {k: i for i, k in enumerate(distinct)}
        return np.fromiter(map(position.__getitem__, keys), np.int64, len(keys)), distinct
    if isinstance(keys, tuple):
        return _factorized_columns(keys)
    codes, distinct = _factorize(keys)
    return codes, distinct.tolist()


def _factorize(column: Any) -> tuple:
    import pandas as pd

    if type(column).__module__.startswith("pyarrow"):
        column = column.to_numpy(zero_copy_only=False)
    codes, distinct = pd.factorize(np.asarray(column), use_na_sentinel=False)
    return codes.astype(np.int64, copy=False), np.asarray(distinct)


def _factorized_columns(columns: tuple) -> tuple:
    """Keys of several columns: each column factorized, the codes combined, the distinct
    combinations as tuples (one Python tuple per distinct key, none per row)."""
    parts = [_factorize(c) for c in columns]
    combined = np.zeros(len(parts[0][0]), np.int64)
    for codes, distinct in parts:
        combined = combined * len(distinct) + codes
    codes, _ = _factorize(combined)
    first = np.empty(codes.max() + 1 if len(codes) else 0, np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    distinct = list(zip(*(d[c[first]].tolist() for c, d in parts)))
    return codes, distinct
