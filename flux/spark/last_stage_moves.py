"""The driver's rules for live moves of the last stage's key groups with a sink per
partition (docs/design/rescaling.md; modelled first in ``flux/sim/sink_moves.py``).

A move of the last stage's groups changes its keys' sink partition at its cut, and the
sinks commit ahead of the cuts: the two partitions' egresses hold what is past the cut
until a complete checkpoint covers it (``Egress.holds``; the controller tells them each
completion, ``CheckpointDone``). The driver's part:

- *one at a time*: no checkpoint is cut while one whose cut moved the last stage is not
  complete (a replica told two cuts at once crosses only the newer; the older would
  never complete and the newer would wait for a held commit);
- *stuck*: one that does not complete in ``stuck_after`` seconds (a write failed; both
  replicas of each pair write its snapshots, so the death of one does not keep it open)
  restarts the job from the newest complete checkpoint, before the move
  (``MoveCheckpointStuck``);
- *floor*: after a restart, a move of the last stage is cut only past the furthest
  output a sink held (the replay makes those again by the map before the move);
- *no way back*: once a checkpoint covering such a move is complete, no restart
  restores an older one (``covered``).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Sequence, Tuple

from exchange.group_map import changes_owners_of

log = logging.getLogger(__name__)

#: the least time a move's checkpoint may take before the job restarts (and ten
#: checkpoint intervals at least)
STUCK_AFTER = 30.0


class MoveCheckpointStuck(RuntimeError):
    """The checkpoint of a live move of the last stage's key groups did not complete:
    the job restarts from the newest complete one (the two partitions' sinks hold
    nothing past the move's cut)."""


class LastStageMoves:
    """What the driver keeps of the last stage's moves (inert with one ordered egress)."""

    def __init__(self, stages: int, sinks_apart: bool, interval: float,
                 clock: Callable[[], float] = time.monotonic):
        self.last, self.apart, self.clock = stages, sinks_apart, clock
        self.stuck_after = max(STUCK_AFTER, 10 * interval)
        #: the checkpoint whose cut moved the last stage, not complete yet, and when cut
        self.open: Optional[Tuple[int, float]] = None
        #: after a restart: the furthest input an output the sinks held derives from
        self.floor: Any = 0
        #: the newest complete checkpoint that covers such a move (None: none)
        self.covered: Optional[int] = None

    def moves_last(self, moves: Sequence[Any]) -> bool:
        """Do ``moves`` change the last stage's owners, with a sink per partition?"""
        return self.apart and changes_owners_of(moves, self.last)

    def may_move(self, position: Any) -> bool:
        """May a cut at ``position`` (an input's number, or an SN with splits) move the
        last stage?"""
        return not self.apart or position > self.floor

    def cut(self, number: int, moves: Sequence[Any]) -> None:
        """Checkpoint ``number``'s cut carries ``moves``."""
        if self.moves_last(moves):
            self.open = (number, self.clock())

    def blocks_cut(self) -> bool:
        """No checkpoint may be cut now; raises ``MoveCheckpointStuck`` once the open one
        waited past ``stuck_after``."""
        if self.open is None:
            return False
        number, since = self.open
        if self.clock() - since > self.stuck_after:
            raise MoveCheckpointStuck(
                f"checkpoint {number}, whose cut moved key groups of the last stage, did "
                f"not complete in {self.stuck_after:.0f}s: restarting from the newest "
                f"complete checkpoint")
        return True

    def completed(self, number: int) -> None:
        """Checkpoint ``number`` is complete."""
        if self.open is not None and number >= self.open[0]:
            self.covered, self.open = number, None

    def restarted(self, sink_holds: Optional[tuple]) -> None:
        """The job restarts; ``sink_holds``: the SN of the furthest output any sink holds
        (None: none)."""
        self.open = None
        self.floor = sink_holds[0] if sink_holds else 0
