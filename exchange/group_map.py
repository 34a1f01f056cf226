"""Which partition owns which key group, and the moves that change it (DESIGN 13).

At the start every partition ``p`` of ``n`` owns the contiguous range ``g * n // G == p``
(``exchange.partitioner``). A live move gives a range of groups of one stage to another
partition of that stage from a checkpoint's cut on: inputs up to the cut are routed by
the map before it, inputs past it by the map after (docs/design/rescaling.md). A map is
a value: every producer of the stage, and every replica rebuilt later, computes the same
one from the same moves.

Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np

from exchange.partitioner import group_owner


@dataclass(frozen=True, slots=True)
class GroupMove:
    """Key groups ``first``..``last`` (inclusive) of stage ``stage`` (from 1) go from
    partition ``source`` to partition ``dest``.

    ``prepare``: the first of a move's two phases (docs/design/rescaling.md): at this
    cut the source's replicas send the range's bulk and keep it; nothing is routed
    otherwise. The move itself (the same groups, ``prepare`` False) is a later cut's,
    where only what changed since the bulk travels."""

    stage: int
    first: int
    last: int
    source: int
    dest: int
    prepare: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last:
            raise ValueError(f"a move's groups run from first to last, got {self.first} "
                             f"to {self.last}")
        if self.source == self.dest:
            raise ValueError(f"a move from partition {self.source} to itself")

    def covers(self, groups: np.ndarray) -> np.ndarray:
        """Which of ``groups`` the move takes."""
        return (groups >= self.first) & (groups <= self.last)

    def to_wire(self) -> list:
        fields = [self.stage, self.first, self.last, self.source, self.dest]
        return fields + [1] if self.prepare else fields

    @classmethod
    def from_wire(cls, fields: Sequence[int]) -> "GroupMove":
        return cls(*map(int, fields[:5]), prepare=len(fields) > 5 and bool(fields[5]))

    def prepared(self) -> "GroupMove":
        """This move's first phase."""
        return GroupMove(self.stage, self.first, self.last, self.source, self.dest, True)

    def settled(self) -> "GroupMove":
        """The move a prepare is the first phase of."""
        return GroupMove(self.stage, self.first, self.last, self.source, self.dest)


def moves_from_wire(moves: Iterable) -> Tuple[GroupMove, ...]:
    return tuple(m if isinstance(m, GroupMove) else GroupMove.from_wire(m) for m in moves)


class GroupMap:
    """The owner of each of ``key_groups`` groups among a stage's partitions."""

    __slots__ = ("owners", "partitions")

    def __init__(self, owners: Sequence[int], partitions: int):
        self.owners = np.asarray(owners, dtype=np.int64)
        self.partitions = partitions
        if len(self.owners) and not (0 <= self.owners.min() and
                                     self.owners.max() < partitions):
            raise ValueError(f"a group's owner must be one of {partitions} partitions")

    @classmethod
    def even(cls, partitions: int, key_groups: int,
             pairs: Optional[int] = None) -> "GroupMap":
        """Contiguous ranges, Flink's assignment: the map before any move; over the first
        ``partitions`` of ``pairs`` (more: pairs that own no group yet, for a live
        rescale to come)."""
        return cls(group_owner(np.arange(key_groups), key_groups, partitions),
                   pairs or partitions)

    @property
    def key_groups(self) -> int:
        return len(self.owners)

    def owner(self, groups):
        """The owner of a group (an int) or of each of an integer array of groups."""
        return self.owners[groups]

    def moved(self, moves: Iterable[GroupMove]) -> "GroupMap":
        """The map after ``moves`` (of this map's stage). A move must take groups its
        source owns: anything else is a controller's error, refused here."""
        owners = self.owners.copy()
        for move in moves:
            if move.last >= len(owners) or not 0 <= move.dest < self.partitions:
                raise ValueError(f"{move} is outside {len(owners)} groups of "
                                 f"{self.partitions} partitions")
            held = owners[move.first:move.last + 1]
            if (held != move.source).any():
                raise ValueError(f"{move}: partition {move.source} does not own all of "
                                 f"groups {move.first}..{move.last}")
            owners[move.first:move.last + 1] = move.dest
        return GroupMap(owners, self.partitions)

    def moves_to(self, other: "GroupMap", stage: int) -> List[GroupMove]:
        """The moves that make this map ``other``: one per run of groups whose owner
        changes from one partition to one other (a live rescale, DESIGN 13)."""
        moves, start = [], None
        old, new = self.owners, other.owners
        for g in range(len(old) + 1):
            same_run = start is not None and g < len(old) and \
                (old[g], new[g]) == (old[start], new[start])
            if same_run:
                continue
            if start is not None and old[start] != new[start]:
                moves.append(GroupMove(stage, start, g - 1, int(old[start]), int(new[start])))
            start = g if g < len(old) else None
        return moves

    def owning(self) -> Set[int]:
        """The partitions that own a group (with dormant pairs, not all of them)."""
        return set(np.unique(self.owners).tolist())

    def groups_of(self, partition: int) -> List[int]:
        return np.flatnonzero(self.owners == partition).tolist()

    def ranges(self) -> List[Tuple[int, int, int]]:
        """``(first, last, owner)`` of each run of groups with one owner, in order."""
        runs, start = [], 0
        owners = self.owners
        for g in range(1, len(owners) + 1):
            if g == len(owners) or owners[g] != owners[start]:
                runs.append((start, g - 1, int(owners[start])))
                start = g
        return runs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GroupMap) and self.partitions == other.partitions and \
            np.array_equal(self.owners, other.owners)

    def __repr__(self) -> str:
        return f"GroupMap({self.ranges()})"


def stage_moves(moves: Iterable[GroupMove], stage: int) -> List[GroupMove]:
    return [m for m in moves if m.stage == stage]


def owner_changes(moves: Iterable[GroupMove]) -> List[GroupMove]:
    """The moves that change owners (a prepare changes none)."""
    return [m for m in moves if not m.prepare]


def changes_owners_of(moves: Iterable[GroupMove], stage: int) -> bool:
    """Do ``moves`` change owners of ``stage``'s groups?"""
    return any(m.stage == stage for m in owner_changes(moves))


def maps_to_config(maps: Dict[int, GroupMap]) -> Tuple[Tuple[int, Tuple[int, ...]], ...]:
    """Maps as a node's frozen configuration holds them: ``((stage, owners), ...)``."""
    return tuple((s, tuple(m.owners.tolist())) for s, m in sorted(maps.items()))


def maps_from_config(config: Tuple[Tuple[int, Tuple[int, ...]], ...],
                     partitions: int) -> Dict[int, GroupMap]:
    """Maps from that form, over ``partitions`` partitions."""
    return {s: GroupMap(np.asarray(owners, dtype=np.int64), partitions) for s, owners in config}
