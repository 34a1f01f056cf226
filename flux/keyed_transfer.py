"""A ``KeyedState`` taken out and put in: snapshots, slices, bulk parts and deltas.

What leaves a store is msgpack-safe:

- ``snapshot()``: ``[[key, value], ...]`` in key order, exactly what
  ``flux.operator.keyed_state(dict)`` gives (``get_state`` of a ``KeyedOperator``);
- ``chunks(n)``: the same pairs in key-ordered slices of at most ``n``
  (a consistent snapshot: a copy and a sort, for checkpoints and tests);
- ``parts(n)``: the keys present now with their values as each part is taken
  (not a snapshot: what catch-up streams, at C speed);
- ``delta()`` (``flux.keyed_changes``): ``{"set": [[key, value], ...],
  "deleted": [key, ...]}``, the dirty keys in key order.

``restore(pairs)`` replaces the whole state, ``install_chunk(pairs)`` and
``install_part(keys, values)`` add a slice, ``apply_delta(delta)`` applies a
delta; each leaves nothing dirty. The store's ``decode``, if given, is
applied to every value they install (values that crossed msgpack).

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
and then deleted by the delta. ``snapshot()`` + ``delta()`` since it, applied
to an empty store, give the final state; incremental checkpoints (DESIGN 10)
are the same two pieces (``changes()``), with a full snapshot every few
checkpoints. Pure: no I/O.
"""
from __future__ import annotations

from itertools import repeat
from operator import is_
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

from flux.keys import MISSING, tuplify


class StateTransfer:
    """``KeyedState``'s ways out and in (a base class, not used alone)."""

    __slots__ = ()
    _data: dict
    _dirty: Optional[dict]
    _since: Optional[dict]
    _order: Optional[list]
    #: how many times state came in from elsewhere (an index kept beside the store, e.g.
    #: of timers, is rebuilt when it moved)
    installs: int
    decode: Optional[Callable[[Any], Any]]
    keys: Callable[[], list]  # KeyedState's: the keys in key order

    # --- out --------------------------------------------------------------------------

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

    # --- in ---------------------------------------------------------------------------

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
        self.installs += 1
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
                self.installs += 1
                return
            except TypeError:  # unhashable: keys with lists in them (they crossed msgpack)
                pass
        self.install_chunk(zip(keys, values))

    # -- a live move of key groups (DESIGN 13): changes like any other --------------
    def held_keys(self) -> list:
        return list(self._data)

    def read_keys(self, keys: Sequence[Any]) -> tuple:
        """``(held, values)``: those of ``keys`` held, and their values."""
        data = self._data
        held = [k for k in keys if k in data]
        return held, [data[k] for k in held]

    def take_keys(self, keys: Sequence[Any]) -> tuple:
        """Take ``keys`` out (a range moving away): ``read_keys``'s, each deletion a
        change (catch-up's delta and the next snapshot's delta carry it)."""
        held, values = self.read_keys(keys)
        for key in held:
            self.pop(key)
        self.installs += 1  # an index beside the store is rebuilt
        return held, values

    def put_keys(self, keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Add a range that moved here (as it came off the wire), each key a change."""
        decode = self.decode
        for key, value in zip(keys, values):
            self[tuplify(key)] = decode(value) if decode is not None else value
        self.installs += 1

    def apply_delta(self, delta: dict) -> None:
        """Apply a ``delta()`` (possibly after msgpack); the result is the new baseline."""
        self.install_chunk(delta.get("set"))
        data = self._data
        for key in delta.get("deleted") or ():
            data.pop(tuplify(key), None)
        self._order = None
        if self._dirty is not None:
            self._dirty = {}


def _slices(order: List[Any], data: dict, size: int) -> Iterator[list]:
    for start in range(0, len(order), size):
        yield [[key, data[key]] for key in order[start:start + size]]


def _parts(store: StateTransfer, keys: List[Any], size: int) -> Iterator[tuple]:
    for start in range(0, len(keys), size):
        part = keys[start:start + size]
        values = list(map(store._data.get, part, repeat(MISSING, len(part))))
        if any(map(is_, values, repeat(MISSING, len(values)))):  # deleted since the call
            kept = [(k, v) for k, v in zip(part, values) if v is not MISSING]
            part, values = [k for k, _ in kept], [v for _, v in kept]
        yield part, values
