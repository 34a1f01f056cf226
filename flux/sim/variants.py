"""Deliberately broken protocol variants: proof that the oracle can fail.

Each is a one-rule change to the buffer. The simulator must report a
violation for each, with a seed that reproduces it.
"""
from __future__ import annotations

from bisect import bisect_right

from flux.buffer import PRIM, Buffer


class BufferWithoutDuplicateFilter(Buffer):
    """Sends from its own cursor only, ignoring what the destination already holds."""

    def _next_index(self, dest: int) -> int:
        return bisect_right(self._sns, self.sent[dest], lo=self._head)


class BufferEvictingBeforeDualAck(Buffer):
    """Evicts a tuple once the primary holds it, without the secondary's ack (5.1 broken)."""

    def _evict(self) -> None:
        delete = self.delete
        self.delete = delete & {PRIM} or delete
        try:
            super()._evict()
        finally:
            self.delete = delete

    def check_invariants(self) -> None:
        pass  # its eviction rule is the bug under test, not a broken invariant


VARIANTS = {
    "none": Buffer,
    "no-dup-filter": BufferWithoutDuplicateFilter,
    "early-evict": BufferEvictingBeforeDualAck,
}
