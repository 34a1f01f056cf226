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
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from exchange.group_map import GroupMap, GroupMove
from flux.errors import RescaleRefused
from flux.rescale import check_rescalable
from flux.runtime.restore import routing_maps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoveAsked:
    """Key groups ``first..last`` of ``stage`` to partition ``dest``."""

    stage: int
    first: int
    last: int
    dest: int

    def moves(self, groups: GroupMap) -> List[GroupMove]:
        """One move per run of these groups with one owner other than ``dest``."""
        out = []
        for first, last, owner in groups.ranges():
            lo, hi = max(first, self.first), min(last, self.last)
            if lo <= hi and owner != self.dest:
                out.append(GroupMove(self.stage, lo, hi, owner, self.dest))
        return out


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
                mine = a.moves(self.maps[a.stage])
                self.maps[a.stage] = self.maps[a.stage].moved(mine)
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
            kept = [a for a in again + self.asked if a.dest < partitions]
            for a in again + self.asked:
                if a.dest >= partitions:
                    log.warning("the move of key groups %d..%d of stage %d to partition %d "
                                "is dropped: the job restarted with %d partitions",
                                a.first, a.last, a.stage, a.dest, partitions)
            self.asked = kept

    def waiting_for_cut(self) -> bool:
        with self._lock:
            return bool(self.asked)

    def pending(self, number: Optional[int]) -> bool:
        """Are moves asked but not carried by a cut, or carried by one after complete
        checkpoint ``number``?"""
        with self._lock:
            return bool(self.asked) or any(number is None or k > number for k in self.carried)


def check_move(running: bool, config, checkpoints, asked: MoveAsked, stages: int) -> None:
    """Refuse, naming why, a live move this job cannot make (before anything changes)."""
    if not running:
        raise ValueError("move_key_groups() a running job: start() it first, and not once "
                         "it finished or stopped")
    if checkpoints is None:
        raise ValueError("move_key_groups() rides a checkpoint's cut: give the job "
                         "checkpoint=")
    if checkpoints.moves is None:
        raise RescaleRefused("this job restored a checkpoint written before key groups "
                             "(its keys routed by hash % partitions): its keys cannot move")
    if config.splits:
        raise RescaleRefused("live moves with a SplitSource (several ingresses) are not "
                             "built yet: rescale from a checkpoint (rescale()) instead")
    if not config.ordered_output:
        raise RescaleRefused("live moves with a sink per partition (ordered_output=False) "
                             "are not built yet: rescale() drains and restarts instead")
    groups = checkpoints.key_groups
    if not 1 <= asked.stage <= stages:
        raise ValueError(f"stage must be from 1 to {stages}, got {asked.stage!r}")
    if not 0 <= asked.first <= asked.last < groups:
        raise ValueError(f"key groups must be first..last within 0..{groups - 1}, got "
                         f"{asked.first!r}..{asked.last!r}")
    if not 0 <= asked.dest < config.partitions:
        raise ValueError(f"to must be a partition from 0 to {config.partitions - 1}, got "
                         f"{asked.dest!r}")


def move_live(checkpoints, asked: MoveAsked, timeout: float, clock=time.monotonic,
              sleep=time.sleep) -> int:
    """Ask the move, cut a checkpoint to carry it, and wait until a complete checkpoint
    covers it; that checkpoint's number. A restart to an older checkpoint meanwhile asks it
    again (``LiveMoves.restarted``). ``TimeoutError`` if none does in ``timeout`` (no
    input came to cut after, or checkpoints do not complete)."""
    moves = checkpoints.moves
    moves.ask(asked)
    checkpoints.cut_now()
    started = clock()
    while clock() - started < timeout:
        latest = checkpoints.service.latest
        number = latest.number if latest is not None else None
        if not moves.pending(number):
            return number
        if moves.waiting_for_cut() and checkpoints.wanted_cut is not None:
            checkpoints.cut_now()  # the cut that carried it was undone by a restart
        sleep(0.02)
    raise TimeoutError(f"the move of key groups {asked.first}..{asked.last} of stage "
                       f"{asked.stage} to partition {asked.dest} was not in a complete "
                       f"checkpoint within {timeout}s (it needs an input to cut after)")


class KeyGroupMoves:
    """``FluxJob.move_key_groups``; mixed into ``FluxJob`` (its attributes are the job's)."""

    def move_key_groups(self, first: int, last: int, to: int, stage: int = 1,
                        timeout: float = 60.0) -> Optional[int]:
        """Move key groups ``first..last`` of ``stage`` to partition ``to`` while the job
        runs, without a restart (DESIGN 13, docs/design/rescaling.md): the move rides
        the next checkpoint's cut; the groups' state goes from the partitions that own
        them to ``to``, which holds the inputs after the cut until it has it. Returns
        the number of the complete checkpoint that covers the move."""
        asked = MoveAsked(stage, first, last, to)
        check_move(self.attempt is not None and not self._stopped and not self.finished(),
                   self.config, self._checkpointing, asked, len(self.dataflow.stages))
        check_rescalable(self.dataflow, self._sample, self._checkpointing.key_groups, stage)
        return move_live(self._checkpointing, asked, timeout)
