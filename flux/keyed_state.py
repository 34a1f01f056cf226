"""Framework-owned keyed state (DESIGN 5): per-key values, key order, dirty keys.

An operator may keep its state in a ``KeyedState`` instead of a hand-made
dict with hand-written ``get_state``/``install_state``: with the
``KeyedOperator`` mixin both come for free, and the framework can find the
store (``keyed_state_of``) to move it in pieces and, later, to checkpoint
only what changed (DESIGN 10).

Rules for what goes in:

- **Keys** are normalised with ``tuplify``: a key that crossed msgpack as a
  list is the same key as the tuple it was. Keys are ordered as Python
  orders them, or by their msgpack bytes when keys of mixed types cannot
  be compared (the order ``flux.operator.keyed_state`` gives a dict).
- **Values** are msgpack-safe and treated as immutable: *replace* a key's
  value (``state[k] = new``), never mutate it in place. Dirty tracking sees
  only assignments and deletions, and snapshots share values with the
  store. A value that crossed msgpack comes back with lists where tuples
  were; give ``decode`` to turn it back into the form ``process`` uses.
- **Expiry** is the operator's: state that must not grow for ever is
  deleted by event time carried in the records, never wall-clock time
  (DESIGN 4.8).

Dirty keys are *net* changes since a baseline. Tracking costs a little on
every assignment, so it is on only while someone needs the changes:
``clear_dirty()`` makes the current state the baseline and starts tracking
(``KeyedState(track_dirty=True)`` tracks from creation, the empty store
being the baseline), ``stop_tracking()`` ends it; ``restore``,
``install_chunk`` and ``apply_delta`` leave nothing dirty. While tracking, a
key assigned since the baseline is dirty; a key that was present at the
baseline and has been deleted is dirty as deleted (a tombstone); a key
created and deleted again since the baseline is not dirty at all (whoever
holds the baseline never saw it), which keeps the record no bigger than the
baseline plus the live keys.

Moving a big state without stalling (what catch-up does)::

    # t0, on the sender, between two inputs:
    pieces = state.parts(8192)    # the keys as of t0, values read as each part goes ...
    state.clear_dirty()           # ... and the baseline for the changes after it
    # phase 1: send each piece while the partition keeps processing;
    #          the receiver calls install_part(keys, values) as pieces arrive
    # phase 2: quiesce, send state.delta() (the keys changed since t0);
    #          the receiver calls apply_delta(delta) and now equals the sender

A key changed after t0 may go in phase 1 with its old or its new value: it is
dirty, so the delta sets it anyway; a key deleted after t0 is left out or sent
and then deleted by the delta. ``chunks`` gives a consistent, key-ordered
snapshot instead (a copy and a sort: for checkpoints and tests).

``snapshot()`` + ``delta()`` since it, applied to an empty store, give the
final state; incremental checkpoints (DESIGN 10) are the same two pieces
with a full snapshot every few checkpoints. They keep a second record of
their own (``start_changes``, ``changes``, ``stop_changes``), with the same
meaning as the dirty keys: a catch-up and a checkpoint overlap (the replica
that writes checkpoints is often the one that sends a catch-up), and each
needs its own baseline. Installing anything (``restore``, ``install_chunk``,
``install_part``, ``apply_delta``) ends that record: the state then came
from elsewhere, so the next checkpoint of this store must be whole.

Pure: no I/O, no clock, no randomness.
"""
from __future__ import annotations

from itertools import repeat
from operator import is_
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

import msgpack


def tuplify(value: Any) -> Any:
    """Turn lists back into tuples, recursively, so a key that crossed msgpack is hashable again."""
    if isinstance(value, (list, tuple)):
        return tuple(tuplify(v) for v in value)
    return value


def _msgpack_order(key: Any) -> bytes:
    return msgpack.packb(key, use_bin_type=True)


def sorted_keys(keys: Iterable[Any]) -> list:
    """``keys`` in key order: Python's, or msgpack bytes' when they cannot be compared."""
    keys = list(keys)
    try:
        return sorted(keys)
    except TypeError:
        return sorted(keys, key=_msgpack_order)


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

_MISSING = object()


class KeyedState:
    """Per-key values with iteration in key order and dirty-key tracking.

    Dict-like: ``get``, ``[]``, ``[]=``, ``del``, ``pop``, ``in``, ``len``,
    ``setdefault``. ``keys()``/``items()`` are in key order; the order is
    sorted lazily and cached until a key is added or removed.

    Snapshots and deltas are msgpack-safe:

    - ``snapshot()``: ``[[key, value], ...]`` in key order, exactly what
      ``flux.operator.keyed_state(dict)`` gives;
    - ``chunks(n)``: the same pairs in key-ordered slices of at most ``n``;
    - ``delta()``: ``{"set": [[key, value], ...], "deleted": [key, ...]}``,
      the dirty keys in key order.

    ``restore(pairs)`` replaces the whole state, ``install_chunk(pairs)``
    adds a slice, ``apply_delta(delta)`` applies a delta; each leaves
    nothing dirty. ``decode``, if given, is applied to every value they
    install (values that crossed msgpack).

    Dirty keys are tracked after ``clear_dirty()`` (or from creation with
    ``track_dirty=True``) until ``stop_tracking()``; see the module's docstring.
    """

    __slots__ = ("_data", "_dirty", "_since", "_order", "decode")

    def __init__(self, pairs: Iterable | None = None,
                 decode: Callable[[Any], Any] | None = None, track_dirty: bool = False):
        self._data: dict = {}
        # None when not tracking; else key -> True if the key was present at
        # the baseline (its deletion must be reported), False if created since.
        self._dirty: Optional[dict] = {} if track_dirty else None
        # The same, since this replica's last checkpoint snapshot (None: not recorded).
        self._since: Optional[dict] = None
        self._order: Optional[list] = None  # the sorted keys, None when stale
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
        if self._order is None and self._dirty is None and self._since is None:
            # The hot path: no cached order to invalidate, no changes to record.
            try:
                self._data[key] = value
            except TypeError:  # unhashable: a key with lists in it
                self._data[tuplify(key)] = value
            return
        try:
            hash(key)
        except TypeError:
            key = tuplify(key)
        new = key not in self._data
        if new:
            self._order = None
        if self._dirty is not None:
            self._dirty.setdefault(key, not new)
        if self._since is not None:
            self._since.setdefault(key, not new)
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
        for record in (self._dirty, self._since):
            if record is not None and record.setdefault(key, True) is False:
                del record[key]  # created and deleted since the baseline: no net change
        return value

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

    def items(self) -> list:
        """``(key, value)`` pairs in key order."""
        data = self._data
        return [(key, data[key]) for key in self.keys()]

    def values(self) -> list:
        """The values in key order."""
        data = self._data
        return [data[key] for key in self.keys()]

    # --- dirty keys -----------------------------------------------------------

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

    # --- snapshots and deltas ------------------------------------------------

    def snapshot(self) -> list:
        """The whole state as ``[[key, value], ...]`` in key order (msgpack-safe)."""
        data = self._data
        return [[key, data[key]] for key in self.keys()]

    def chunks(self, max_pairs: int) -> Iterator[list]:
        """``snapshot()`` cut into key-ordered slices of at most ``max_pairs`` pairs.

        The snapshot is taken when ``chunks`` is called: the store may change
        while the slices are consumed (values are never mutated in place, so a
        shallow copy is a consistent snapshot)."""
        if max_pairs < 1:
            raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
        return _slices(self.keys(), dict(self._data), max_pairs)

    def parts(self, max_keys: int) -> Iterator[tuple]:
        """The state in slices of at most ``max_keys`` keys, as ``(keys, values)`` lists:
        the keys present now (in insertion order, unsorted), each slice's values read when
        the slice is taken. Not a snapshot: a value changed meanwhile goes as it is then,
        a key deleted meanwhile is left out. Call ``clear_dirty()`` together with
        ``parts()``: the delta then carries every change made after, and the slices plus
        the delta rebuild the state exactly (catch-up). Unlike ``chunks`` it
        neither sorts nor copies the store nor builds a list per pair: 100 MB of keys
        move at C speed."""
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        return _parts(self, list(self._data), max_keys)

    def delta(self) -> dict:
        """The changes since the baseline: ``{"set": [[key, value], ...], "deleted": [key, ...]}``,
        both in key order (msgpack-safe)."""
        return _delta(self._data, self._tracked())

    # --- changes since the last checkpoint snapshot (DESIGN 10) ------------------------

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
        return _delta(self._data, self._since)

    def stop_changes(self) -> None:
        """Stop recording the changes since a checkpoint (the next one must be whole)."""
        self._since = None

    def restore(self, pairs: Iterable | None) -> None:
        """Replace the whole state by ``pairs`` (a snapshot, possibly after msgpack)."""
        self._data = {}
        self._order = None
        if self._dirty is not None:
            self._dirty = {}
        self.install_chunk(pairs)

    def install_chunk(self, pairs: Iterable | None) -> None:
        """Add the ``[key, value]`` pairs of one slice of a snapshot; they are not dirty."""
        data, dirty, decode = self._data, self._dirty, self.decode
        self._since = None  # the state came from elsewhere: no checkpoint baseline holds
        for key, value in pairs or ():
            key = tuplify(key)
            data[key] = decode(value) if decode is not None else value
            if dirty:
                dirty.pop(key, None)
        self._order = None

    def install_part(self, keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Add one slice of ``parts()`` (keys and values as lists, or tuples); not dirty."""
        if len(keys) != len(values):
            raise ValueError(f"a part of {len(keys)} keys and {len(values)} values")
        if self.decode is None and not self._dirty:
            try:
                self._data.update(zip(keys, values))  # one C call
                self._order = self._since = None
                return
            except TypeError:  # unhashable: keys with lists in them (they crossed msgpack)
                pass
        self.install_chunk(zip(keys, values))

    def apply_delta(self, delta: dict) -> None:
        """Apply a ``delta()`` (possibly after msgpack); the result is the new baseline."""
        self.install_chunk(delta.get("set"))
        data = self._data
        for key in delta.get("deleted") or ():
            data.pop(tuplify(key), None)
        self._order = None
        if self._dirty is not None:
            self._dirty = {}

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


def _delta(data: dict, record: dict) -> dict:
    changed, deleted = [], []
    for key in sorted_keys(record):
        value = data.get(key, _MISSING)
        if value is _MISSING:
            deleted.append(key)
        else:
            changed.append([key, value])
    return {"set": changed, "deleted": deleted}


def _slices(order: List[Any], data: dict, size: int) -> Iterator[list]:
    for start in range(0, len(order), size):
        yield [[key, data[key]] for key in order[start:start + size]]


def _parts(store: KeyedState, keys: List[Any], size: int) -> Iterator[tuple]:
    for start in range(0, len(keys), size):
        part = keys[start:start + size]
        values = list(map(store._data.get, part, repeat(_MISSING, len(part))))
        if any(map(is_, values, repeat(_MISSING, len(values)))):  # deleted since the call
            kept = [(k, v) for k, v in zip(part, values) if v is not _MISSING]
            part, values = [k for k, _ in kept], [v for _, v in kept]
        yield part, values


class KeyedOperator:
    """Mixin: an operator whose state is the ``KeyedState`` in ``self.state``
    gets ``get_state()`` (its snapshot) and ``install_state()`` (a restore)."""

    state: KeyedState

    def get_state(self) -> list:
        """Sorted ``[key, value]`` pairs (``KeyedState.snapshot``)."""
        return self.state.snapshot()

    def install_state(self, state: list | None) -> None:
        self.state.restore(state)


def keyed_state_of(op: Any) -> Optional[KeyedState]:
    """The ``KeyedState`` that holds ``op``'s whole state, or None if it keeps its own."""
    if isinstance(op, KeyedOperator):
        state = getattr(op, "state", None)
        if isinstance(state, KeyedState):
            return state
    return None
