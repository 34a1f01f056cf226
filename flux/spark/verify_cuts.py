"""Cuts for the replicas' comparison when no checkpoint is taken (DESIGN 14).

With ``checkpoint=`` the pairs compare their digests at every checkpoint's cut. Without
one, ``verify_interval=`` asks the ingress for a cut every that many seconds (when inputs
came since the last): the cut travels with the data as a checkpoint's does, every
replica digests its state and outputs when its merge passes it, and nothing is written
(no replica keeps a snapshot, the sinks commit as they would anyway).
"""
from __future__ import annotations

import time
from typing import Callable

from flux.runtime.ingress_feed import IngressFeed


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
