"""What the controller does with the replicas' digests (DESIGN 14).

Every replica reports its digests at each cut it crosses (``CutDigest``); the pure
``DivergenceMonitor`` pairs the two of a partition and compares them. A divergence is
an event (``flux_events_total{event="divergence"}``) and an error in the log naming the
stage, partition, checkpoint, cut and the operators whose states differ; then the
user's policy:

- ``"fail"`` (the default): the job stops with ``ReplicasDiverged``. Which replica is
  right cannot be known, and a failover would deliver the other one's outputs.
- ``"rebuild"``: the node of the partition's S replica is failed, as after a crash: the
  catch-up rebuilds its replicas from their twins (paper 3.3), and the job goes on. Its
  other replicas are rebuilt too: a view fails a process, not one replica. While a
  catch-up runs, no node is failed (that could lose a pair): the next cut compares
  the pair again.

A part of ``flux.runtime.controller_service.ControllerService`` (its attributes are the
service's), as the segment is split along its seams.
"""
from __future__ import annotations

import logging

from flux.addresses import Addr, S
from flux.control_messages import CutDigest
from flux.errors import ReplicasDiverged

log = logging.getLogger("flux.runtime.controller_service")

#: what a job may do when a pair's digests disagree ("off": the replicas digest nothing)
ON_DIVERGENCE = ("fail", "rebuild", "off")


class DivergenceSide:
    """The comparison of the pairs' digests and the policy; mixed into
    ``ControllerService``."""

    def on_cut_digest(self, msg: CutDigest) -> None:
        found = self.divergence.report(msg.addr, msg.digest)
        if found is None or self.error is not None:
            return
        text = found.describe(self.operator_names.get(found.stage))
        log.error("%s", text)
        self.events.append((self.clock(), "divergence",
                            f"stage {found.stage} partition {found.partition} at checkpoint "
                            f"{found.number} (cut {found.cut})"))
        if self.on_divergence == "rebuild" and self.started:
            if self.recovery.pending():  # failing another node now could lose a pair
                log.warning("not rebuilt yet: a catch-up is running; the next cut compares "
                            "the pair again")
                return
            node = self.recovery.node_of.get(Addr(found.stage, found.partition, S))
            if node is not None and node not in self.dead:
                self.fail(node, f"its replica of stage {found.stage} partition "
                                f"{found.partition} diverged from its twin: rebuilt from it")
                return
        self.error = ReplicasDiverged(text, found.stage, found.partition, found.number,
                                      found.operators)
