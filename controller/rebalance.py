"""The metric-driven rebalancing policy (off by default): which key groups a running job
moves live, by the load its partitions take (DESIGN 13, docs/design/rescaling.md).

Every ``Rebalance.every`` seconds the policy looks at how many inputs each partition of
each stage took since its last look (a node reports its replicas' counters about once a
second). In a stage whose hottest partition takes more than ``imbalance`` times the
stage's mean, and at least ``min_rate`` inputs a second, it moves part of that
partition's key groups to the partition taking the least (a pair owning none, started
as a spare, is the least of all): the share that would even the two out were every
group of the hot partition equally loaded, as a contiguous run at the end of its
largest range, leaving it one group at least. One move per look; the look after a move
starts afresh once it is done, so the next decision sees the load after it. A single
hot key cannot be split: a partition with one group is left alone.

Pure: counters and time come in as arguments; the runtime asks the move.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

#: (stage, partition) -> inputs its replicas took (the larger of the two counters)
Taken = Mapping[Tuple[int, int], int]


@dataclass(frozen=True)
class Rebalance:
    """``FluxJob(..., rebalance=flux.Rebalance())``: move key groups from a hot partition
    to the least loaded one while the job runs. ``every``: seconds of load each decision
    looks at; ``imbalance``: how many times the stage's mean the hottest partition's
    rate must exceed; ``min_rate``: inputs a second below which a partition is never
    hot; ``stages``: the stages balanced (1-based; None: every stage that may move)."""

    every: float = 30.0
    imbalance: float = 1.5
    min_rate: float = 100.0
    stages: Optional[Tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if not self.every > 0:
            raise ValueError(f"Rebalance: every must be > 0 seconds, got {self.every!r}")
        if not self.imbalance > 1:
            raise ValueError(f"Rebalance: imbalance must be > 1 (a ratio to the stage's "
                             f"mean), got {self.imbalance!r}")
        if not self.min_rate >= 0:
            raise ValueError(f"Rebalance: min_rate must be >= 0 inputs/s, got "
                             f"{self.min_rate!r}")


@dataclass(frozen=True)
class RebalanceMove:
    """Move groups ``first..last`` of ``stage`` to partition ``dest``; why, for the log."""

    stage: int
    first: int
    last: int
    dest: int
    rates: Tuple[float, ...]  # inputs/s of each partition of the stage over the look


class RebalancePolicy:
    """Decides at most one move per look (``observe``)."""

    def __init__(self, settings: Rebalance, stages: Sequence[int], partitions: int):
        """``stages``: the stages the job may move live (1-based)."""
        self.settings, self.partitions = settings, partitions
        wanted = settings.stages
        self.stages = [s for s in stages if wanted is None or s in wanted]
        self._since: Optional[Tuple[float, Dict[Tuple[int, int], int]]] = None

    def restart_look(self) -> None:
        """A move was asked, or the counters cannot be compared: the next look starts at
        the next counters."""
        self._since = None

    def observe(self, now: float, taken: Taken,
                owners: Mapping[int, Sequence[int]]) -> Optional[RebalanceMove]:
        """The counters as of ``now``, and each stage's owner of every group; a move when a
        look is over and a stage is out of balance."""
        if self._since is None:
            self._since = (now, dict(taken))
            return None
        began, before = self._since
        if now - began < self.settings.every:
            return None
        self._since = (now, dict(taken))
        if any(taken.get(k, 0) < n for k, n in before.items()):
            return None  # a replica was rebuilt (its counter began again): look again
        seconds = now - began
        for stage in self.stages:
            rates = tuple((taken.get((stage, p), 0) - before.get((stage, p), 0)) / seconds
                          for p in range(self.partitions))
            move = self._decide(stage, rates, owners[stage])
            if move is not None:
                self._since = None
                return move
        return None

    def _decide(self, stage: int, rates: Tuple[float, ...],
                owners: Sequence[int]) -> Optional[RebalanceMove]:
        hot = max(range(len(rates)), key=lambda p: rates[p])
        cool = min(range(len(rates)), key=lambda p: (rates[p], p))
        mean = sum(rates) / len(rates)
        if rates[hot] < self.settings.min_rate or rates[hot] <= self.settings.imbalance * mean:
            return None
        mine = [g for g, owner in enumerate(owners) if owner == hot]
        if len(mine) < 2:
            return None  # one group (maybe one key): nothing to split
        share = (rates[hot] - rates[cool]) / (2 * rates[hot])
        count = max(1, round(len(mine) * share))
        first, last = largest_run(mine)
        keep = 1 if last - first + 1 == len(mine) else 0  # the hot one keeps a group
        count = min(count, last - first + 1 - keep)
        return RebalanceMove(stage, last - count + 1, last, cool, rates)


def largest_run(groups: List[int]) -> Tuple[int, int]:
    """(first, last) of the longest run of consecutive groups in sorted ``groups`` (the
    last of equals)."""
    best = start = 0
    for i in range(1, len(groups) + 1):
        if i == len(groups) or groups[i] != groups[i - 1] + 1:
            if i - start >= best:
                best, found = i - start, (groups[start], groups[i - 1])
            start = i
    return found
