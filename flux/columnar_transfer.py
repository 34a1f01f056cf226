"""``ColumnarKeyedState`` taken out and put in, and its change records: the runtime's
side, with ``KeyedState``'s surface and wire form (``flux.keyed_transfer``,
``flux.keyed_changes``), so catch-up and checkpoints take either store.

A change record keeps, per slot, "changed since the baseline" and "created since the
baseline" as boolean columns, and the keys held at the baseline and deleted since;
what it reports nets out as ``flux.keyed_changes`` says. Pure: no I/O.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Sequence

import numpy as np

from flux.keys import sorted_keys, tuplify


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


class ColumnarTransfer:
    """The store's ways out and in (a base class of ``ColumnarKeyedState``)."""

    names: tuple
    dtypes: Dict[str, np.dtype]
    installs: int
    _index: Dict[Any, int]
    _columns: Dict[str, np.ndarray]
    _live: np.ndarray
    _size: int
    _dirty: Optional[Record]
    _since: Optional[Record]
    # ColumnarKeyedState's own, used here
    slots: Callable[[Any], np.ndarray]
    delete: Callable[[np.ndarray], None]
    keys_of: Callable[[np.ndarray], list]
    _clear: Callable[[], None]

    # -- out: the same pairs as KeyedState's -----------------------------------------
    def _values(self, slots: np.ndarray) -> list:
        columns = [self._columns[n][slots].tolist() for n in self.names]
        return [list(v) for v in zip(*columns)]

    def _slots_in_key_order(self, keys: Iterable[Any]) -> tuple:
        ordered = sorted_keys(keys)
        return ordered, np.fromiter(map(self._index.__getitem__, ordered), np.int64,
                                    len(ordered))

    def snapshot(self) -> list:
        keys, slots = self._slots_in_key_order(self._index)
        return [[k, v] for k, v in zip(keys, self._values(slots))]

    def items(self) -> list:
        return [(k, v) for k, v in self.snapshot()]

    def parts(self, max_keys: int) -> Iterator[tuple]:
        """Bulk parts as ``KeyedState.parts`` gives them: the keys held now, each part's
        values read as it is taken (a key deleted meanwhile is left out)."""
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        keys = list(self._index)
        for start in range(0, len(keys), max_keys):
            part = [k for k in keys[start:start + max_keys] if k in self._index]
            slots = np.fromiter(map(self._index.__getitem__, part), np.int64, len(part))
            yield part, self._values(slots)

    # -- in --------------------------------------------------------------------------
    def restore(self, pairs: Optional[Iterable]) -> None:
        self._clear()
        if self._dirty is not None:
            self._dirty = Record(len(self._live))
        self.install_chunk(pairs)

    def install_chunk(self, pairs: Optional[Iterable]) -> None:
        pairs = list(pairs or ())
        self.install_part([k for k, _ in pairs], [v for _, v in pairs])

    def install_part(self, keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Add or replace keys with their values (lists of one value per column); the
        keys are not dirty afterwards, and no checkpoint baseline holds any more."""
        if len(keys) != len(values):
            raise ValueError(f"a part of {len(keys)} keys and {len(values)} values")
        self.installs += 1
        self._since = None
        if not keys:
            return
        keys = [tuplify(k) for k in keys]
        slots = self.slots(keys)
        rows = list(values)
        if any(len(row) != len(self.names) for row in rows):
            raise ValueError(f"values of {len(self.names)} columns {self.names} expected")
        for name, column in zip(self.names, zip(*rows)):
            self._columns[name][slots] = np.array(column, self.dtypes[name])
        if self._dirty is not None:
            self._dirty.changed[slots] = False
            self._dirty.fresh[slots] = False
            self._dirty.deleted.difference_update(keys)

    def apply_delta(self, delta: dict) -> None:
        self.install_chunk(delta.get("set"))
        gone = [tuplify(k) for k in delta.get("deleted") or ()]
        self.delete(np.array([s for s in map(self._index.get, gone) if s is not None],
                             np.int64))
        if self._dirty is not None:
            self._dirty = Record(len(self._live))

    # -- change records: KeyedState's surface (flux.keyed_changes) ------------------
    @property
    def tracking(self) -> bool:
        return self._dirty is not None

    def clear_dirty(self) -> None:
        self._dirty = Record(len(self._live))

    def stop_tracking(self) -> None:
        self._dirty = None

    def delta(self) -> dict:
        if self._dirty is None:
            raise RuntimeError("ColumnarKeyedState is not tracking changes: call "
                               "clear_dirty() to set a baseline first")
        return self._net(self._dirty)

    @property
    def records_changes(self) -> bool:
        return self._since is not None

    def start_changes(self) -> None:
        self._since = Record(len(self._live))

    def changes(self) -> dict:
        if self._since is None:
            raise RuntimeError("ColumnarKeyedState records no changes for a checkpoint: "
                               "call start_changes() at a full snapshot first")
        return self._net(self._since)

    def stop_changes(self) -> None:
        self._since = None

    def _net(self, record: Record) -> dict:
        changed = np.flatnonzero(record.changed[:self._size] & self._live[:self._size])
        keys, slots = self._slots_in_key_order(self.keys_of(changed))
        deleted = sorted_keys(k for k in record.deleted if k not in self._index)
        return {"set": [[k, v] for k, v in zip(keys, self._values(slots))],
                "deleted": deleted}


