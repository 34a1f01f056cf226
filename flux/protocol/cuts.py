"""The checkpoint cuts a consumer knows and has not crossed yet (DESIGN 10).

A cut ``(k, n)`` (checkpoint ``k`` covers inputs 1..n) travels with the data:
every batch carries the newest cut its producer knows (``Batch.cut``). A
consumer learns of it before it can release any tuple derived from an input
beyond ``n`` (such a tuple was produced after its producer learned the cut,
and FIFO brings the stamp first; docs/design/checkpoints.md), and it *crosses* the
cut when its merge can release nothing derived from inputs up to ``n`` any
more: then a segment snapshots its operators, the egress has the sink commit.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from flux.sequence import SN, bound_key

Cut = Tuple[int, int]


class Cuts:
    def __init__(self) -> None:
        self.latest: Optional[Cut] = None
        self.pending: Dict[int, int] = {}  # checkpoint -> its cut, not crossed yet

    def learn(self, cut: Optional[Cut]) -> None:
        """A batch said ``cut``; a newer one than any known is pending from now."""
        if cut is None:
            return
        k, n = cut
        if self.latest is None or k > self.latest[0]:
            self.latest = (k, n)
            self.pending[k] = n

    def due(self, frontier: SN) -> Optional[Cut]:
        """The oldest pending cut the merge's ``frontier`` has passed, or None."""
        for k in sorted(self.pending):
            n = self.pending[k]
            if bound_key(frontier) >= bound_key((n,)):
                return (k, n)
            return None  # cuts are crossed in order
        return None

    def crossed(self, k: int) -> None:
        del self.pending[k]

    def to_state(self) -> List:
        return [list(self.latest) if self.latest else None,
                [[k, n] for k, n in sorted(self.pending.items())]]

    def install_state(self, state) -> None:
        latest, pending = state
        self.latest = tuple(latest) if latest else None
        self.pending = {k: n for k, n in pending}
