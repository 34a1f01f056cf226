"""Cluster pairs rebuilding a lost replica set (paper 4.2, DESIGN 7).

Inside a replica set the exchanges are plain, so a lost set cannot be rebuilt replica by
replica as Flux rebuilds one (the active's catch-up sync needs a connection the other
set never has: docs/design/divergence.md). The paper's procedure instead: a consistent
snapshot of the whole surviving set, from which the lost set is built again, while the
dataflow stalls. Here that snapshot is a checkpoint cut after the loss (the surviving
replicas write it: their twins are dead), and the job restarts from it once it is
complete; the restart rebuilds every replica, the lost set's on the executors Spark
gives back. Needs checkpoints (``checkpoint=``) and a restart left; without, the job
goes on with one set, as before.

Modelled in the simulator (``--placement cluster-pairs --checkpoints N``).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from flux.errors import ReplicaSetLost

log = logging.getLogger(__name__)


class SetRebuild:
    """One attempt's watch for a lost set: asked on the controller's thread."""

    def __init__(self, checkpoints, may_restart: Callable[[], bool], events: list,
                 clock: Callable[[], float]):
        self.checkpoints, self.may_restart = checkpoints, may_restart
        self.events, self.clock = events, clock
        #: the lost set (P or S), once seen
        self.lost: Optional[int] = None

    @classmethod
    def of(cls, parts) -> Optional["SetRebuild"]:
        """For an attempt of a job (``flux.spark.attempt.JobParts``): cluster pairs with
        checkpoints, else None."""
        if parts.checkpoints is None or parts.builder.replication != "cluster-pairs":
            return None
        return cls(parts.checkpoints, parts.may_restart, parts.metrics.events, time.monotonic)

    def check(self, recovery) -> None:
        """Raises ``ReplicaSetLost`` (the job restarts) once the rebuild's checkpoint is
        complete."""
        cuts = self.checkpoints
        if self.lost is None:
            lost = recovery.lost_set()
            if lost is None or not self.may_restart():
                return
            self.lost = lost
            cuts.cut_now()  # the source's thread cuts
            log.warning("replica set %s failed (cluster pairs): a checkpoint is cut now, "
                        "and the job restarts from it to rebuild the set", "PS"[lost])
            self.events.append((self.clock(), "set lost", "PS"[lost]))
            return
        complete = cuts.wanted_complete()
        if complete is not None:
            raise ReplicaSetLost(self.lost, complete)
