"""Several ingresses, one per source partition, numbering in epochs (DESIGN 12,
docs/design/parallel_io.md).

Which input each ingress reads and in which of its epochs is drawn per seed
(``EpochPlan``): an epoch ends when the runtime's clock says so, which the machines only
see as the ``advance_epoch`` event, so drawing the epochs ahead covers every way they can
fall; the steps of the ingresses still interleave with everything else as the scheduler
chooses. The plan fixes every input's SN, so the failure-free run is that of the inputs
in SN order. After its last input an ingress advances once more, past every epoch of the
plan: its bound then lets the others' last items go.

Checkpoints cut at an epoch's end, one for all ingresses (``Ingress.cut_at_epoch``).
Each ingress logs the SNs it gave before their items leave (the "log" step), so after a
restart the inputs the log covers come again in their epochs; the others may fall into
other epochs (the plan is drawn again past the log), as a clock would cut them anew.
"""
from __future__ import annotations

import random
from bisect import bisect_right
from typing import Any, Dict, List, Optional, Sequence, Tuple

from flux.addresses import Addr, P, S
from flux.protocol.ingress import Ingress
from flux.protocol.ingress_journal import entries_past
from flux.protocol.ingress_pair import ALONE, EPOCH, ITEM
from flux.sim.violation import Violation
from flux.sequence import EPOCH_INPUTS, epoch_first

#: the chance that an ingress's epoch ends before its next input (the plan's draw); an
#: epoch may end with no input at all (an idle source partition)
EPOCH_END = 0.4
#: how many epochs past the ingresses' newest a checkpoint's cut may lie
CUT_AHEAD = (0, 0, 1, 2)
#: how many epochs an ingress may run ahead of the slowest, drawn per seed: epochs are a
#: clock's, so ingresses keep close unless one stalls (None: no limit, as if one did)
SKEWS = (1, 2, 3, None)


class EpochPlan:
    """Each input's ingress and epoch, and the SN that gives it."""

    def __init__(self, inputs: Sequence[Any], ingresses: int, rng: random.Random):
        self.ingresses = ingresses
        self.rng = rng
        #: per ingress, its inputs in its source partition's order: (epoch, SN, record)
        self.reads: List[List[Tuple[int, int, Any]]] = [[] for _ in range(ingresses)]
        parts: List[List[Any]] = [[] for _ in range(ingresses)]
        for record in inputs:
            parts[rng.randrange(ingresses)].append(record)
        for i, records in enumerate(parts):
            self.reads[i] = self._numbered(i, records, 0, 0)
        self.numbers: List[int] = []
        self.inputs: List[Any] = []
        self.last_epoch = 0
        self._order()

    def _numbered(self, i: int, records, epoch: int, used: int) -> List[Tuple[int, int, Any]]:
        """``records`` read by ingress ``i`` from ``epoch``, of which ``used`` numbers are
        taken: an epoch ends before an input with chance ``EPOCH_END``."""
        out = []
        for record in records:
            while self.rng.random() < EPOCH_END:
                epoch, used = epoch + 1, 0
            used += 1
            out.append((epoch, epoch_first(epoch, i, self.ingresses) + used, record))
        return out

    def _order(self) -> None:
        #: every ingress advances to this epoch after its last input; never lower after a
        #: redraw: an ingress may be there already, and cuts were chosen below it
        self.last_epoch = max(self.last_epoch, 1 + max(
            (reads[-1][0] for reads in self.reads if reads), default=0))
        ordered = sorted((sn, record) for reads in self.reads for _, sn, record in reads)
        #: the inputs in SN order, and their SNs: the failure-free run's order (changed in
        #: place by ``redraw``: the oracle's references read them)
        self.numbers[:] = [sn for sn, _ in ordered]
        self.inputs[:] = [record for _, record in ordered]

    def position(self, sn: int) -> int:
        """How many inputs have an SN up to ``sn``."""
        return bisect_right(self.numbers, sn)

    def read_upto(self, i: int, sn: int) -> int:
        """How many of ingress ``i``'s inputs have an SN up to ``sn``."""
        return bisect_right([number for _, number, _ in self.reads[i]], sn)

    def redraw(self, cut: int, logged: List[int], logged_epochs: List[int]) -> bool:
        """A restart after ``cut`` (0: from the start): each ingress's inputs the input log
        does not cover (past its first ``logged[i]``) fall into epochs drawn anew, after
        those it kept and not below the last epoch it logged (``logged_epochs[i]``: its
        bound may have told that); returns whether the order changed."""
        span, before = self.ingresses * EPOCH_INPUTS, list(self.numbers)
        first_epoch = cut // span  # the restarted ingresses number from this epoch on
        for i in range(self.ingresses):
            self._renumber(i, max(logged[i], self.read_upto(i, cut)),
                           max(first_epoch, logged_epochs[i]))
        self._order()
        return self.numbers != before

    def take_over(self, i: int, known: int, epoch: int) -> bool:
        """Ingress ``i``'s leading replica died: its twin heard where its items end up to
        input ``known`` and of its epochs up to ``epoch``; the inputs past it fall into
        epochs drawn anew (the twin's clock, not the dead leader's, ends them now: what
        the leader decided and did not tell never left it). Returns whether the order
        changed."""
        before = list(self.numbers)
        self._renumber(i, self.read_upto(i, known), epoch)
        self._order()
        return self.numbers != before

    def _renumber(self, i: int, keep: int, floor: int) -> None:
        """Ingress ``i``'s inputs past its first ``keep`` into epochs drawn anew, from the
        epoch of the last kept one and not below epoch ``floor``."""
        reads = self.reads[i]
        epoch = reads[keep - 1][0] if keep else 0
        if epoch < floor:
            epoch, used = floor, 0
        else:
            used = sum(1 for e, _, _ in reads[:keep] if e == epoch)
        reads[keep:] = self._numbered(i, [r for _, _, r in reads[keep:]], epoch, used)


class SimIngresses:
    """The ingresses' steps: accept the next input of their source partition, cut an
    item, advance the epoch, make the log durable; and the checkpoints' cuts."""

    def __init__(self, plan: EpochPlan, log_inputs: bool, skew=None, pairs: bool = False):
        self.plan = plan
        self.log_inputs = log_inputs
        self.skew = skew
        #: each ingress a pair of replicas, each reading the source partition by itself
        self.pairs = pairs
        #: per ingress replica, how many inputs of its source partition it read
        self.read: Dict[Addr, int] = {}
        #: per ingress, how many of its reads the input log holds and the epoch it logged
        #: last (kept across restarts)
        self.logged = [0] * plan.ingresses
        self.logged_epochs = [0] * plan.ingresses
        #: per checkpoint, the ingresses that passed its cut and their positions
        self.positions: Dict[int, Dict[int, int]] = {}
        #: per checkpoint, the epoch its cut ends and the live moves it carries (told
        #: again to a pair's new leader), as the runtime's ``NodeIngresses.cuts``
        self.cuts: Dict[int, Tuple[int, Tuple]] = {}
        #: per ingress of pairs, its split's durable epoch log: index -> entry (kept
        #: across restarts, as a file is; ``flux.protocol.ingress_journal``)
        self.files: List[Dict[int, Tuple]] = [{} for _ in range(plan.ingresses)]

    def start(self, cut: int) -> None:
        """A new incarnation, numbering after ``cut`` (0: from the start)."""
        self.read = {a: self.plan.read_upto(i, cut) for i in range(self.plan.ingresses)
                     for a in ((Addr(0, i, P), Addr(0, i, S)) if self.pairs else (Addr(0, i, P),))}
        self.positions = {}
        self.cuts = {}

    def done(self, addr: Addr) -> bool:
        """Ingress replica ``addr`` read every input of its source partition."""
        return self.read[addr] >= len(self.plan.reads[addr.partition])

    def _next_epoch(self, addr: Addr) -> int:
        if self.done(addr):
            return self.plan.last_epoch
        return self.plan.reads[addr.partition][self.read[addr]][0]

    def steps(self, ingress: Ingress, checkpoint: bool, slowest: int,
              held_after: Optional[int] = None) -> List[tuple]:
        """Its local steps other than flushes, in a fixed order; ``checkpoint``: one may
        be taken (asked of ingress 0 only: the driver chooses a cut for all); ``slowest``:
        the lowest epoch of all ingresses; ``held_after``: a drained rescale's epoch, past
        which it accepts no input (its clock goes on: its epochs end, empty)."""
        a, steps = ingress.addr, []
        epoch = self._next_epoch(a)
        # its clock waits for the slowest ingress's (unless it is the slowest)
        waits = self.skew is not None and epoch > slowest + self.skew and ingress.epoch > slowest
        held = held_after is not None and epoch > held_after
        if not self.done(a) and epoch == ingress.epoch and ingress.can_accept() and not held:
            steps.append(("accept", a))
        if ingress.can_cut():
            steps.append(("item", a))  # the pending inputs leave as an item (DESIGN 11)
        if epoch > ingress.epoch and ingress.can_advance() and not waits:
            steps.append(("epoch", a))
        if ingress.log_due():
            steps.append(("log", a))  # the input log made durable up to here
        if checkpoint:
            steps.append(("checkpoint", a))
        return steps

    def apply(self, kind: str, ingress: Ingress) -> List:
        """Take step ``kind`` of ``ingress``; returns its effects."""
        i, a = ingress.index, ingress.addr
        if kind == "accept":
            _, sn, record = self.plan.reads[i][self.read[a]]
            got = ingress.accept(record)
            if got != (sn,):  # the plan and the machine number alike, or the oracle lies
                raise AssertionError(f"ingress {a} numbered an input {got}, the plan {sn}")
            self.read[a] += 1
        elif kind == "item":
            ingress.cut_item()
        elif kind == "epoch":
            return ingress.advance_epoch(self._next_epoch(a))
        elif kind == "log" and self.pairs:
            return self._write(i, ingress)
        elif kind == "log":
            self.logged[i] = max(self.logged[i], self.read[a])
            self.logged_epochs[i] = max(self.logged_epochs[i], ingress.epoch)
            return ingress.inputs_logged(ingress.accepted)
        else:
            raise ValueError(f"unknown ingress step {kind}")
        return []

    # -- the splits' durable epoch logs (pairs) ----------------------------------------
    def _write(self, i: int, ingress: Ingress) -> List:
        """``ingress`` writes the entries it has due to its split's log. Two writers of one
        place write the same entry (a follower, and its leader alone after it died), or
        a restart would follow the other one."""
        entries = ingress.unwritten()
        file = self.files[i]
        for index, entry in entries:
            if file.setdefault(index, tuple(entry)) != tuple(entry):
                raise Violation(f"split {i}'s log: entry {index} written as {file[index]} "
                                f"and as {tuple(entry)}")
        return ingress.journal_written(entries[-1][0])

    def file_entries(self, i: int) -> List[Tuple]:
        """Split ``i``'s log as a restart reads it: its entries in order, no place left
        out."""
        file = self.files[i]
        if sorted(file) != list(range(1, len(file) + 1)):
            raise Violation(f"split {i}'s log has places {sorted(file)}: a hole")
        return [file[n] for n in range(1, len(file) + 1)]

    def logged_for(self, cut: int) -> Tuple[List[int], List[int]]:
        """What the input log fixes for a restart after ``cut``: per ingress, how many of
        its inputs it numbers and the last epoch it starts (the plan keeps those). A
        pair's is its split's log: its last item's inputs, its last epoch's start."""
        if not self.pairs:
            return self.logged, self.logged_epochs
        for i in range(self.plan.ingresses):
            entries = self.file_entries(i)
            items = [e[1] for e in entries if e[0] == ITEM]
            self.logged[i] = self.plan.read_upto(i, max(items)) if items else 0
            self.logged_epochs[i] = max([0] + [e[1] for e in entries if e[0] == EPOCH])
        return self.logged, self.logged_epochs

    def restored_count(self, i: int, cut: int, checkpoint) -> int:
        """Split ``i``'s count at the cut of the ``checkpoint`` restored (None: none, cut
        0), as its manifest recorded it from the pairs' reports: the runtime reads the
        split from there, so it must be how many of the split's inputs the job numbered
        up to the cut."""
        at = self.plan.read_upto(i, cut)
        if checkpoint is None:
            return at
        if checkpoint.position[i] != at:
            raise Violation(f"checkpoint {checkpoint.number} recorded split {i} at "
                            f"{checkpoint.position[i]} inputs; {at} of them lie up to its "
                            f"cut (a replica reported passing it on a count its twin never "
                            f"heard of)")
        return checkpoint.position[i]

    def replay(self, i: int, cut: int) -> Tuple[List[Tuple], int]:
        """Split ``i``'s log past ``cut`` (the entries from the first epoch after it on;
        all of them from the start), and how many entries the log holds."""
        entries = self.file_entries(i)
        return entries_past(entries, cut, self.plan.ingresses), len(entries)

    # -- checkpoints ----------------------------------------------------------------
    def cut_epochs(self, ingresses: List[Ingress], last_cut: int) -> range:
        """The epochs a checkpoint's cut may end now: none an ingress ended already nor
        before the last cut, and one every ingress will still end (the plan's last)."""
        span = self.plan.ingresses * EPOCH_INPUTS
        low = max(max(ing.epoch_decided() for ing in ingresses), last_cut // span)
        return range(low, self.plan.last_epoch)

    def choose_cut(self, ingresses: List[Ingress], number: int, last_cut: int,
                   rng: random.Random, floor: int = 0, moves: Tuple = ()) -> int:
        """Checkpoint ``number`` at the end of an epoch of the scheduler's choosing, its
        cut at or past SN ``floor``, carrying the live ``moves``; every ingress stamps it
        (``cut_at_epoch``), and switches its router as it ends that epoch; returns the
        cut. With no epoch left that every ingress will end (a drained rescale cutting
        again once every ingress read its last input), the clock goes on: the plan's last
        epoch moves one further."""
        epochs = self.cut_epochs(ingresses, last_cut)
        if not epochs:
            self.plan.last_epoch += 1
            epochs = self.cut_epochs(ingresses, last_cut)
        span = self.plan.ingresses * EPOCH_INPUTS
        low = max(epochs.start, -(-floor // span) - 1)  # its end's first SN is >= floor
        if low >= epochs.stop:
            raise AssertionError(f"a cut at or past SN {floor} lies past the plan's epochs")
        epoch = min(low + rng.choice(CUT_AHEAD), epochs.stop - 1)
        for ingress in ingresses:
            ingress.cut_at_epoch(number, epoch, moves)
        self.positions[number] = {}
        self.cuts[number] = (epoch, moves)
        return ingresses[0].epoch_cut(epoch)

    def told(self) -> List[Tuple[int, Tuple[int, Tuple]]]:
        """Every checkpoint cut told this incarnation: (number, (epoch, moves)). A
        replica that takes over is told each again whose epoch it has not ended (its dead
        leader may have passed one whose entry it never heard, and numbers inputs above
        it)."""
        return sorted(self.cuts.items())

    def passed(self, number: int, ingress: int, cut: int, read: int) -> Tuple[int, ...]:
        """Ingress ``ingress`` passed checkpoint ``number``'s cut ``cut`` having read
        ``read`` inputs: the source positions of every ingress once all did (how many
        inputs each read up to the cut), else (). Both replicas of a pair report it (the
        second report is none), each with its split's count, which a restart reads the
        split from: it must be the plan's."""
        at = self.plan.read_upto(ingress, cut)
        if self.pairs and read != at:
            raise Violation(f"ingress {ingress} passed checkpoint {number}'s cut having read "
                            f"{read} inputs of its split; {at} lie up to the cut")
        got = self.positions.setdefault(number, {})
        if ingress in got:
            return ()
        got[ingress] = at
        if len(got) < self.plan.ingresses:
            return ()
        return tuple(got[i] for i in range(self.plan.ingresses))


def ingress_claims(world) -> List[Tuple[Ingress, bool]]:
    """Each ingress of ``world``, and whether it read every input of its source (the item
    it has pending is then its last): what bounds the egresses' claims
    (``SettledOracle.check``)."""
    if world.epochs is None:
        return [(world.ingress, world.next_input >= len(world.inputs))]
    return [(ingress, world.epochs.done(ingress.addr)) for ingress in world.ingresses]


def ingress_took_over(world) -> None:
    """After a view: an ingress whose leading replica died leads from its twin now (which
    cut what it heard, then decides by itself): the plan's epochs past what the twin heard
    are drawn anew, and the failure-free run is that of the new order."""
    for i, leader in enumerate(world.ingresses):
        # where its twin lives now (a new replica, once its standby applied the view)
        twin = world.hosts[world.host_of[leader.dual]].machines.get(leader.dual)
        if twin is None or twin is leader or twin.role is not ALONE:
            continue
        world.ingresses[i] = twin
        for number, (cut_epoch, moves) in world.epochs.told():  # it may never have heard
            if twin.takes_cut(number, cut_epoch):  # them (as the runtime's ``tell_cuts``)
                twin.cut_at_epoch(number, cut_epoch, moves)
        heard = list(twin.to_follow)
        known = max([twin.accepted] + [e[1] for e in heard if e[0] == ITEM])
        epoch = max([twin.epoch] + [e[1] for e in heard if e[0] == EPOCH])
        for oracle in world.settled_oracles:
            oracle.took_over(i, known)
        if world.epochs.plan.take_over(i, known, epoch):
            world.inputs[:] = world.epochs.plan.inputs
            world.on_reorder(world.inputs, world.epochs.plan.numbers)
            for oracle in world.settled_oracles:
                oracle.reordered(world.inputs)
