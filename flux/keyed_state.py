"""Framework-owned keyed state (DESIGN 5): per-key values, key order, changed keys.

An operator may keep its state in a ``KeyedState`` instead of a hand-made
dict with hand-written ``get_state``/``install_state``: with the
``KeyedOperator`` mixin both come for free, and the framework can find the
store (``keyed_state_of``) to move it in pieces and to checkpoint only what
changed (DESIGN 10).

Rules for what goes in:

- **Keys** are normalised with ``tuplify``: a key that crossed msgpack as a
  list is the same key as the tuple it was. Keys are ordered as Python
  orders them, or by their msgpack bytes when keys of mixed types cannot
  be compared (``flux.keys``).
- **Values** are msgpack-safe and treated as immutable: *replace* a key's
  value (``state[k] = new``), never mutate it in place. Change tracking sees
  only assignments and deletions, and snapshots share values with the
  store. A value that crossed msgpack comes back with lists where tuples
  were; give ``decode`` to turn it back into the form ``process`` uses.
- **Expiry** is the operator's: state that must not grow for ever is
  deleted by event time carried in the records, never wall-clock time
  (DESIGN 4.8, ``flux.expiry``).

The class is in three parts along what uses them: the dict-like access an
operator uses on every record (here), the records of changed keys a catch-up
and a checkpoint read (``flux.keyed_changes``), and the snapshots, parts and
deltas that take a state out and put it in (``flux.keyed_transfer``). One
store holds the data of all three: the per-record path touches one object.

Pure: no I/O, no clock, no randomness.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, runtime_checkable

from flux.keyed_changes import DELETED, ChangeRecords
from flux.keyed_transfer import StateTransfer
from flux.keys import MISSING as _MISSING
from flux.keys import sorted_keys, tuplify


class KeyedState(ChangeRecords, StateTransfer):
    """Per-key values with iteration in key order and changed-key tracking.

    Dict-like: ``get``, ``[]``, ``[]=``, ``del``, ``pop``, ``in``, ``len``,
    ``setdefault``. ``keys()``/``items()`` are in key order; the order is
    sorted lazily and cached until a key is added or removed.

    The runtime's side: ``snapshot``, ``chunks``, ``parts``, ``restore``,
    ``install_chunk``, ``install_part``, ``apply_delta`` (``flux.keyed_transfer``);
    dirty keys after ``clear_dirty()`` (or from creation with
    ``track_dirty=True``) until ``stop_tracking()``, and the changes since a
    checkpoint after ``start_changes()`` (``flux.keyed_changes``).
    """

    __slots__ = ("_data", "_dirty", "_since", "_order", "decode", "installs")

    def __init__(self, pairs: Iterable | None = None,
                 decode: Callable[[Any], Any] | None = None, track_dirty: bool = False):
        self._data: dict = {}
        # None when not tracking; else key -> True if the key was present at the
        # baseline (its deletion must be reported), False if created since.
        self._dirty: Optional[dict] = {} if track_dirty else None
        # The same, since this replica's last checkpoint snapshot (None: not recorded).
        self._since: Optional[dict] = None
        self._order: Optional[list] = None  # the sorted keys, None when stale
        self.installs = 0
        self.decode = decode
        if pairs is not None:
            self.restore(pairs)

    # --- dict-like access -------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        try:
            return self._data[key]
        except TypeError:  # unhashable: a key with lists in it
            return self._data[tuplify(key)]

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self._data.get(key, default)
        except TypeError:
            return self._data.get(tuplify(key), default)

    def __contains__(self, key: Any) -> bool:
        try:
            return key in self._data
        except TypeError:
            return tuplify(key) in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __bool__(self) -> bool:
        return bool(self._data)

    def __setitem__(self, key: Any, value: Any) -> None:
        if self._order is None and self._dirty is None:
            since = self._since
            if since is None:
                # The hot path: no cached order to invalidate, no changes to record.
                try:
                    self._data[key] = value
                except TypeError:  # unhashable: a key with lists in it
                    self._data[tuplify(key)] = value
                return
            # Changes since a cut recorded (checkpoints, digests), nothing else: the hot
            # path of a job that takes checkpoints. A key's first change records its value
            # at the baseline (a new key's is MISSING; the order is not cached).
            data = self._data
            try:
                if key not in since:
                    since[key] = data.get(key, _MISSING)
                data[key] = value
                return
            except TypeError:  # unhashable: a key with lists in it; below, tuplified
                pass
        try:
            hash(key)
        except TypeError:
            key = tuplify(key)
        new = key not in self._data
        if new:
            self._order = None
        if self._dirty is not None:
            self._dirty.setdefault(key, not new)
        since = self._since
        if since is not None and key not in since:  # its value at the baseline
            since[key] = _MISSING if new else self._data[key]
        self._data[key] = value

    def __delitem__(self, key: Any) -> None:
        if self.pop(key, _MISSING) is _MISSING:
            raise KeyError(key)

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        """Remove ``key`` and return its value (``default``, or KeyError, if absent)."""
        try:
            value = self._data.pop(key, _MISSING)
        except TypeError:  # unhashable: a key with lists in it
            key = tuplify(key)
            value = self._data.pop(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self._order = None
        dirty, since = self._dirty, self._since
        # created and deleted since the baseline: no net change
        if dirty is not None and dirty.setdefault(key, True) is False:
            del dirty[key]
        if since is not None and since.setdefault(key, value) is _MISSING:
            del since[key]
        return value

    def get_many(self, keys: Iterable[Any], default: Any = None) -> list:
        """The values of ``keys`` (``default`` where absent), in one call: an operator on
        Arrow batches reads a batch's distinct keys at once."""
        get = self._data.get
        try:
            return [get(key, default) for key in keys]
        except TypeError:  # unhashable: keys with lists in them
            return [get(tuplify(key), default) for key in keys]

    def set_many(self, keys: Iterable[Any], values: Iterable[Any]) -> None:
        """``self[key] = value`` for each pair, in order, in one call (changes recorded as
        one by one)."""
        if self._order is None and self._dirty is None and self._since is None:
            try:
                self._data.update(zip(keys, values))
                return
            except TypeError:  # unhashable: keys with lists in them
                pass
        for key, value in zip(keys, values):
            self[key] = value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """``key``'s value; if absent, set it to ``default`` (a change) and return that."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            self[key] = value = default
        return value

    def expire(self, drop: Callable[[Any, Any], bool]) -> int:
        """Delete every key for which ``drop(key, value)`` holds (changes, tracked as
        ``pop``'s are) and return how many went; one pass, nothing sorted
        (``flux.expiry``)."""
        doomed = [key for key, value in self._data.items() if drop(key, value)]
        for key in doomed:
            self.pop(key)
        return len(doomed)

    # --- key order ----------------------------------------------------------

    def keys(self) -> list:
        """The keys in key order (a list the caller must not mutate)."""
        order = self._order
        if order is None:
            order = self._order = sorted_keys(self._data)
        return order

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def pairs(self) -> Iterable:
        """``(key, value)`` pairs in no particular order: what a sum over them needs
        (``flux.digests.keyed_digest``), without the sort ``items()`` may pay."""
        return self._data.items()

    def items(self) -> list:
        """``(key, value)`` pairs in key order."""
        data = self._data
        return [(key, data[key]) for key in self.keys()]

    def values(self) -> list:
        """The values in key order."""
        data = self._data
        return [data[key] for key in self.keys()]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyedState):
            return self._data == other._data
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        dirty = "not tracking" if self._dirty is None else f"{len(self._dirty)} dirty"
        if self._since is not None:
            dirty += f", {len(self._since)} changed since a checkpoint"
        return f"KeyedState({len(self._data)} keys, {dirty})"


class KeyedOperator:
    """Mixin: an operator whose state is the ``KeyedState`` (or a store of slots, e.g.
    ``ColumnarKeyedState``) in ``self.state`` gets ``get_state()`` (its snapshot) and ``install_state()`` (a
    restore)."""

    state: Any

    def get_state(self) -> list:
        """Sorted ``[key, value]`` pairs (``KeyedState.snapshot``)."""
        return self.state.snapshot()

    def install_state(self, state: list | None) -> None:
        self.state.restore(state)


@runtime_checkable
class KeyedStore(Protocol):
    """What the runtime calls on a keyed store (``KeyedState``, or any store of slots:
    ``ColumnarKeyedState``, the vectorized examples' tables): a catch-up's parts and
    delta, a checkpoint's changes, installs (DESIGN 10), a live move's keys taken out
    and put in (DESIGN 13)."""

    installs: int

    def snapshot(self) -> list: ...
    def parts(self, max_keys: int) -> Iterator[tuple]: ...
    def restore(self, pairs: Iterable | None) -> None: ...
    def install_part(self, keys: Any, values: Any) -> None: ...
    def apply_delta(self, delta: dict) -> None: ...
    def clear_dirty(self) -> None: ...
    def stop_tracking(self) -> None: ...
    def delta(self) -> dict: ...
    def start_changes(self) -> None: ...
    def changes(self) -> dict: ...
    def stop_changes(self) -> None: ...
    def held_keys(self) -> list: ...
    def read_keys(self, keys: Any) -> tuple: ...
    def take_keys(self, keys: Any) -> tuple: ...
    def put_keys(self, keys: Any, values: Any) -> None: ...

    @property
    def records_changes(self) -> bool: ...


def keyed_state_of(op: Any) -> Optional[KeyedStore]:
    """The keyed store that holds ``op``'s whole state, or None if it keeps its own: a
    ``KeyedState``, or a store of slots (``flux.columnar_transfer.SlotTransfer``:
    ``ColumnarKeyedState``, the vectorized examples' tables)."""
    from flux.columnar_transfer import SlotTransfer

    if isinstance(op, KeyedOperator):
        state = getattr(op, "state", None)
        if isinstance(state, (KeyedState, SlotTransfer)):
            return state
    return None


__all__ = ["KeyedState", "KeyedOperator", "KeyedStore", "keyed_state_of", "DELETED", "tuplify", "sorted_keys"]
