"""Keyed state of a chosen size that a rescale can split: for measuring restores.

``Ballast`` keeps filler keys of its own (any partition's, built in the constructor): a
rescale refuses it, as it refuses any store not keyed by its stage's key. ``KeyedPayload``
keeps one value of ``value_bytes`` per key its records bring, under that key (the
stage's key, the record's first field): ``keys`` records of distinct keys make about
``keys * (value_bytes + 13)`` bytes of msgpack state in all, split over the partitions
by key group.
"""
from __future__ import annotations

from typing import Any, List, Sequence

from flux.keyed_state import KeyedOperator, KeyedState, tuplify


def payload_records(keys: int, then: int = 0, seed: int = 3) -> List[tuple]:
    """``keys`` records of distinct keys ``("u0000000", 0)``, ..., then ``then`` records
    of keys among them, each with the next version of its key."""
    import random

    rng = random.Random(seed)
    records = [(f"u{k:07d}", 0) for k in range(keys)]
    records += [(f"u{rng.randrange(keys):07d}", 1 + i) for i in range(then)]
    return records


class KeyedPayload(KeyedOperator):
    """Per key, the value ``"<version>-xxx..."`` of ``value_bytes`` characters; each record
    ``(key, version)`` replaces it and emits ``(key, version)``."""

    def __init__(self, value_bytes: int = 240):
        if value_bytes < 16:
            raise ValueError(f"value_bytes must be >= 16, got {value_bytes}")
        self.value_bytes = value_bytes
        self.state = KeyedState()

    def process(self, record: Sequence[Any]) -> list:
        key, version = tuplify(record[0]), record[1]
        self.state[key] = f"{version:015d}-".ljust(self.value_bytes, "x")
        return [(key, version)]
