"""How many rows a producer routed to each key group of the next stage (DESIGN 13).

The rebalancing policy moves the groups that carry the load, not a share of a hot
partition's groups taken as equally loaded: it needs each group's rate. Routing already
computes every row's group, so the producer counts them there (a ``bincount`` per item)
and reports the totals with its other counters; the driver adds the producers' up per
stage (the larger of each pair's two, which route the same rows).
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np


class GroupLoad:
    """Rows routed per key group since the replica was built (a rebuilt one starts at
    zero, as its other counters do)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: Optional[np.ndarray] = None

    def add(self, groups: np.ndarray, key_groups: int) -> None:
        """Count an item's rows by their groups (each in ``0 .. key_groups - 1``)."""
        counted = np.bincount(groups, minlength=key_groups)
        if self.counts is None or self.counts.shape != counted.shape:
            self.counts = counted
        else:
            self.counts += counted

    def totals(self) -> Tuple[int, ...]:
        """The counts per group (empty: no row routed by key groups yet)."""
        return () if self.counts is None else tuple(self.counts.tolist())
