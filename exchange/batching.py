"""When a connection's pending tuples should go out as one batch.

One tuple per message costs about ten times a batched one (SPARK_NOTES), so
producers send batches: a batch leaves when it is full, or when its oldest
tuple has waited ``max_delay`` seconds, so a slow stream still flows. The
policy is pure: the caller passes the clock in. The simulator needs no
policy: its scheduler decides when a flush happens, including at any size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class BatchPolicy:
    max_items: int = 512
    max_delay: float = 0.002

    def __post_init__(self):
        if not isinstance(self.max_items, int) or self.max_items < 1:
            raise ValueError(f"max_items must be a positive int, got {self.max_items!r}")
        if not self.max_delay >= 0:
            raise ValueError(f"max_delay must be >= 0 seconds, got {self.max_delay!r}")

    def due(self, pending: int, oldest_at: Optional[float], now: float) -> bool:
        """Send now? ``oldest_at`` is when the oldest pending tuple became ready."""
        if pending <= 0:
            return False
        if pending >= self.max_items:
            return True
        return oldest_at is not None and now - oldest_at >= self.max_delay

    def deadline(self, oldest_at: Optional[float]) -> Optional[float]:
        """When a partial batch becomes due (for the poll timeout), or None if nothing waits."""
        return None if oldest_at is None else oldest_at + self.max_delay
