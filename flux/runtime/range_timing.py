"""A node's side of a live move of key groups (DESIGN 13): what it reports of a range.

A source replica's pack goes to the controller, which hands it on; it travels in one
frame, so one larger than ``RANGE_LIMIT`` stops the job with an error saying so (both
replicas would pack it: a failover cannot help). A destination replica that crossed the
move's cut without its range processes nothing past the cut until it installed it:
the seconds from the step that crossed the cut to the end of the install go with its
install's report (``RangeInstalled.waited``): the pause a live move costs that
partition. A source replica's pack carries the seconds of the step that packed it,
or for a prepare's bulk (packed off the loop) that kept it (``RangePacked.took``):
the pause it costs the source.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Optional

from exchange.wire import MAX_FRAME
from flux.control_messages import InstallRange, RangePacked
from flux.effects import PackRange, RangeAwaited
from flux.errors import OperatorError
from flux.runtime.range_packer import RangePacker

#: the largest range a live move carries (it travels in one frame, ``exchange.wire``)
RANGE_LIMIT = MAX_FRAME - (1 << 20)


class RangeTiming:
    """When each destination replica here began to wait for its range; the bulks of
    prepares this node's source replicas kept, packed off the loop (``RangePacker``)."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.awaiting: Dict[tuple, float] = {}
        self.step = clock()  # when the step that may cross a cut or install began
        self.packer = RangePacker()

    def began(self, t: float) -> None:
        """A step that may cross a cut or install a range begins at ``t``."""
        self.step = t

    def delivering(self, msg) -> None:
        """A message is delivered to a segment: an install's step begins."""
        if type(msg) is InstallRange:
            self.step = self.clock()

    def effect(self, e) -> Optional[object]:
        """What to report to the controller of a move's effect (None: nothing)."""
        if isinstance(e, RangePacked):
            return replace(_fits(e), took=self.clock() - self.step)
        if isinstance(e, PackRange):
            self.packer.pack(e, self.clock() - self.step)
            return None
        if isinstance(e, RangeAwaited):
            self.awaiting[e.addr, e.number, e.move] = self.step
            return None
        since = self.awaiting.pop((e.addr, e.number, e.move), self.step)
        return replace(e, waited=self.clock() - since)

    def packed(self) -> List[RangePacked]:
        """What to report of the bulks packed since the last call (each checked for
        size)."""
        return [_fits(e) for e in self.packer.finished()]


def _fits(e: RangePacked) -> RangePacked:
    if len(e.data) > RANGE_LIMIT:
        m = e.move
        raise OperatorError(
            f"the live move of key groups {m.first}..{m.last} to partition {m.dest}",
            m.stage, m.source, (), f"the range packs {len(e.data) >> 20} MiB, more than the "
            f"{RANGE_LIMIT >> 20} MiB one move may carry: move fewer key groups at a time")
    return e


__all__ = ["RangeTiming", "RANGE_LIMIT"]
