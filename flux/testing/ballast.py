"""An operator that carries state of a chosen size: for measuring catch-up.

The paper's failover experiment moves 8.5 MB per partition (5.4). ``Ballast``
passes every record on unchanged and keeps ``mb`` megabytes of keyed state
(about 83 bytes of msgpack per key, like the paper's session table), built the
same way in every replica; each record rewrites one key, so the state keeps
changing while it moves. Its state is a ``KeyedState`` (so catch-up streams its bulk
and pauses only for the keys changed meanwhile).
"""
from __future__ import annotations

import zlib
from typing import Any, List

import msgpack

from flux.keyed_state import KeyedOperator, KeyedState

#: msgpack bytes of one key and its value in ``get_state`` (checked by the tests)
BYTES_PER_KEY = 83


def _value(key: int, version: int) -> str:
    return f"{key:012d}-{version:010d}-" + "x" * 52


#: ``_value(key, 0) == _FIRST % key``: the first values, made by C loops (a 100 MB
#: Ballast is built by every replica, and by a re-run task while a catch-up goes on)
_FIRST = "%012d-0000000000-" + "x" * 52
#: keys per C loop: a C loop holds the GIL throughout, and the process's heartbeat
#: thread must run every few milliseconds (one loop over 1.2M keys silenced it for 0.5 s)
_SLICE = 8192


class Ballast(KeyedOperator):
    def __init__(self, mb: float = 8.5):
        if mb < 0:
            raise ValueError(f"mb must be >= 0, got {mb}")
        self.keys = int(mb * 1_000_000 / BYTES_PER_KEY)
        self.state = KeyedState()
        for start in range(0, self.keys, _SLICE):
            keys = range(start, min(start + _SLICE, self.keys))
            self.state.install_part(keys, list(map(_FIRST.__mod__, keys)))

    def process(self, record: Any) -> List[Any]:
        if self.keys:
            key = zlib.crc32(msgpack.packb(record, use_bin_type=True)) % self.keys
            self.state[key] = _value(key, int(self.state[key][13:23]) + 1)
        return [record]
