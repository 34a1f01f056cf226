"""A node's side of a live move of key groups (DESIGN 13): what it reports of a range.

A source replica's pack goes to the controller, which hands it on; it travels in one
frame, so one larger than ``RANGE_LIMIT`` stops the job with an error saying so (both
replicas would pack it: a failover cannot help). A destination replica that crossed the
move's cut without its range processes nothing past the cut until it installed it:
the seconds between go with its install's report (``RangeInstalled.waited``), the
pause a live move costs that partition.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, Optional

from exchange.wire import MAX_FRAME
from flux.control_messages import RangePacked
from flux.effects import RangeAwaited
from flux.errors import OperatorError

#: the largest range a live move carries (it travels in one frame, ``exchange.wire``)
RANGE_LIMIT = MAX_FRAME - (1 << 20)


class RangeTiming:
    """When each destination replica here began to wait for its range."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.awaiting: Dict[tuple, float] = {}

    def effect(self, e) -> Optional[object]:
        """What to report to the controller of a move's effect (None: nothing)."""
        if isinstance(e, RangePacked):
            return _fits(e)
        if isinstance(e, RangeAwaited):
            self.awaiting[e.addr, e.number, e.move] = self.clock()
            return None
        since = self.awaiting.pop((e.addr, e.number, e.move), None)
        return e if since is None else replace(e, waited=self.clock() - since)


def _fits(e: RangePacked) -> RangePacked:
    if len(e.data) > RANGE_LIMIT:
        m = e.move
        raise OperatorError(
            f"the live move of key groups {m.first}..{m.last} to partition {m.dest}",
            m.stage, m.source, (), f"the range packs {len(e.data) >> 20} MiB, more than the "
            f"{RANGE_LIMIT >> 20} MiB one move may carry: move fewer key groups at a time")
    return e


__all__ = ["RangeTiming", "RANGE_LIMIT"]
