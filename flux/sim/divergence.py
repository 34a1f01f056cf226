"""The pairs' digests compared as the controller compares them, and the oracle of that
comparison (DESIGN 14).

Every snapshot a replica takes at a cut carries its digests; the controller's
``DivergenceMonitor`` pairs them per partition and cut. The simulator knows the truth
the digests stand for: each replica's operators' states at the cut. So for every pair
the monitor compares, the oracle compares the states themselves: states that differ
with digests that agree is a divergence missed; digests that disagree in a run whose
operators are deterministic is a false alarm (a replica that made other outputs, or a
digest that depends on more than the state: the order keys went in, a catch-up's
parts). A divergence found in a run that has a nondeterministic operator stops the job
(``on_divergence="fail"``): the schedule ends ``diverged``.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from controller.divergence import (
    CutPairs,
    Divergence,
    DivergenceMonitor,
    name_first_key,
    probe_request,
)
from flux.effects import Snapshot
from flux.keys import MISSING, tuplify
from flux.operator import wire_form
from flux.sim.oracle import Violation


def _pairs(state: Any) -> Optional[dict]:
    """A keyed store's state as ``{key: value}`` (its wire form lists the pairs), or None."""
    try:
        return {tuplify(k): v for k, v in state}
    except (TypeError, ValueError):
        return None


class SimDivergence:
    """The monitor and its oracle for one world (fresh at each restart, as the
    controller's is)."""

    def __init__(self, deterministic: bool):
        #: False: a run with a nondeterministic operator, where a divergence is expected
        self.deterministic = deterministic
        #: pairs of digests compared, over every incarnation of the job
        self.compared = 0
        #: divergences whose replicas were asked for keys, and how many named one
        self.probed = self.named = 0
        self.reset()

    def reset(self) -> None:
        self.monitor = DivergenceMonitor()
        #: each replica's operators' states at a cut, paired with its twin's
        self._truth = CutPairs(self.monitor.window)

    def snapshot(self, e: Snapshot, segment: Any, live_segment: Callable) -> Optional[Divergence]:
        """Replica ``e.addr`` (``segment``) crossed a cut: what the monitor finds, judged
        against the states, with the first differing key its replicas name (``live_segment``
        finds the twin, asked as the controller asks it). Raises ``Violation`` for a
        missed divergence, a false alarm, or a key named wrongly."""
        if e.digest is None:
            return None
        # the states, paired as the monitor pairs digests
        truth = self._truth.pair(e.addr, (e.number, e.cut), wire_form(segment.chain.get_state()))
        found = self.monitor.report(e.addr, e.digest)
        if truth is None:
            if found is not None:
                raise Violation(f"{e.addr}: the monitor compared checkpoint {e.number} before "
                                f"both replicas reported it: {found}")
            return None
        self.compared += 1
        mine, twins = truth
        differ = tuple(i for i, (a, b) in enumerate(zip(mine, twins)) if a != b)
        if differ and (found is None or found.operators != differ):
            raise Violation(f"{e.addr}: checkpoint {e.number} (cut {e.cut}): the states of "
                            f"operators {differ} differ between the replicas, the digests "
                            f"found {found.operators if found else 'nothing'}: {mine!r} != "
                            f"{twins!r}")
        if found is not None and (self.deterministic or (found.operators and not differ)):
            raise Violation(f"false alarm: {found.describe()} ({found}); the states "
                            f"{'differ' if differ else 'are equal'}")
        if found is not None and found.groups:
            found = self._name_key(found, e, segment, live_segment(e.addr.twin), mine, twins)
        return found

    def _name_key(self, found: Divergence, e: Snapshot, segment: Any, other: Any,
                  mine: list, twins: list) -> Divergence:
        """Both replicas asked for their pairs in the groups that differ, as of the cut: a
        key named must be one whose values differ there; where both could answer, one is
        named."""
        operator, groups = probe_request(found)
        answers = [s.probe_keys(e.number, e.cut, operator, groups) if s is not None else None
                   for s in (segment, other)]
        named = name_first_key(found, *answers, operator)
        self.probed += 1
        pairs = [_pairs(state[operator]) for state in (mine, twins)]
        if named.key is None:
            if None not in answers:
                raise Violation(f"{e.addr}: both replicas answered for the groups {groups} "
                                f"that differ, and no key was named: {answers}")
            return named
        self.named += 1
        key = named.key[1]
        if None not in pairs and pairs[0].get(key, MISSING) == pairs[1].get(key, MISSING):
            raise Violation(f"{e.addr}: key {key!r} named as differing, but both replicas "
                            f"hold {pairs[0].get(key, MISSING)!r} at the cut")
        return named
