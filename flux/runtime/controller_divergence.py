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

Before it acts, the controller asks both replicas for their pairs in the groups of the
first differing keyed operator's digest (``ProbeKeys``, up to 16 groups) and names the
first key, in key order, whose values differ there; a replica that can no longer say its state at that cut (it
crossed another, or took inputs with its changes not recorded), or that is dead, leaves
it unnamed; it waits at most ``PROBE_WAIT`` seconds.

A part of ``flux.runtime.controller_service.ControllerService`` (its attributes are the
service's), as the segment is split along its seams.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from controller.divergence import Divergence, name_first_key, probe_request
from flux.addresses import Addr, P, S
from flux.control_messages import CutDigest, ProbedKeys, ProbeKeys
from flux.errors import ReplicasDiverged

log = logging.getLogger("flux.runtime.controller_service")

#: what a job may do when a pair's digests disagree ("off": the replicas digest nothing)
ON_DIVERGENCE = ("fail", "rebuild", "off")
#: seconds the controller waits for both replicas' answers before it acts without a key
PROBE_WAIT = 5.0


@dataclass
class Probe:
    """A divergence waiting for its replicas' pairs in the groups that differ."""

    found: Divergence
    operator: int
    deadline: float
    answers: Dict[int, Optional[tuple]] = field(default_factory=dict)


class DivergenceSide:
    """The comparison of the pairs' digests, the probe for the first differing key and
    the policy; mixed into ``ControllerService``."""

    def on_cut_digest(self, msg: CutDigest) -> None:
        found = self.divergence.report(msg.addr, msg.digest)
        if found is None or self.error is not None:
            return
        asked = self._probe(found) if found.groups else False
        if not asked:
            self._diverged(found)

    def _probe(self, found: Divergence) -> bool:
        """Ask both replicas for their pairs in the groups that differ; False when one
        is not alive to answer."""
        operator, groups = probe_request(found)
        nodes = {r: self.recovery.node_of.get(Addr(found.stage, found.partition, r))
                 for r in (P, S)}
        if any(node is None or node in self.dead for node in nodes.values()):
            return False
        self.probes[_probe_key(found)] = Probe(found, operator, self.clock() + PROBE_WAIT)
        for r, node in nodes.items():
            self._send(node, ProbeKeys(Addr(found.stage, found.partition, r), found.number,
                                       found.cut, operator, groups), 0)
        return True

    def on_probed_keys(self, msg: ProbedKeys) -> None:
        key = (msg.addr.stage, msg.addr.partition, msg.number, msg.cut)
        probe = self.probes.get(key)
        if probe is None or probe.operator != msg.operator:
            return  # an answer after the deadline
        probe.answers[msg.addr.replica] = msg.pairs
        if len(probe.answers) == 2:
            del self.probes[key]
            self._diverged(name_first_key(probe.found, probe.answers[P], probe.answers[S],
                                          probe.operator))

    def expire_probes(self, now: float) -> None:
        """Probes whose answers did not come in time: act without the key."""
        for key, probe in list(self.probes.items()):
            if now > probe.deadline:
                del self.probes[key]
                log.warning("no answer from both replicas of stage %d partition %d within "
                            "%.0f s: the differing key is not named", probe.found.stage,
                            probe.found.partition, PROBE_WAIT)
                self._diverged(probe.found)

    def _diverged(self, found: Divergence) -> None:
        if self.error is not None:
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
                                      found.operators, found.key)


def _probe_key(found: Divergence) -> Tuple[int, int, int, int]:
    return found.stage, found.partition, found.number, found.cut
