"""Several ingresses, one per source partition, numbering in epochs (DESIGN 12,
docs/design/parallel_io.md).

Which input each ingress reads and in which of its epochs is drawn once per seed
(``EpochPlan``): an epoch ends when the runtime's clock says so, which the machines only
see as the ``advance_epoch`` event, so drawing the epochs ahead covers every way they can
fall; the steps of the ingresses still interleave with everything else as the scheduler
chooses. The plan fixes every input's SN, so the failure-free run is that of the inputs
in SN order. After its last input an ingress advances once more, past every epoch of the
plan: its bound then lets the others' last items go.
"""
from __future__ import annotations

import random
from typing import Any, List, Sequence, Tuple

from flux.protocol.ingress import Ingress
from flux.sequence import epoch_first

#: the chance that an ingress's epoch ends before its next input (the plan's draw); an
#: epoch may end with no input at all (an idle source partition)
EPOCH_END = 0.4


class EpochPlan:
    """Each input's ingress and epoch, and the SN that gives it."""

    def __init__(self, inputs: Sequence[Any], ingresses: int, rng: random.Random):
        self.ingresses = ingresses
        #: per ingress, its inputs in its source partition's order: (epoch, SN, record)
        self.reads: List[List[Tuple[int, int, Any]]] = [[] for _ in range(ingresses)]
        epoch, used = [0] * ingresses, [0] * ingresses
        for record in inputs:
            i = rng.randrange(ingresses)
            while rng.random() < EPOCH_END:
                epoch[i] += 1
                used[i] = 0
            used[i] += 1
            self.reads[i].append((epoch[i], epoch_first(epoch[i], i, ingresses) + used[i],
                                  record))
        #: every ingress advances to this epoch after its last input
        self.last_epoch = max(epoch) + 1
        ordered = sorted((sn, record) for reads in self.reads for _, sn, record in reads)
        #: the inputs in SN order, and their SNs: the failure-free run's order
        self.numbers = [sn for sn, _ in ordered]
        self.inputs = [record for _, record in ordered]


class SimIngresses:
    """The ingresses' steps: accept the next input of their source partition, cut an
    item, advance the epoch."""

    def __init__(self, plan: EpochPlan):
        self.plan = plan
        self.read = [0] * plan.ingresses

    def reset(self) -> None:
        self.read = [0] * self.plan.ingresses

    def done(self, i: int) -> bool:
        """Ingress ``i`` read every input of its source partition."""
        return self.read[i] >= len(self.plan.reads[i])

    def all_done(self) -> bool:
        return all(self.done(i) for i in range(self.plan.ingresses))

    def _next_epoch(self, i: int) -> int:
        return self.plan.last_epoch if self.done(i) else self.plan.reads[i][self.read[i]][0]

    def steps(self, ingress: Ingress) -> List[tuple]:
        """Its local steps other than flushes, in a fixed order."""
        i, steps = ingress.index, []
        epoch = self._next_epoch(i)
        if not self.done(i) and epoch == ingress.epoch and ingress.can_accept():
            steps.append(("accept", i))
        if ingress.can_cut():
            steps.append(("item", i))  # the pending inputs leave as an item (DESIGN 11)
        if epoch > ingress.epoch and ingress.can_advance():
            steps.append(("epoch", i))
        return steps

    def apply(self, kind: str, ingress: Ingress) -> None:
        i = ingress.index
        if kind == "accept":
            _, sn, record = self.plan.reads[i][self.read[i]]
            got = ingress.accept(record)
            if got != (sn,):  # the plan and the machine number alike, or the oracle lies
                raise AssertionError(f"ingress {i} numbered an input {got}, the plan {sn}")
            self.read[i] += 1
        elif kind == "item":
            ingress.cut_item()
        elif kind == "epoch":
            ingress.advance_epoch(self._next_epoch(i))
        else:
            raise ValueError(f"unknown ingress step {kind}")
