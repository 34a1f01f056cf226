"""The comparison of a pair's digests at each cut (DESIGN 14).

Both replicas of a partition cross every cut both learn, each digesting its operators'
states and the outputs it made since the cut before (``flux.digests``). The controller
pairs the two reports of one partition and one cut, in whatever order they come, and
compares them: a state that differs names the operator; outputs differ only where both
replicas made all of them since the same cut (one installed by a catch-up within the
span, or one that learnt only the newer of two cuts, did not). A replica that dies
before its twin reports leaves a report without its pair: only the newest ``window``
cuts of a partition wait, so nothing grows.

Pure (DESIGN 3): the runtime and the simulator feed it reports and act on what it finds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, Optional, Sequence, Tuple

from flux.addresses import Addr
from flux.digests import Digest, first_differing_key
from flux.keys import MISSING


#: at most this many groups of a keyed digest are asked for (of ``flux.digests.GROUPS``)
PROBED_GROUPS = 16


@dataclass(frozen=True)
class Divergence:
    """The replicas of ``stage``'s partition ``partition`` disagree at the cut ``cut``
    of checkpoint ``number``: the states of the operators ``operators`` (indices in the
    chain) differ, and/or (``outputs``) the outputs they made since the cut before."""

    stage: int
    partition: int
    number: int
    cut: int
    operators: Tuple[int, ...]
    outputs: bool
    #: per differing keyed operator, ``(index, the groups of its digest that differ)``:
    #: where to look for the keys that differ (``flux.digests.KeyedSums``)
    groups: Tuple[Tuple[int, Tuple[int, ...]], ...] = ()
    #: ``(operator index, key)``: a key whose values differ, the first in key order of
    #: the groups asked for (``probe_request``) of both replicas after the comparison;
    #: None: not known
    key: Optional[Tuple[int, Any]] = None

    def describe(self, names: Optional[Sequence[str]] = None) -> str:
        """One line for a log or an error; ``names``: the stage's operators' names."""
        name = lambda i: names[i] if names and i < len(names) else f"operator {i}"  # noqa: E731
        what = []
        if self.operators:
            what.append("the state of " + ", ".join(name(i) for i in self.operators))
        if self.outputs:
            what.append("the outputs since the cut before")
        first = "" if self.key is None else \
            f" (a key whose value differs: {self.key[1]!r:.120} in {name(self.key[0])})"
        return (f"the replicas of stage {self.stage} partition {self.partition} disagree "
                f"at checkpoint {self.number} (cut {self.cut}): {' and '.join(what)} "
                f"differ{first}; an operator of this stage is not deterministic (it iterates a set "
                f"or a dict of strings, reads the clock or draws random numbers), changed a "
                f"value of its KeyedState in place instead of replacing it, or a replica's "
                f"memory was damaged")


class CutPairs:
    """Reports of each partition's two replicas per cut, waiting for each other: a
    replica's newer report of a cut (its successor's) replaces the older; after a restart
    a checkpoint's number may come again with another cut, so a cut is ``(number, cut)``;
    a report whose twin never comes (it died) is forgotten once ``window`` newer cuts of
    its partition wait, so nothing grows."""

    def __init__(self, window: int):
        self.window = window
        #: (stage, partition) -> cut -> replica -> its report
        self._waiting: Dict[Tuple[int, int], Dict[Tuple[int, int], Dict[int, Any]]] = {}

    def pair(self, addr: Addr, cut: Tuple[int, int], report: Any) -> Optional[Tuple[Any, Any]]:
        """Replica ``addr`` reported ``report`` at ``cut``: ``(its report, its twin's)``
        once both are in, else None."""
        cuts = self._waiting.setdefault((addr.stage, addr.partition), {})
        pair = cuts.setdefault(cut, {})
        pair[addr.replica] = report
        if len(pair) < 2:
            while len(cuts) > self.window:
                del cuts[min(cuts)]
            return None
        del cuts[cut]
        return report, pair[1 - addr.replica]

    def waiting(self) -> int:
        return sum(len(cuts) for cuts in self._waiting.values())


class DivergenceMonitor:
    """The reports of each partition's replicas, paired per cut and compared."""

    def __init__(self, window: int = 16):
        self.pairs = CutPairs(window)
        #: pairs compared, and how many disagreed
        self.compared = 0
        self.diverged = 0

    @property
    def window(self) -> int:
        return self.pairs.window

    def report(self, addr: Addr, digest: Digest) -> Optional[Divergence]:
        """Replica ``addr`` crossed a cut with ``digest``: the divergence its twin's
        report of the same cut shows, or None (equal, or the twin's not in yet)."""
        both = self.pairs.pair(addr, (digest.number, digest.cut), digest)
        if both is None:
            return None
        self.compared += 1
        found = compare(addr.stage, addr.partition, *both)
        if found is not None:
            self.diverged += 1
        return found

    def waiting(self) -> int:
        """Reports waiting for their twin's (bounded by ``window`` per partition)."""
        return self.pairs.waiting()


def compare(stage: int, partition: int, a: Digest, b: Digest) -> Optional[Divergence]:
    """What differs between two replicas' digests of one cut, or None."""
    if len(a.states) != len(b.states):  # two chains of different lengths: all of them
        operators = tuple(range(max(len(a.states), len(b.states))))
    else:
        operators = tuple(i for i, (x, y) in enumerate(zip(a.states, b.states)) if x != y)
    outputs = (a.outputs is not None and b.outputs is not None and a.since == b.since
               and a.outputs != b.outputs)
    if not operators and not outputs:
        return None
    return Divergence(stage, partition, a.number, a.cut, operators, outputs,
                      differing_groups(operators, a, b))


def differing_groups(operators: Sequence[int], a: Digest, b: Digest
                     ) -> Tuple[Tuple[int, Tuple[int, ...]], ...]:
    """For each of ``operators`` both digests keep in groups, the groups that differ."""
    found = []
    for i in operators:
        x = a.groups[i] if i < len(a.groups) else None
        y = b.groups[i] if i < len(b.groups) else None
        if x is not None and y is not None and len(x) == len(y):
            found.append((i, tuple(g for g, (u, v) in enumerate(zip(x, y)) if u != v)))
    return tuple(found)


def probe_request(found: Divergence) -> Tuple[int, Tuple[int, ...]]:
    """What both replicas are asked for: the first keyed operator that differs, and up to
    ``PROBED_GROUPS`` of its groups that differ (a store that differs everywhere would
    otherwise send all its pairs)."""
    operator, groups = found.groups[0]
    return operator, groups[:PROBED_GROUPS]


def name_first_key(found: Divergence, mine: Optional[Sequence], twins: Optional[Sequence],
                   operator: int) -> Divergence:
    """``found`` with the first key that differs in ``operator``, from both replicas'
    ``probe_keys`` answers (unchanged if either could not answer)."""
    if mine is None or twins is None:
        return found
    key = first_differing_key(mine, twins)
    return found if key is MISSING else replace(found, key=(operator, key))
