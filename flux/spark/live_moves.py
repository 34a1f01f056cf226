"""The driver's record of live moves of key groups: what was asked, what each cut carried,
and each stage's map (DESIGN 13, docs/design/rescaling.md).

A move asked (``ask``: groups ``first..last`` of a stage to a partition) rides the next
checkpoint's cut: the source's thread turns it into one ``GroupMove`` per run of those
groups with one owner (``cut``), and the cut's checkpoint records the maps before and
after it. Until that checkpoint is complete a restart may go back to an older one, whose
map the move never changed: the asks its cuts carried are asked again (``restarted``).
A restart at another partition count (a rescale from a checkpoint) starts from
contiguous ranges; an ask whose partition is no more is dropped, with a warning.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from exchange.group_map import GroupMap, GroupMove
from flux.runtime.restore import routing_maps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoveAsked:
    """Key groups ``first..last`` of ``stage`` to partition ``dest``."""

    stage: int
    first: int
    last: int
    dest: int

    def moves(self, maps: Dict[int, GroupMap]) -> List[GroupMove]:
        """One move per run of these groups with one owner other than ``dest``."""
        out = []
        for first, last, owner in maps[self.stage].ranges():
            lo, hi = max(first, self.first), min(last, self.last)
            if lo <= hi and owner != self.dest:
                out.append(GroupMove(self.stage, lo, hi, owner, self.dest))
        return out

    def fits(self, partitions: int) -> bool:
        return self.dest < partitions

    def __str__(self) -> str:
        return (f"the move of key groups {self.first}..{self.last} of stage {self.stage} "
                f"to partition {self.dest}")


@dataclass(frozen=True)
class SpreadAsked:
    """Every stage's key groups over the first ``over`` partitions, in contiguous ranges
    (as a job of ``over`` nodes has them): a live rescale among the pairs running."""

    over: int
    key_groups: int

    def moves(self, maps: Dict[int, GroupMap]) -> List[GroupMove]:
        out: List[GroupMove] = []
        for s, groups in sorted(maps.items()):
            target = GroupMap.even(self.over, self.key_groups, groups.partitions)
            out += groups.moves_to(target, s)
        return out

    def fits(self, partitions: int) -> bool:
        return self.over <= partitions

    def __str__(self) -> str:
        return f"the spread of the key groups over {self.over} partitions"


class LiveMoves:
    """Asked from any thread; cut on the source's thread."""

    def __init__(self, stages: int, partitions: int, key_groups: int,
                 restored: Optional[dict]):
        self.stages, self.key_groups = stages, key_groups
        self._lock = threading.Lock()
        self.asked: List[MoveAsked] = []  # not carried by a cut yet
        #: checkpoint -> the asks its cut carried, until it is complete
        self.carried: Dict[int, List[MoveAsked]] = {}
        self.maps: Dict[int, GroupMap] = {}
        self.restarted(restored, partitions)

    def ask(self, asked: MoveAsked) -> None:
        with self._lock:
            self.asked.append(asked)

    def cut(self, number: int) -> Tuple[List[GroupMove], tuple]:
        """Checkpoint ``number`` is cut: the moves it carries, and the maps before and
        after them (``CheckpointCoordinator.begin``)."""
        with self._lock:
            asked, self.asked = self.asked, []
            before = dict(self.maps)
            moves: List[GroupMove] = []
            for a in asked:
                mine = a.moves(self.maps)
                for s in {m.stage for m in mine}:
                    self.maps[s] = self.maps[s].moved([m for m in mine if m.stage == s])
                moves += mine
            if asked:
                self.carried[number] = asked
            return moves, (before, dict(self.maps))

    def completed(self, number: int) -> None:
        """Checkpoint ``number`` is complete: no restart undoes the moves up to it."""
        with self._lock:
            for k in [k for k in self.carried if k <= number]:
                del self.carried[k]

    def restarted(self, manifest: Optional[dict], partitions: int) -> None:
        """The job starts again from ``manifest`` (None: the beginning) at ``partitions``:
        its maps; asks its cut did not cover come again, in order."""
        with self._lock:
            self.partitions = partitions
            self.maps = {s: GroupMap.even(partitions, self.key_groups)
                         for s in range(1, self.stages + 1)}
            self.maps.update(routing_maps(manifest, partitions))
            done = manifest["checkpoint"] if manifest is not None else 0
            again = [a for k in sorted(self.carried) if k > done for a in self.carried[k]]
            self.carried = {}
            for a in again + self.asked:
                if not a.fits(partitions):
                    log.warning("%s is dropped: the job restarted with %d partitions", a,
                                partitions)
            self.asked = [a for a in again + self.asked if a.fits(partitions)]

    def waiting_for_cut(self) -> bool:
        with self._lock:
            return bool(self.asked)

    def pending(self, number: Optional[int]) -> bool:
        """Are moves asked but not carried by a cut, or carried by one after complete
        checkpoint ``number``?"""
        with self._lock:
            return bool(self.asked) or any(number is None or k > number for k in self.carried)
