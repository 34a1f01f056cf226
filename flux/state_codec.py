"""A segment's state as a stream of small msgpack objects.

``msgpack.packb`` of a 100 MB state, or ``unpackb`` of it, is one C call that
holds the GIL for seconds (unpacking 3.7 MB of 100K keyed pairs took 0.3 s
here): no other thread of the process runs meanwhile, its heartbeats
included. So a state is packed as a stream: every large list or dict
(``[key, value]`` pairs of keyed state, a hand-made table) is cut into slices
of ``SLICE`` entries, each a msgpack object of its own, and the rest of the
state (the skeleton) refers to them in order. Between two slices the
interpreter lets other threads run. The same state always gives the same
bytes, and decoding gives what one ``unpackb`` would (tuples come back as
lists, DESIGN 4.1).

Layout: the skeleton, with each large container replaced by an ext value
``(kind, length)`` in depth-first order; then, per container in that order,
its entries in slices (a dict's as ``[key, value]`` pairs). Pure (DESIGN 3).
"""
from __future__ import annotations

import contextlib
import gc
from typing import Any, Iterator, List

import msgpack

#: entries per slice: small enough for a C call of about a millisecond
SLICE = 2048
#: ext type codes of the references to containers sent in slices
LIST_REF, DICT_REF = 17, 18


@contextlib.contextmanager
def paused_gc():
    """Pause the cyclic garbage collector while a state is built or taken apart.

    Building 100K small lists makes the collector walk every object the process
    holds, again and again, in pauses that hold the GIL (155 ms of 486 ms for a
    3.7 MB state here; without it 67 ms in all, no pause over 8 ms). State is
    acyclic data: the collector has nothing to find in it. Reference counting
    still frees everything; the collector resumes afterwards as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class StateCodecError(ValueError):
    """Bytes that are not a state stream."""


def pack_part(index: int, keys: list, values: list) -> bytes:
    """One bulk part of operator ``index``'s keyed store (``KeyedState.parts``): its keys
    and its values packed apart, so that the receiver gets the keys back as tuples
    (hashable, no per-key conversion) and the values in wire form (lists, DESIGN 4.1).
    A part is small (thousands of keys): one C call each way."""
    return msgpack.packb([index, msgpack.packb(keys, use_bin_type=True),
                          msgpack.packb(values, use_bin_type=True)], use_bin_type=True)


def unpack_part(data: bytes) -> tuple:
    """``(index, keys, values)`` of a ``pack_part``; StateCodecError if it is not one."""
    try:
        index, keys, values = msgpack.unpackb(data, raw=False)
        if type(index) is not int or not isinstance(keys, bytes) or not isinstance(values, bytes):
            raise StateCodecError(f"not a bulk part: {type(index).__name__}, "
                                  f"{type(keys).__name__}, {type(values).__name__}")
        keys = msgpack.unpackb(keys, raw=False, use_list=False, strict_map_key=False)
        values = msgpack.unpackb(values, raw=False, strict_map_key=False)
    except StateCodecError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise StateCodecError(f"not a bulk part: {exc}") from None
    if not isinstance(keys, tuple) or not isinstance(values, list) or len(keys) != len(values):
        raise StateCodecError("a bulk part whose keys and values do not match")
    return index, keys, values


class _Ref:
    __slots__ = ("kind", "length")

    def __init__(self, kind: int, length: int):
        self.kind, self.length = kind, length


def _skeleton(value: Any, large: List[Any]) -> Any:
    """``value`` with every large container replaced by a reference (appended to ``large``)."""
    if isinstance(value, (list, tuple)):
        if len(value) > SLICE:
            large.append(value)
            return msgpack.ExtType(LIST_REF, msgpack.packb(len(value)))
        return [_skeleton(v, large) for v in value]
    if isinstance(value, dict):
        if len(value) > SLICE:
            large.append(value)
            return msgpack.ExtType(DICT_REF, msgpack.packb(len(value)))
        return {k: _skeleton(v, large) for k, v in value.items()}
    return value


def pack_state(state: Any) -> bytes:
    """``state`` as a stream of small msgpack objects."""
    packer = msgpack.Packer(use_bin_type=True)
    large: List[Any] = []
    parts = [packer.pack(_skeleton(state, large))]
    for container in large:  # entries are small: not walked again
        entries = list(container.items()) if isinstance(container, dict) else container
        for i in range(0, len(entries), SLICE):
            parts.append(packer.pack(entries[i:i + SLICE]))
    return b"".join(parts)


def _ext(code: int, data: bytes) -> Any:
    if code in (LIST_REF, DICT_REF):
        return _Ref(code, msgpack.unpackb(data))
    return msgpack.ExtType(code, data)


def unpack_state(data: bytes) -> Any:
    """The state ``pack_state`` packed, decoded slice by slice."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=_ext,
                                max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    objects: Iterator[Any] = iter(unpacker)
    try:
        skeleton = next(objects)
    except StopIteration:
        raise StateCodecError("an empty state stream") from None
    refs: List[_Ref] = []
    _collect(skeleton, refs)
    filled = {}
    for ref in refs:
        entries: list = []
        while len(entries) < ref.length:
            piece = next(objects, None)
            if not isinstance(piece, list):
                raise StateCodecError(f"a container of {ref.length} entries ends after "
                                      f"{len(entries)}")
            entries.extend(piece)
        if len(entries) != ref.length:
            raise StateCodecError(f"a container of {ref.length} entries got {len(entries)}")
        filled[id(ref)] = entries if ref.kind == LIST_REF else {k: v for k, v in entries}
    if next(objects, None) is not None:
        raise StateCodecError("bytes after the end of the state")
    return _fill(skeleton, filled)


def _collect(value: Any, refs: List[_Ref]) -> None:
    if isinstance(value, _Ref):
        refs.append(value)
    elif isinstance(value, list):
        for v in value:
            _collect(v, refs)
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, refs)


def _fill(value: Any, filled: dict) -> Any:
    if isinstance(value, _Ref):
        return filled[id(value)]
    if isinstance(value, list):
        return [_fill(v, filled) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, filled) for k, v in value.items()}
    return value
