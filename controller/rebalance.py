"""The metric-driven rebalancing policy (off by default): which key groups a running job
moves live, by the load its partitions take (DESIGN 13, docs/design/rescaling.md).

Every ``Rebalance.every`` seconds the policy looks at the rows routed to each key group
of each stage since its last look (each producer counts them as it routes, and its node
reports them about once a second with its other counters). In a stage whose hottest
partition takes more than ``imbalance`` times the stage's mean, and at least
``min_rate`` inputs a second, it moves a contiguous run of that partition's groups to
the partition taking the least (a pair owning none, started as a spare, is the least of
all): the run that leaves the hotter of the two lowest, and only if that is at least
``MIN_GAIN`` below the hot partition's rate now. A group hotter than the gap between the
two therefore stays (moving it would only make the other partition the hot one), and a
partition keeps one group at least. One move per look; the look after a move starts
afresh once it is done, so the next decision sees the load after it.

Where no group counts come for a stage (every row of it routed without key groups), the
partitions' input counters decide, each group of the hot partition taken as equally
loaded: the share that would even the two out, at the end of its largest range.

Pure: counters and time come in as arguments; the runtime asks the move.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

#: (stage, partition) -> inputs its replicas took (the larger of the two counters)
Taken = Mapping[Tuple[int, int], int]
#: stage -> rows routed to each of its key groups (summed over its producers)
Loads = Mapping[int, Sequence[int]]

#: a move must bring the hot partition's rate down by at least this share of it
MIN_GAIN = 0.1


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

    def observe(self, now: float, taken: Taken, owners: Mapping[int, Sequence[int]],
                loads: Optional[Loads] = None) -> Optional[RebalanceMove]:
        """The counters as of ``now`` (each partition's inputs, and where they come each
        stage's rows per key group), and each stage's owner of every group; a move when a
        look is over and a stage is out of balance."""
        loads = {s: list(v) for s, v in (loads or {}).items()}
        if self._since is None:
            self._since = (now, dict(taken), loads)
            return None
        began, before, loads_before = self._since
        if now - began < self.settings.every:
            return None
        self._since = (now, dict(taken), loads)
        if any(taken.get(k, 0) < n for k, n in before.items()) or any(
                _went_down(loads.get(s), v) for s, v in loads_before.items()):
            return None  # a replica was rebuilt (its counter began again): look again
        seconds = now - began
        for stage in self.stages:
            group_rates = _group_rates(loads.get(stage), loads_before.get(stage),
                                       len(owners[stage]), seconds)
            if group_rates is not None:
                move = self._decide_by_groups(stage, group_rates, owners[stage])
            else:
                rates = tuple((taken.get((stage, p), 0) - before.get((stage, p), 0))
                              / seconds for p in range(self.partitions))
                move = self._decide(stage, rates, owners[stage])
            if move is not None:
                self._since = None
                return move
        return None

    def _hot_and_cool(self, rates: Sequence[float]) -> Optional[Tuple[int, int]]:
        """The hottest and the least loaded partition, when the stage is out of balance."""
        hot = max(range(len(rates)), key=lambda p: rates[p])
        cool = min(range(len(rates)), key=lambda p: (rates[p], p))
        mean = sum(rates) / len(rates)
        if rates[hot] < self.settings.min_rate or rates[hot] <= self.settings.imbalance * mean:
            return None
        return hot, cool

    def _decide_by_groups(self, stage: int, group_rates: Sequence[float],
                          owners: Sequence[int]) -> Optional[RebalanceMove]:
        rates = [0.0] * self.partitions
        for g, rate in enumerate(group_rates):
            rates[owners[g]] += rate
        pair = self._hot_and_cool(rates)
        if pair is None:
            return None
        hot, cool = pair
        mine = [g for g, owner in enumerate(owners) if owner == hot]
        best = best_run(mine, group_rates, rates[hot], rates[cool])
        if best is None:
            return None
        first, last, left = best
        if left > rates[hot] * (1 - MIN_GAIN):
            return None  # no run of groups evens them out (one group carries the load)
        return RebalanceMove(stage, first, last, cool, tuple(rates))

    def _decide(self, stage: int, rates: Tuple[float, ...],
                owners: Sequence[int]) -> Optional[RebalanceMove]:
        pair = self._hot_and_cool(rates)
        if pair is None:
            return None
        hot, cool = pair
        mine = [g for g, owner in enumerate(owners) if owner == hot]
        if len(mine) < 2:
            return None  # one group (maybe one key): nothing to split
        share = (rates[hot] - rates[cool]) / (2 * rates[hot])
        count = max(1, round(len(mine) * share))
        first, last = largest_run(mine)
        keep = 1 if last - first + 1 == len(mine) else 0  # the hot one keeps a group
        count = min(count, last - first + 1 - keep)
        return RebalanceMove(stage, last - count + 1, last, cool, rates)


def _went_down(now: Optional[Sequence[int]], before: Sequence[int]) -> bool:
    return now is not None and len(now) == len(before) and any(
        a < b for a, b in zip(now, before))


def _group_rates(now: Optional[Sequence[int]], before: Optional[Sequence[int]],
                 groups: int, seconds: float) -> Optional[List[float]]:
    """Rows per second of each group over the look, or None where the counts do not
    cover the stage's groups at both ends of the look, or saw no row."""
    if now is None or len(now) != groups:
        return None
    before = before if before is not None and len(before) == groups else None
    if before is None or sum(now) == sum(before):
        return None
    return [(a - b) / seconds for a, b in zip(now, before)]


def best_run(mine: List[int], group_rates: Sequence[float], hot: float,
             cool: float) -> Optional[Tuple[int, int, float]]:
    """Of the runs of consecutive groups in sorted ``mine`` (the hot partition's) and
    every window inside one, leaving it one group at least: ``(first, last, left)`` of
    the window whose move leaves the hotter of the two partitions (at ``hot`` and
    ``cool`` rows a second now) lowest, ``left`` that rate; the fewest groups of equals."""
    best: Optional[Tuple[float, int, int, int]] = None
    for run in runs(mine):
        sums = [0.0]
        for g in run:
            sums.append(sums[-1] + group_rates[g])
        for a in range(len(run)):
            for b in range(a, len(run)):
                if b - a + 1 == len(mine):
                    continue  # the hot one keeps a group
                moved = sums[b + 1] - sums[a]
                key = (max(hot - moved, cool + moved), b - a, run[a], run[b])
                if best is None or key < best:
                    best = key
    return None if best is None else (best[2], best[3], best[0])


def runs(groups: List[int]) -> List[List[int]]:
    """The runs of consecutive groups in sorted ``groups``, in order."""
    out: List[List[int]] = []
    for g in groups:
        if out and g == out[-1][-1] + 1:
            out[-1].append(g)
        else:
            out.append([g])
    return out


def largest_run(groups: List[int]) -> Tuple[int, int]:
    """(first, last) of the longest run of consecutive groups in sorted ``groups`` (the
    last of equals)."""
    longest = max(reversed(runs(groups)), key=len)
    return longest[0], longest[-1]


def routed_loads(stats: Iterable[Any]) -> Dict[int, List[int]]:
    """Stage -> rows routed to each of its key groups, from the producers' counters
    (``SegmentStats``: a replica of stage ``s - 1``, or an ingress for stage 1, counts
    the rows it routed into stage ``s``): the larger of a pair's two per group (they
    route the same rows; a rebuilt one starts again at zero), summed over partitions."""
    per_producer: Dict[Tuple[int, int], List[int]] = {}
    for s in stats:
        if not s.routed:
            continue
        key = (s.addr.stage, s.addr.partition)
        mine = per_producer.get(key)
        if mine is None or len(mine) != len(s.routed):
            per_producer[key] = list(s.routed)
        else:
            per_producer[key] = [max(a, b) for a, b in zip(mine, s.routed)]
    loads: Dict[int, List[int]] = {}
    for (stage, _), counts in sorted(per_producer.items()):
        total = loads.get(stage + 1)
        loads[stage + 1] = counts if total is None or len(total) != len(counts) else \
            [a + b for a, b in zip(total, counts)]
    return loads
