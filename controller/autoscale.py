"""The metric-driven rescaling policy (off by default): how many pairs a job with
``max_nodes`` runs, by the rate of its input (docs/design/rescaling.md, "Autoscaling").

Every ``Autoscale.every`` seconds the policy looks at the inputs the job took since its
last look (the ingress counts them and reports them about once a second). The pairs it
wants are the rate over ``rate_per_pair``, rounded up, within ``min_pairs`` and
``max_nodes``. More than run: the job grows at once (a live rescale onto started pairs).
Fewer: it shrinks only once ``down_looks`` looks in a row wanted fewer, to the most any of
them wanted (a shrink moves every group of the pairs leaving; a burst should not undo a
growth). One rescale at a time; the look after one starts afresh, so the next decision
sees the rate after it. ``rate_per_pair`` is what one pair of this dataflow sustains with
room to spare (``python -m experiments.steady_rate`` measures the highest steady rate).

Pure: counters and time come in as arguments; the runtime asks the rescale.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class Autoscale:
    """``FluxJob(..., max_nodes=M, autoscale=flux.Autoscale(rate_per_pair=...))``: run as
    many pairs as the input rate needs, from ``min_pairs`` (default: ``nodes``) up to
    ``max_nodes``. ``rate_per_pair``: inputs a second one pair should take;
    ``every``: seconds of input each look measures; ``down_looks``: looks in a row that
    must want fewer pairs before the job shrinks."""

    rate_per_pair: float
    min_pairs: Optional[int] = None
    every: float = 30.0
    down_looks: int = 3

    def __post_init__(self) -> None:
        if not (isinstance(self.rate_per_pair, (int, float)) and self.rate_per_pair > 0):
            raise ValueError(f"Autoscale: rate_per_pair must be > 0 inputs/s, got "
                             f"{self.rate_per_pair!r}")
        if self.min_pairs is not None and not (isinstance(self.min_pairs, int)
                                               and self.min_pairs >= 1):
            raise ValueError(f"Autoscale: min_pairs must be an int >= 1, got "
                             f"{self.min_pairs!r}")
        if not self.every > 0:
            raise ValueError(f"Autoscale: every must be > 0 seconds, got {self.every!r}")
        if not (isinstance(self.down_looks, int) and self.down_looks >= 1):
            raise ValueError(f"Autoscale: down_looks must be an int >= 1, got "
                             f"{self.down_looks!r}")

    def bounds(self, nodes: int, max_nodes: int) -> Tuple[int, int]:
        """The fewest and the most pairs it runs a job of ``nodes`` .. ``max_nodes`` at;
        ``ValueError`` naming why a job cannot have it."""
        if max_nodes <= nodes:
            raise ValueError(f"autoscale needs max_nodes above nodes={nodes}: the pairs it "
                             f"may start and stop live (got max_nodes={max_nodes})")
        low = nodes if self.min_pairs is None else self.min_pairs
        if low > max_nodes:
            raise ValueError(f"Autoscale: min_pairs={low} above max_nodes={max_nodes}")
        return low, max_nodes


@dataclass(frozen=True)
class AutoscaleDecision:
    """Rescale from ``running`` pairs to ``pairs``; the rate that decided it (inputs/s)."""

    running: int
    pairs: int
    rate: float


class AutoscalePolicy:
    """Decides at most one rescale per look (``observe``)."""

    def __init__(self, settings: Autoscale, low: int, high: int):
        self.settings, self.low, self.high = settings, low, high
        self._since: Optional[Tuple[float, int]] = None
        self._fewer: List[int] = []  # the pairs each look in a row wanted, while fewer

    def wanted(self, rate: float) -> int:
        """The pairs ``rate`` inputs a second need, within the bounds."""
        need = math.ceil(rate / self.settings.rate_per_pair - 1e-9)
        return min(self.high, max(self.low, need))

    def observe(self, now: float, taken: int, running: int) -> Optional[AutoscaleDecision]:
        """``taken``: the inputs the job took so far (its ingress's counter), at ``now``;
        ``running``: the pairs running. A rescale to ask, or None."""
        if self._since is None or taken < self._since[1]:  # the first look, or a restart
            self._since = (now, taken)
            return None
        start, before = self._since
        if now - start < self.settings.every:
            return None
        self._since = (now, taken)
        rate = (taken - before) / (now - start)
        pairs = self.wanted(rate)
        if pairs > running:
            self._fewer = []
            return AutoscaleDecision(running, pairs, rate)
        if pairs == running:
            self._fewer = []
            return None
        self._fewer.append(pairs)
        if len(self._fewer) < self.settings.down_looks:
            return None
        pairs, self._fewer = max(self._fewer), []
        return AutoscaleDecision(running, pairs, rate)

    def restart_look(self) -> None:
        """A rescale was made (or failed): the next look measures afresh."""
        self._since, self._fewer = None, []
