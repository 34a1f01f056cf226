"""The keys of keyed state: one form per key, one order over keys.

A key that crossed msgpack comes back with lists where it had tuples;
``tuplify`` gives it its hashable form again, so it is the same key. Keys are
ordered as Python orders them, or by their msgpack bytes when keys of mixed
types cannot be compared (the order ``flux.operator.keyed_state`` gives a
dict): both replicas of a partition, and a checkpoint, list keys alike.

Pure: no I/O.
"""
from __future__ import annotations

from typing import Any, Iterable

import msgpack

#: "no value here", where None may be a value
MISSING = object()

#: keys under which a keyed store keeps a value of its partition, not of a key: event-time
#: expiry's watermark (a 1-tuple of -inf: no user's key of 2 or more fields equals it) and
#: a stateful handler's (the empty tuple). No key group owns them: a rescale gives each
#: new partition the smallest such value of the old partitions it draws keys from, so
#: nothing expires earlier than it would have (DESIGN 13)
EXPIRY_WATERMARK = (float("-inf"),)
HANDLER_WATERMARK = ()
PARTITION_WIDE = frozenset({EXPIRY_WATERMARK, HANDLER_WATERMARK})


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
