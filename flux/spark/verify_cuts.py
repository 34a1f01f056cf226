"""Cuts for the replicas' comparison when no checkpoint is taken (DESIGN 14).

With ``checkpoint=`` the pairs compare their digests at every checkpoint's cut. Without
one, ``verify_interval=`` asks the ingress for a cut every that many seconds (when inputs
came since the last): the cut travels with the data as a checkpoint's does, every
replica digests its state and outputs when its merge passes it, and nothing is written
(no replica keeps a snapshot, the sinks commit as they would anyway). With a
``SplitSource`` the pairs of ingresses on the executors cut, as for a checkpoint, at the
end of an epoch the driver names (``EpochVerifyCuts``).
"""
from __future__ import annotations

import time
from typing import Callable

from flux.control_messages import CutAtEpoch, SplitCutPassed
from flux.runtime.ingress_feed import IngressFeed
from flux.spark.split_checkpoints import epoch_to_cut


class VerifyCuts:
    """The source thread's clock of verify cuts."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        if not interval > 0:
            raise ValueError(f"verify_interval must be > 0 seconds, got {interval!r}")
        self.interval, self.clock = interval, clock
        self._due = clock() + interval
        self.next_number = 1

    def maybe_cut(self, feed: IngressFeed) -> None:
        now = self.clock()
        if now < self._due:
            return
        self._due = now + self.interval
        if feed.has_new_inputs():
            feed.choose_cut(self.next_number)
            self.next_number += 1

    def report_offsets(self, report) -> None:
        """As ``DriverCheckpoints.report_offsets``: no checkpoint, no position to report."""


class EpochVerifyCuts:
    """The verify cuts of a job whose splits are read on the executors: every
    ``interval`` seconds the end of an epoch a little past the clock's
    (``epoch_to_cut``), told to every node as a checkpoint's is
    (``SplitCheckpoints.maybe_cut_at_epoch``); nothing is recorded of the pairs passing
    it."""

    def __init__(self, interval: float, epoch_interval: float,
                 clock: Callable[[], float] = time.monotonic):
        if not interval > 0:
            raise ValueError(f"verify_interval must be > 0 seconds, got {interval!r}")
        self.interval, self.clock, self.epoch_interval = interval, clock, epoch_interval
        self._due = clock() + interval
        self.next_number = 1

    def maybe_cut_at_epoch(self, epoch_now: int, tell: Callable[[CutAtEpoch], None],
                           done: bool) -> None:
        now = self.clock()
        if now < self._due or done:
            return
        self._due = now + self.interval
        tell(CutAtEpoch(self.next_number, epoch_to_cut(epoch_now, self.epoch_interval)))
        self.next_number += 1

    def passed(self, msg: SplitCutPassed) -> None:
        """A pair past a cut: no position to keep without a checkpoint."""
