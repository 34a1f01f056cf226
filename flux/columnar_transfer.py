"""Keyed stores kept in slots, taken out and put in: the runtime's side, with
``KeyedState``'s surface and wire form (``flux.keyed_transfer``, ``flux.keyed_changes``),
so catch-up and checkpoints take any of them.

``SlotTransfer`` is that surface over a few primitives a store gives (the keys it
holds, the values of some keys, writing and forgetting keys, a change record and its
net changes), so each store keeps its keys and values and records its changes in the
way its operators write them, and moves them the one way (DESIGN 10).
``ColumnarTransfer`` gives ``ColumnarKeyedState``'s: a dict from the key to its slot,
and a change record (``Record``) of two boolean columns, "changed since the baseline"
and "created since the baseline", and the keys held at the baseline and deleted since;
what it reports nets out as ``flux.keyed_changes`` says. Pure: no I/O.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np

from flux.keys import sorted_keys, tuplify


class SlotTransfer:
    """Snapshots, bulk parts, installs, deltas and the two change records of a keyed store
    (``flux.KeyedStore``), over the store's primitives:

    - ``_held()``: the keys held now (a list, any order);
    - ``_read(keys)``: ``(held, values)``, those of ``keys`` still held and their values
      in wire form (msgpack-safe), in the order given;
    - ``_write(keys, values)``: add or replace keys (tuples) with values (as they come
      off the wire); they are not dirty afterwards;
    - ``_forget(keys)``: delete those of ``keys`` held;
    - ``_touched(keys)``: the keys (held) were written: changed, for each record kept;
    - ``_clear()``: hold nothing;
    - ``_new_record()`` and ``_net(record)``: a change record whose baseline is now,
      and its net changes, ``{"set": [[key, value], ...], "deleted": [key, ...]}`` in
      key order.
    """

    installs: int
    _dirty: Optional[Any]  # the record a catch-up's phase 2 reads (None: not tracking)
    _since: Optional[Any]  # the record since this replica's last checkpoint snapshot
    _held: Callable[[], list]
    _read: Callable[[Sequence[Any]], tuple]
    _write: Callable[[List[Any], List[Any]], None]
    _forget: Callable[[List[Any]], None]
    _touched: Callable[[List[Any]], None]
    _clear: Callable[[], None]
    _new_record: Callable[[], Any]
    _net: Callable[[Any], dict]

    # -- out: the same pairs as KeyedState's -----------------------------------------
    def snapshot(self) -> list:
        keys, values = self._read(sorted_keys(self._held()))
        return [[k, v] for k, v in zip(keys, values)]

    def items(self) -> list:
        return [(k, v) for k, v in self.snapshot()]

    def parts(self, max_keys: int) -> Iterator[tuple]:
        """Bulk parts as ``KeyedState.parts`` gives them: the keys held now, each part's
        values read as it is taken (a key deleted meanwhile is left out)."""
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        return _parts(self, self._held(), max_keys)

    # -- a live move of key groups (DESIGN 13): changes like any other --------------
    def held_keys(self) -> list:
        return self._held()

    def read_keys(self, keys: Sequence[Any]) -> tuple:
        """``(held, values)``: those of ``keys`` held, and their values in wire form."""
        return self._read(list(keys))

    def take_keys(self, keys: Sequence[Any]) -> tuple:
        """Take ``keys`` out (a range moving away): ``read_keys``'s, each deletion a
        change (catch-up's delta and the next snapshot's delta carry it)."""
        held, values = self._read(list(keys))
        self._forget(list(held))
        self.installs += 1
        return held, values

    def put_keys(self, keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Add a range that moved here (as it came off the wire), each key a change."""
        keys = [tuplify(k) for k in keys]
        if keys:
            self._write(list(keys), list(values))
            self._touched(keys)
        self.installs += 1

    # -- in --------------------------------------------------------------------------
    def restore(self, pairs: Optional[Iterable]) -> None:
        self._clear()
        if self._dirty is not None:
            self._dirty = self._new_record()
        self.install_chunk(pairs)

    def install_chunk(self, pairs: Optional[Iterable]) -> None:
        pairs = list(pairs or ())
        self.install_part([k for k, _ in pairs], [v for _, v in pairs])

    def install_part(self, keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Add or replace keys with their values; the keys are not dirty afterwards, and
        no checkpoint baseline holds any more."""
        if len(keys) != len(values):
            raise ValueError(f"a part of {len(keys)} keys and {len(values)} values")
        self.installs += 1
        self._since = None
        if keys:
            self._write([tuplify(k) for k in keys], list(values))

    def apply_delta(self, delta: dict) -> None:
        self.install_chunk(delta.get("set"))
        self._forget([tuplify(k) for k in delta.get("deleted") or ()])
        if self._dirty is not None:
            self._dirty = self._new_record()

    # -- change records: KeyedState's surface (flux.keyed_changes) ------------------
    @property
    def tracking(self) -> bool:
        return self._dirty is not None

    def clear_dirty(self) -> None:
        self._dirty = self._new_record()

    def stop_tracking(self) -> None:
        self._dirty = None

    def delta(self) -> dict:
        if self._dirty is None:
            raise RuntimeError(f"{type(self).__name__} is not tracking changes: call "
                               f"clear_dirty() to set a baseline first")
        return self._net(self._dirty)

    @property
    def records_changes(self) -> bool:
        return self._since is not None

    def start_changes(self) -> None:
        self._since = self._new_record()

    def changes(self) -> dict:
        if self._since is None:
            raise RuntimeError(f"{type(self).__name__} records no changes for a checkpoint: "
                               f"call start_changes() at a full snapshot first")
        return self._net(self._since)

    def stop_changes(self) -> None:
        self._since = None


def _parts(store: SlotTransfer, keys: List[Any], size: int) -> Iterator[tuple]:
    for start in range(0, len(keys), size):
        yield store._read(keys[start:start + size])


class Record:
    """Net changes since one baseline."""

    __slots__ = ("changed", "fresh", "deleted")

    def __init__(self, capacity: int):
        self.changed = np.zeros(capacity, bool)
        self.fresh = np.zeros(capacity, bool)
        self.deleted: set = set()  # keys held at the baseline, deleted since

    def grow(self, capacity: int) -> None:
        for name in ("changed", "fresh"):
            old = getattr(self, name)
            new = np.zeros(capacity, bool)
            new[:len(old)] = old
            setattr(self, name, new)


class ColumnarTransfer(SlotTransfer):
    """``ColumnarKeyedState``'s primitives for ``SlotTransfer`` (a base class of it)."""

    names: tuple
    dtypes: Dict[str, np.dtype]
    _index: Dict[Any, int]
    _columns: Dict[str, np.ndarray]
    _live: np.ndarray
    _size: int
    _dirty: Optional[Record]
    _since: Optional[Record]
    # ColumnarKeyedState's own, used here
    _mark: Callable[[np.ndarray], None]
    slots: Callable[[Any], np.ndarray]
    delete: Callable[[np.ndarray], None]
    keys_of: Callable[[np.ndarray], list]

    def _values(self, slots: np.ndarray) -> list:
        columns = [self._columns[n][slots].tolist() for n in self.names]
        return [list(v) for v in zip(*columns)]

    def _held(self) -> list:
        return list(self._index)

    def _read(self, keys: Sequence[Any]) -> tuple:
        index = self._index
        held = [k for k in keys if k in index]
        slots = np.fromiter(map(index.__getitem__, held), np.int64, len(held))
        return held, self._values(slots)

    def _write(self, keys: List[Any], values: List[Any]) -> None:
        slots = self.slots(keys)
        if any(len(row) != len(self.names) for row in values):
            raise ValueError(f"values of {len(self.names)} columns {self.names} expected")
        for name, column in zip(self.names, zip(*values)):
            self._columns[name][slots] = np.array(column, self.dtypes[name])
        if self._dirty is not None:
            self._dirty.changed[slots] = False
            self._dirty.fresh[slots] = False
            self._dirty.deleted.difference_update(keys)

    def _forget(self, keys: List[Any]) -> None:
        self.delete(np.array([s for s in map(self._index.get, keys) if s is not None],
                             np.int64))

    def _touched(self, keys: List[Any]) -> None:
        self._mark(np.fromiter(map(self._index.__getitem__, keys), np.int64, len(keys)))

    def _new_record(self) -> Record:
        return Record(len(self._live))

    def _net(self, record: Record) -> dict:
        changed = np.flatnonzero(record.changed[:self._size] & self._live[:self._size])
        keys, values = self._read(sorted_keys(self.keys_of(changed)))
        deleted = sorted_keys(k for k in record.deleted if k not in self._index)
        return {"set": [[k, v] for k, v in zip(keys, values)], "deleted": deleted}
