"""The outputs a job keeps (``keep_output``), off the garbage collector's books.

Outputs arrive as ``(sn, record)`` pairs whose records are lists (msgpack's form),
containers the collector tracks for as long as they live. Millions of them kept in the
driver make every full collection walk them all: measured on the throughput job with 5M
inputs, full collections of up to 2.5 s, during which the controller's thread (in the same
interpreter) does not turn, nodes go unheard, and a stall past the lease stops them (a
lost pair). So the outputs are kept as pickled chunks, bytes the collector never walks,
and unpickled when read: pickle gives back exactly what was kept (tuples stay tuples,
lists lists), and the chunks take a fraction of the objects' memory.

The egress's thread appends while the user's reads: a lock keeps every read a consistent
prefix (no output seen twice while a chunk is packed).
"""
from __future__ import annotations

import pickle
import threading
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any, Iterable, Iterator, List

#: outputs per pickled chunk: the newest (at most this many) stay objects until then
CHUNK = 4096


class KeptOutputs(Sequence):
    """A sequence of outputs, appended in order, read by index, slice or iteration."""

    def __init__(self, chunk: int = CHUNK):
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk!r}")
        self._chunk = chunk
        self._packed: List[bytes] = []
        #: outputs before each packed chunk (ascending), and in all of them
        self._starts: List[int] = []
        self._packed_count = 0
        self._tail: List[Any] = []
        self._lock = threading.Lock()

    def extend(self, items: Iterable[Any]) -> None:
        items = list(items)
        with self._lock:
            self._tail.extend(items)
            while len(self._tail) >= self._chunk:
                self._pack(self._tail[:self._chunk])
                del self._tail[:self._chunk]

    def append(self, item: Any) -> None:
        self.extend((item,))

    def _pack(self, items: List[Any]) -> None:
        self._starts.append(self._packed_count)
        self._packed.append(pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL))
        self._packed_count += len(items)

    def __len__(self) -> int:
        with self._lock:
            return self._count()

    def _count(self) -> int:
        return self._packed_count + len(self._tail)

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            packed, tail = list(self._packed), list(self._tail)
        for chunk in packed:
            yield from pickle.loads(chunk)
        yield from tail

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(self)[index]
        if not isinstance(index, int):
            raise TypeError(f"outputs are indexed by int or slice, not {type(index).__name__}")
        with self._lock:
            n = self._count()
            if index < 0:
                index += n
            if not 0 <= index < n:
                raise IndexError(f"output {index} of {n}")
            if index >= self._packed_count:
                return self._tail[index - self._packed_count]
            c = bisect_right(self._starts, index) - 1
            chunk, first = self._packed[c], self._starts[c]
        return pickle.loads(chunk)[index - first]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (KeptOutputs, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # mutable, as a list

    def __repr__(self) -> str:
        return f"KeptOutputs({len(self)} outputs)"
