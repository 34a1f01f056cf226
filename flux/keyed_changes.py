"""What changed in a ``KeyedState`` since a baseline: the bookkeeping the runtime reads.

A store keeps two records of net changes, each against a baseline of its own:
the *dirty keys* (``clear_dirty``, ``dirty``, ``delta``, ``stop_tracking``),
which a catch-up's phase 2 sends (``flux.keyed_transfer``), and the *changes
since a checkpoint* (``start_changes``, ``changes``, ``stop_changes``), which
an incremental checkpoint writes (DESIGN 10). They are two because a catch-up
and a checkpoint overlap: the replica that writes checkpoints is often the
one that sends a catch-up, and each needs its own baseline.

Both records mean the same. A key assigned since the baseline is changed; a
key that was present at the baseline and has been deleted is changed as
deleted (a tombstone, ``DELETED``); a key created and deleted again since the
baseline is not changed at all (whoever holds the baseline never saw it),
which keeps a record no bigger than the baseline plus the live keys.

Recording costs a little on every assignment, so a record exists only while
someone needs it (``KeyedState(track_dirty=True)`` tracks from creation, the
empty store being the baseline). ``restore``, ``install_chunk`` and
``apply_delta`` leave nothing dirty; installing anything ends the record of
changes since a checkpoint: the state then came from elsewhere, so the next
checkpoint of this store must be whole.

The dirty keys are a dict ``key -> was the key present at the baseline``; the
changes since a checkpoint a dict ``key -> its value at the baseline`` (``MISSING``
where it was absent), so that a replica's digest of its state at the next cut is its
digest at this one plus what the changed keys changed (``flux.digests``, DESIGN 14).
Values are replaced, never mutated in place, so the baseline's value is still what it
was. Both are kept by ``KeyedState``'s own ``[]=`` and ``pop`` (inline: they are the
per-record path); this module reads them. Pure: no I/O.
"""
from __future__ import annotations

from typing import Optional

from flux.keys import MISSING, sorted_keys


class _Deleted:
    """The tombstone ``dirty()`` reports for a deleted key."""

    _instance: Optional["_Deleted"] = None

    def __new__(cls) -> "_Deleted":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DELETED"


#: What ``dirty()`` gives as the value of a key deleted since the baseline.
DELETED = _Deleted()


def net_delta(data: dict, record: dict) -> dict:
    """``{"set": [[key, value], ...], "deleted": [key, ...]}`` for the keys of ``record``,
    both in key order, values as ``data`` holds them now (msgpack-safe)."""
    changed, deleted = [], []
    for key in sorted_keys(record):
        value = data.get(key, MISSING)
        if value is MISSING:
            deleted.append(key)
        else:
            changed.append([key, value])
    return {"set": changed, "deleted": deleted}


class ChangeRecords:
    """``KeyedState``'s reading of its two change records (a base class, not used alone)."""

    __slots__ = ()
    _data: dict
    _dirty: Optional[dict]  # None: not tracking; else key -> present at the baseline
    _since: Optional[dict]  # key -> its value at the last checkpoint's baseline (or MISSING)

    # --- dirty keys (a catch-up's phase 2) --------------------------------------------

    @property
    def tracking(self) -> bool:
        """Whether changes are being recorded (``clear_dirty`` starts, ``stop_tracking`` ends)."""
        return self._dirty is not None

    def _tracked(self) -> dict:
        if self._dirty is None:
            raise RuntimeError("KeyedState is not tracking changes: call clear_dirty() "
                               "to set a baseline first")
        return self._dirty

    def dirty(self) -> list:
        """``(key, value)`` for every key changed since the baseline, in key order;
        the value of a deleted key is ``DELETED``."""
        data = self._data
        return [(key, data.get(key, DELETED)) for key in sorted_keys(self._tracked())]

    def dirty_keys(self) -> list:
        """The keys changed since the baseline, deleted ones included, in key order."""
        return sorted_keys(self._tracked())

    def clear_dirty(self) -> None:
        """Make the current state the baseline (nothing is dirty) and track changes from here."""
        self._dirty = {}

    def stop_tracking(self) -> None:
        """Stop recording changes (and forget those recorded); ``clear_dirty`` starts again."""
        self._dirty = None

    def delta(self) -> dict:
        """The changes since the baseline: ``{"set": [[key, value], ...], "deleted": [key, ...]}``,
        both in key order (msgpack-safe)."""
        return net_delta(self._data, self._tracked())

    # --- changes since the last checkpoint snapshot (DESIGN 10) -----------------------

    @property
    def records_changes(self) -> bool:
        """Whether the changes since a checkpoint's baseline are being recorded."""
        return self._since is not None

    def start_changes(self) -> None:
        """The current state is a checkpoint's baseline: record the changes from here."""
        self._since = {}

    def changes(self) -> dict:
        """The net changes since ``start_changes``, in ``delta()``'s form."""
        if self._since is None:
            raise RuntimeError("KeyedState records no changes for a checkpoint: call "
                               "start_changes() at a full snapshot first")
        return net_delta(self._data, self._since)

    def changed_pairs(self) -> list:
        """``(key, value at the baseline, value now)`` for every key changed since
        ``start_changes``, ``MISSING`` where absent (in no particular order)."""
        if self._since is None:
            raise RuntimeError("KeyedState records no changes: call start_changes() first")
        get = self._data.get
        return [(key, was, get(key, MISSING)) for key, was in self._since.items()]

    def stop_changes(self) -> None:
        """Stop recording the changes since a checkpoint (the next one must be whole)."""
        self._since = None
