"""The driver's record of live moves of key groups: what was asked, what each cut carried,
and each stage's map (DESIGN 13, docs/design/rescaling.md).

A move asked (``ask``: groups ``first..last`` of a stage to a partition) comes in two
phases (docs/design/rescaling.md): the next checkpoint's cut carries its prepares (the
source's thread turns it into one ``GroupMove`` per run of those groups with one owner,
``cut``): the ranges' bulk goes to the destinations while the job runs on. Once both
replicas of every destination hold it (``staged``, the controller's word, or
``PREPARE_WAIT`` seconds after the prepare whatever they hold, whoever waits), the
next cut carries the moves, and only
what changed since travels while the destinations pause; that cut's checkpoint records
the maps before and after it. Until that checkpoint is complete a restart may go back to an older one, whose
map the move never changed: the asks its cuts carried are asked again (``restarted``).
A restart at another partition count (a rescale from a checkpoint) starts from
contiguous ranges; an ask whose partition is no more is dropped, with a warning.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from exchange.group_map import GroupMap, GroupMove, maps_to_config
from flux.runtime.restore import dormant_start

log = logging.getLogger(__name__)

#: seconds a prepared move waits for its bulk to be at its destinations before it is
#: carried anyway (the destinations then pause until the bulk is there)
PREPARE_WAIT = 10.0


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
    (as a job of ``over`` nodes has them): a live rescale among the pairs running.
    ``leave``: the pairs past ``over`` then leave (a rescale to fewer,
    ``flux.spark.job_growth``)."""

    over: int
    key_groups: int
    leave: bool = False

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
                 restored: Optional[dict], clock: Callable[[], float] = time.monotonic,
                 running: int = 0):
        """``running``: the pairs a job with dormant ones starts with (0: every pair
        runs; docs/design/rescaling.md)."""
        self.stages, self.key_groups, self.clock = stages, key_groups, clock
        self.first_running = running
        #: the pairs running at this incarnation's start (0: all), and the partitions
        #: that owned a group before some cut of it: the others' state is empty at a cut
        self.running = 0
        self.owned: set = set()
        self._lock = threading.Lock()
        self.asked: List[MoveAsked] = []  # not carried by a cut yet
        #: checkpoint -> the asks its cut carried, until it is complete
        self.carried: Dict[int, List[MoveAsked]] = {}
        self.maps: Dict[int, GroupMap] = {}
        #: the moves a cut prepared: (its checkpoint, moves, asks, maps after them), and when
        self.prepared: Optional[Tuple[int, List[GroupMove], List[MoveAsked], dict]] = None
        self.prepared_at = 0.0
        self.ready = False  # its bulks are staged: the next cut carries the moves
        #: the last cut that carried moves or prepares, the newest cut ``(k, n)``, and
        #: whether a join is being applied (no cut carries moves meanwhile): where a pair
        #: started at a live rescale starts (``join_start``, docs/design/rescaling.md)
        self.moves_cut = 0
        self.moves_cut_at: tuple = ()  # that cut, ``(k, n)``
        self.last_cut: tuple = ()
        self.joining = False
        #: the partitions empty at a cut unless they owned a group before it (dormant at
        #: the start, or left since); and a rescale to fewer carried, ``(over, the move
        #: cut that took the leaving pairs' last groups)``, until a join
        self.sleepers: set = set()
        self.shrunk: Optional[Tuple[int, int]] = None
        #: the pairs a rescale to fewer took out and its cut: empty from the next cut on
        self._to_sleep: Optional[Tuple[set, int]] = None
        self.restarted(restored, partitions)

    def owners(self) -> Dict[int, List[int]]:
        """Stage -> the partition owning each key group, as the moves carried so far
        left them."""
        with self._lock:
            return {s: [int(p) for p in m.owners] for s, m in self.maps.items()}

    def ask(self, asked: MoveAsked) -> None:
        with self._lock:
            self.asked.append(asked)
            if isinstance(asked, SpreadAsked) and asked.leave:
                self.shrunk = None  # (an earlier rescale to fewer's pairs left already)

    def cut(self, number: int, last_stage: bool = True) -> Tuple[List[GroupMove], tuple]:
        """Checkpoint ``number`` is cut: the moves (or prepares) it carries, and the maps
        before and after them (``CheckpointCoordinator.begin``). ``last_stage``: may it
        move the last stage's groups (else moves that do wait for a later cut)?"""
        with self._lock:
            before = dict(self.maps)
            if self._to_sleep is not None and number > self._to_sleep[1]:
                self.sleepers |= self._to_sleep[0]  # (rule 5 of docs/design/rescaling.md:
                self.owned -= self._to_sleep[0]     # they wrote the rescale's cut)
                self._to_sleep = None
            for groups in before.values():
                self.owned.update(groups.owning())
            if self.joining:  # the joined replicas start from the maps before this cut
                return [], (before, before)
            moves, groups = self._cut(number, last_stage, before)
            if moves:
                self.moves_cut = number
            if any(isinstance(a, SpreadAsked) and a.leave for a in
                   self.carried.get(number, ())):
                over = min(a.over for a in self.carried[number] if isinstance(a, SpreadAsked))
                self.shrunk = (over, self.moves_cut)  # (its (k, n): ``leaving``)
                self._to_sleep = (set(range(over, self.partitions)), number)
            return moves, groups

    def _cut(self, number: int, last_stage: bool,
             before: dict) -> Tuple[List[GroupMove], tuple]:
        """``cut`` under the lock: the prepares of the moves asked, or their moves."""
        if self.prepared is not None:  # the second phase, once the bulks are there
            if not self.ready and self.clock() - self.prepared_at < PREPARE_WAIT:
                return [], (before, before)
            if not last_stage and any(m.stage == self.stages for m in self.prepared[1]):
                return [], (before, before)
            _, moves, asks, self.maps = self.prepared
            self.prepared, self.ready = None, False
            self.carried[number] = asks
            return moves, (before, dict(self.maps))
        asked, self.asked = self.asked, []
        maps, moves = dict(self.maps), []
        for a in asked:
            mine = a.moves(maps)
            for s in {m.stage for m in mine}:
                maps[s] = maps[s].moved([m for m in mine if m.stage == s])
            moves += mine
        if moves:
            self.prepared, self.prepared_at = (number, moves, asked, maps), self.clock()
        elif asked:
            self.carried[number] = asked  # nothing to move: done at this cut
        return [m.prepared() for m in moves], (before, before)

    def cut_at(self, number: int, cut: int) -> None:
        """Checkpoint ``number``'s cut is ``cut`` (the newest, for ``join_start``)."""
        with self._lock:
            self.last_cut = (number, cut)
            if number == self.moves_cut:
                self.moves_cut_at = (number, cut)

    def join_start(self) -> Tuple[tuple, int, tuple]:
        """Where replicas of pairs started now start (``Joined``): the maps after the last
        cut that moved groups, its number, and the newest cut (its snapshots are not
        theirs). No cut carries moves until ``join_applied``: a move cut chosen before
        every process applied the join might be forgotten by the producers before they
        tell the joined replicas."""
        with self._lock:
            self.joining, self.shrunk = True, None
            return maps_to_config(self.maps), self.moves_cut, self.last_cut

    def join_applied(self) -> None:
        with self._lock:
            self.joining = False

    def unowned(self) -> frozenset:
        """The partitions dormant at this incarnation's start, or left since, that owned
        no group before any cut since: empty at the last cut, whether they joined or not
        (the coordinator takes their snapshots as written, docs/design/rescaling.md)."""
        with self._lock:
            return frozenset(self.sleepers - self.owned)

    def running_at(self, running: int) -> int:
        """The pairs a checkpoint cut now records as running (``running``: the
        attempt's count): from a rescale to fewer's cut on, its count, though the pairs
        past it leave later (a restart from the cut leaves them dormant, as the live run
        does; docs/design/rescaling.md)."""
        with self._lock:
            return running if self.shrunk is None else min(running, self.shrunk[0])

    def leaving(self) -> Optional[Tuple[int, tuple]]:
        """A rescale to fewer carried since the last join or restart: ``(over, the move
        cut (k, n) that took the last groups of the pairs past it)``, or None (also until
        that cut's position is known)."""
        with self._lock:
            if self.shrunk is None or self.moves_cut_at[:1] != (self.shrunk[1],):
                return None
            return self.shrunk[0], self.moves_cut_at

    def preparing(self) -> Optional[Tuple[int, List[GroupMove]]]:
        """The prepare a cut carried whose moves wait for their bulks (its checkpoint and
        moves), or None."""
        with self._lock:
            if self.prepared is None or self.ready or self._waited():
                return None
            return self.prepared[0], list(self.prepared[1])

    def _waited(self) -> bool:
        return self.clock() - self.prepared_at >= PREPARE_WAIT

    def staged(self, number: int) -> None:
        """The bulks of the prepare at checkpoint ``number`` are at their destinations (or
        waited for long enough): the next cut carries its moves."""
        with self._lock:
            if self.prepared is not None and self.prepared[0] == number:
                self.ready = True

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
            maps, self.running = dormant_start(manifest, partitions, self.first_running,
                                               self.key_groups, self.stages)
            self.maps.update(maps)
            self.owned = set()
            self.sleepers = set(range(self.running, partitions)) if self.running else set()
            self.shrunk, self._to_sleep = None, None
            done = manifest["checkpoint"] if manifest is not None else 0
            again = [a for k in sorted(self.carried) if k > done for a in self.carried[k]]
            if self.prepared is not None:  # prepared and not carried: prepared again
                again += self.prepared[2]
            self.carried, self.prepared, self.ready = {}, None, False
            self.joining = False
            for a in again + self.asked:
                if not a.fits(partitions):
                    log.warning("%s is dropped: the job restarted with %d partitions", a,
                                partitions)
            self.asked = [a for a in again + self.asked if a.fits(partitions)]

    def waiting_for_cut(self) -> bool:
        """Does a cut wait to carry asks (their prepares) or moves whose bulks are there?"""
        with self._lock:
            return bool(self.asked) and self.prepared is None or self.prepared is not None \
                and (self.ready or self._waited())

    def pending(self, number: Optional[int]) -> bool:
        """Are moves asked but not carried by a cut, or carried by one after complete
        checkpoint ``number``?"""
        with self._lock:
            return bool(self.asked) or self.prepared is not None or \
                any(number is None or k > number for k in self.carried)
