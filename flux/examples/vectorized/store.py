"""A ``KeyTable`` as a ``flux.KeyedStore`` (``flux.examples.vectorized``): the vectorized
operators keep their state in it, as their per-record twins keep theirs in a
``KeyedState``, so the runtime finds it (``flux.keyed_state_of``), moves it in a
catch-up's two phases and checkpoints only what changed (DESIGN 10).

Its wire form is the twin's ``KeyedState``'s: ``[key, value]`` pairs in key order, the
key a tuple, the value the twin's, and the expiry's watermark under ``WATERMARK_KEY``
(``flux.expiry``); parts and deltas are in the same form, so either kind catches up
from the other and a snapshot chain rebuilds it unchanged. The runtime's side is
``flux.columnar_transfer.SlotTransfer``'s over the primitives here; a store of one
operator gives only its values' codec (``_values``, ``_put``). Pure: no I/O.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from flux.columnar_transfer import SlotTransfer
from flux.examples.vectorized.tables import KeyTable, Marks
from flux.expiry import WATERMARK_KEY
from flux.keys import sorted_keys


class SlotStore(KeyTable, SlotTransfer):
    """A ``KeyTable`` with the expiry's watermark beside it, moved and checkpointed as a
    ``KeyedState`` of the per-record twin's pairs would be."""

    def __init__(self, **dtypes: Any) -> None:
        self.installs = 0
        #: the per-record state's ``WATERMARK_KEY`` entry ``(watermark, last sweep)``
        self.watermark: Optional[tuple] = None
        super().__init__(**dtypes)

    # -- the values: each operator's own -------------------------------------------
    def _values(self, slots: np.ndarray) -> list:
        """The per-record twin's values of ``slots`` (held keys)."""
        raise NotImplementedError

    def _put(self, slots: np.ndarray, values: List[Any]) -> None:
        """Write ``values`` (as they come off the wire) at ``slots``; ``live`` still says
        which of them held a key before."""
        raise NotImplementedError

    def _drop(self, slots: np.ndarray) -> None:
        """The keys of ``slots`` (held) are deleted."""
        self.live[slots] = False

    # -- SlotTransfer's primitives ---------------------------------------------------
    def snapshot(self) -> list:
        """The per-record twin's ``get_state()``, straight from the slots."""
        live = self.live_slots()
        return _pairs(self.keys(live), self._values(live), self.watermark)

    def _clear(self) -> None:
        self.watermark = None
        super()._clear()

    def _held(self) -> list:
        keys = self.keys(self.live_slots())
        return keys if self.watermark is None else [WATERMARK_KEY] + keys

    def _read(self, keys: Sequence[Any]) -> tuple:
        keys = list(keys)
        at = keys.index(WATERMARK_KEY) if WATERMARK_KEY in keys else None
        if at is not None:
            del keys[at]
        slots = self.find(*self.encode(keys))
        held = slots >= 0
        values = self._values(slots[held])
        if not held.all():
            keys = [k for k, h in zip(keys, held.tolist()) if h]
        if at is not None and self.watermark is not None:  # where it was asked for
            before = int(held[:at].sum())
            keys.insert(before, WATERMARK_KEY)
            values.insert(before, self.watermark)
        return keys, values

    def _write(self, keys: List[Any], values: List[Any]) -> None:
        if WATERMARK_KEY in keys:
            at = keys.index(WATERMARK_KEY)
            del keys[at]
            self.watermark = tuple(values.pop(at))
            if self._dirty is not None:
                self._dirty.watermark = self.watermark
        if keys:
            slots = self.slots_of(*self.encode(keys))
            self._put(slots, values)
            self.live[slots] = True
            if self._dirty is not None:  # the baseline holds them as installed
                self._dirty.changed[slots] = False
                self._dirty.was[slots] = True
            self.compact()

    def _forget(self, keys: List[Any]) -> None:
        if WATERMARK_KEY in keys:
            keys.remove(WATERMARK_KEY)
            self.watermark = None
        slots = self.find(*self.encode(keys))
        self._drop(slots[slots >= 0])
        self.compact()

    def _touched(self, keys: List[Any]) -> None:
        """(A live move's keys; never the watermark, which stays with its partition.)"""
        slots = self.find(*self.encode(keys))
        self.mark(slots[slots >= 0])

    def _new_record(self) -> Marks:
        return Marks(self.live, self.watermark)

    def _net(self, record: Marks) -> dict:
        size = self.size
        live = self.live[:size]
        changed = np.flatnonzero(record.changed[:size] & live)
        deleted = self.keys(np.flatnonzero(record.was[:size] & ~live))
        watermark = None if self.watermark == record.watermark else self.watermark
        if self.watermark is None and record.watermark is not None:
            deleted.append(WATERMARK_KEY)
        return {"set": _pairs(self.keys(changed), self._values(changed), watermark),
                "deleted": sorted_keys(deleted)}


def _pairs(keys: list, values: list, watermark: Optional[tuple]) -> list:
    """``[key, value]`` pairs in key order, the watermark's among them (``KeyedState``'s)."""
    data = dict(zip(keys, values))
    if watermark is not None:
        data[WATERMARK_KEY] = watermark
    return [[key, data[key]] for key in sorted_keys(data)]
