"""The oracle of DESIGN 8: failure transparency, checked as the run goes.

- every delivered prefix is a prefix of the failure-free output;
- at quiescence everything was delivered (else: a deadlock or a stall);
- at quiescence no buffer or merge queue still holds a tuple (buffers stay
  bounded: nothing is kept forever waiting for an ack that never comes);
- every live replica's operator state equals the failure-free state of its
  partition, so the two replicas of a pair are equal;
- the egress never claims more than it delivered: ``settled()`` and ``finished(n)``
  stay below the first failure-free output it has not delivered yet.
"""
from __future__ import annotations

from bisect import bisect_right

from collections import deque
from itertools import accumulate, repeat
from typing import Any, Deque, Dict, List, Optional, Sequence

from flux.addresses import S, Addr
from flux.operator import wire_form
from flux.reference import ReferenceRun
from flux.sim.ingresses import ingress_claims
from flux.sim.violation import Violation  # noqa: F401 (the oracles' verdict, from here too)


class PrefixOracle:
    """Checks each delivered item against the reference as it arrives: what each sink
    partition holds is a prefix of the failure-free output of its partition (with one
    ordered egress, one partition: the whole output).

    Items are compared in msgpack's wire form: state that moved to a new
    replica travelled as msgpack, so its tuples come back as lists."""

    def __init__(self, reference: Sequence[Any], parts: Optional[Sequence[int]] = None):
        self.set_reference(reference, parts)

    def set_reference(self, reference: Sequence[Any],
                      parts: Optional[Sequence[int]] = None) -> None:
        """The failure-free outputs and (an egress per partition) each one's partition;
        what the sink holds is judged again from its start."""
        self.partitioned = parts is not None
        self.by_part: Dict[int, List[Any]] = {}
        for item, p in zip(reference, parts if parts is not None else repeat(0)):
            self.by_part.setdefault(p, []).append(wire_form(item))
        self.checked = 0
        self.pos: Dict[int, int] = {}

    def rewind(self, sink) -> None:
        """The sink dropped what it had not committed (each partition keeps a prefix of
        its outputs): what was judged of what it still holds stays judged."""
        self.pos = {p: min(at, len(sink.held.get(p, ()))) for p, at in self.pos.items()}
        self.checked = sum(self.pos.values())

    def check(self, sink) -> None:
        arrivals, parts, pos = sink.arrivals, sink.parts, self.pos
        for i in range(self.checked, len(arrivals)):
            p = parts[i]
            ref, at = self.by_part.get(p, []), pos.get(p, 0)
            got = wire_form(arrivals[i])
            where = f" of partition {p}" if self.partitioned else ""
            if at >= len(ref):
                raise Violation(f"extra output #{at}{where}: {got!r} (reference has {len(ref)})")
            if got != ref[at]:
                raise Violation(f"output #{at}{where} is {got!r}, reference has {ref[at]!r}")
            pos[p] = at + 1
        self.checked = len(arrivals)


class FailureFreeOutputs:
    """The failure-free outputs of one order of the inputs, computed once for every oracle
    that asks: with an egress per partition, each egress's oracle takes its partition's."""

    def __init__(self, dataflow, partitions: int, numbers: Optional[Sequence[int]] = None):
        """``numbers``: the inputs' SNs where they are not 1, 2, 3, ... (several ingresses
        number in epochs; the inputs come in SN order)."""
        self.dataflow, self.partitions, self.numbers = dataflow, partitions, numbers
        self.inputs: Optional[list] = None
        self._numbers_of: Optional[list] = None  # the numbers ``outputs`` are of
        self.outputs: list = []  # (sn, record), in SN order
        self._partitions: list = []  # the last-stage partition of each output
        #: each output's sink partition where live moves of the last stage changed it
        self.parts: Optional[list] = None
        self.made: list = []  # how many outputs each input made

    def of(self, inputs: Sequence[Any]) -> "FailureFreeOutputs":
        numbers = None if self.numbers is None else list(self.numbers)
        if self.inputs != inputs or numbers != self._numbers_of:
            self._numbers_of = numbers
            run = ReferenceRun(self.dataflow, self.partitions)
            outputs, made = [], []
            numbers = self.numbers
            for k, record in enumerate(inputs):
                new = run.feed(record, None if numbers is None else numbers[k])
                outputs += new
                made.append(len(new))
            self.inputs, self.outputs, self.made = list(inputs), outputs, made
            self._partitions = run.output_partitions
        return self

    @property
    def partition_of(self) -> list:
        """Each output's sink partition: the reference run's, or ``parts`` where live
        moves of the last stage send outputs elsewhere (the same outputs, in order)."""
        if self.parts is not None:
            if len(self.parts) != len(self.outputs):
                raise AssertionError(f"{len(self.parts)} sink partitions for "
                                     f"{len(self.outputs)} outputs")
            return self.parts
        return self._partitions


class SettledOracle:
    """The egress's claims on what it delivered, against the failure-free run.

    ``settled()`` = n says every output of inputs 1..n was delivered (the driver then
    forgets their arrival times, flux/runtime/metrics.py); ``finished(n)`` says the same
    once no item numbered above n can hold an input up to n (the driver asks it of every
    input read when the source is exhausted, and ends the job): n is the last input of an
    item cut, or of the last item to come. Neither may claim the input of the first
    failure-free output the egress has not delivered yet (DESIGN 4.3, 11).

    Judged within an incarnation of the job: a restarted egress is new and numbers the
    inputs after the restored cut (whose outputs were delivered and committed before), in
    the world's current order of the inputs (a restart may read the unlogged ones in
    another). The outputs the egress delivers are followed one by one, so a check costs
    O(1) amortized and a run O(outputs): the failure-free outputs are computed once per
    order of the inputs, and each delivered output is matched against the next one.
    Should the egress deliver one that is not the next (a duplicate, a lost tuple), the
    prefix oracle judges the output; its claims are not judged again in that incarnation.
    """

    def __init__(self, dataflow, partitions: int, partition: Optional[int] = None,
                 reference: Optional[FailureFreeOutputs] = None):
        """``partition``: the one last-stage partition an egress of its own delivers
        (None: the ordered egress, all of them); ``reference``: the failure-free outputs,
        shared by the oracles of a world's egresses."""
        self.reference = reference or FailureFreeOutputs(dataflow, partitions)
        self.partition = partition
        self.inputs: Optional[list] = None  # the order the outputs below are of
        self._of: Optional[list] = None  # the failure-free outputs the lists below are of
        self.outputs: list = []  # the failure-free (sn, record) outputs, in SN order
        self.upto = [0]  # [n]: how many of them the first n inputs make
        self.cut = 0  # the cut this incarnation resumed after
        self.next = 0  # the position of the next failure-free output to be delivered
        self.diverged = False
        #: a writer that resumed after its sink's last commit sends the committed item
        #: again, whose outputs the sink drops: outputs at or below this SN are not judged
        self.committed: Optional[tuple] = None
        #: per ingress, the numbers (last inputs) of items cut, as seen at checks, not below
        #: the input of the next output still to come: finished(n) of any must be false
        self.items: Dict[int, Deque[int]] = {}

    def begin(self, inputs: Sequence[Any], cut: int) -> None:
        """A new egress, numbering the inputs after the first ``cut`` (a checkpoint covers
        them: with several ingresses, those whose SNs are up to its cut)."""
        ref = self.reference.of(inputs)
        if self._of is not ref.outputs:  # another order of the inputs, or other SNs
            self._of = ref.outputs
            mine = None if self.partition is None else [p == self.partition
                                                        for p in ref.partition_of]
            if mine is None:  # every output: the shared list, never changed
                outputs, upto = ref.outputs, [0, *accumulate(ref.made)]
            else:
                outputs, upto, at = [], [0], 0
                for made in ref.made:
                    outputs += [o for o, m in zip(ref.outputs[at:at + made],
                                                  mine[at:at + made]) if m]
                    at += made
                    upto.append(len(outputs))
            self.inputs, self.outputs, self.upto = ref.inputs, outputs, upto  # shared, kept
        self.cut = cut
        self.next = self.upto[cut]
        self.diverged = False
        self.committed = None
        self.items.clear()

    def took_over(self, index: int, known: int) -> None:
        """Ingress ``index``'s leader died, its twin heard of its items up to input
        ``known``: the items the leader cut past it never left it, and are no items now
        (its twin cuts those inputs where its own clock says)."""
        items = self.items.get(index)
        while items and items[-1] > known:
            items.pop()

    def reordered(self, inputs: Sequence[Any]) -> None:
        """The inputs' order changed within the incarnation (an ingress's twin took over
        and numbers the inputs its dead leader never let go anew): only inputs no output
        was delivered of moved, so the outputs delivered keep their places."""
        delivered, diverged, committed = self.next, self.diverged, self.committed
        self._of = None
        self.begin(inputs, self.cut)
        self.next, self.committed = delivered, committed
        self.diverged = diverged  # (blind: its count of what was delivered is stale)

    def resume(self, committed: Optional[Any]) -> None:
        """A sink's writer started again after ``committed``, the last output its sink
        committed (None: none yet): the sink dropped what it had not."""
        start = self.upto[self.cut]
        if committed is not None:
            sns = [tuple(o[0]) for o in self.outputs]
            start = max(start, bisect_right(sns, tuple(committed)))
        self.next = start
        self.diverged = False
        self.committed = tuple(committed) if committed is not None else None
        self.items.clear()

    def delivered(self, items: Sequence[Any]) -> None:
        """The egress delivered ``items``, (sn, record) each, in order."""
        if self.diverged:
            return
        pos, outputs, committed = self.next, self.outputs, self.committed
        for item in items:
            sn = item[0]
            if committed is not None and tuple(sn) <= committed:
                continue  # sent again after a writer resumed: the sink drops it
            if pos >= len(outputs) or (sn != outputs[pos][0] and tuple(sn) != outputs[pos][0]):
                self.diverged = True
                return
            pos += 1
        self.next = pos

    def check(self, egress, ingresses) -> None:
        """Raise a Violation if ``egress`` claims an output it has not delivered.
        ``ingresses``: each ingress and whether it read every input of its source: the
        last item each cut bounds ``finished``'s claims, and once it read everything, the
        item still pending is its last."""
        pos = self.next
        if self.diverged or pos >= len(self.outputs):
            return
        missing = self.outputs[pos]
        first = missing[0][0]  # the input of the first output still to come
        settled = egress.settled()
        if settled >= first:
            raise Violation(self._claim(f"settled() is {settled}", missing, first))
        asked = []
        for ingress, source_done in ingresses:
            items, last = self.items.setdefault(ingress.index, deque()), ingress.last_item
            if last >= first and (not items or last > items[-1]):
                items.append(last)
            while items and items[0] < first:
                items.popleft()
            # items cut whole at or past the input of the first output still to come (the
            # first seen, the last cut): finished(n) of each claims that output, so is false
            asked += [items[0], items[-1]] if items else []
            if source_done and ingress.accepted > last and ingress.accepted >= first:
                asked.append(ingress.accepted)  # the last item, still to be cut
        for n in asked:
            if egress.finished(n):
                raise Violation(self._claim(f"finished({n}) is true", missing, first))

    def _claim(self, what: str, missing, first: int) -> str:
        done = self.next - self.upto[self.cut]
        egress = "the egress" if self.partition is None else f"partition {self.partition}'s egress"
        return (f"{egress}'s {what}, but the output {wire_form(missing)!r} of input {first} "
                f"was not delivered (the egress resumed after input {self.cut} and "
                f"delivered {done} outputs since)")


def settled_oracles(world) -> List[SettledOracle]:
    """An oracle per egress of ``world`` at its partition count, sharing the failure-free
    outputs (each one's sink partition as the last stage's live moves left it, if any:
    ``settled_parts``)."""
    config = world.config
    reference = FailureFreeOutputs(world.dataflow, world.partitions,
                                   config.epochs.numbers if config.epochs else None)
    reference.parts = world.moves.sinks.parts
    return [SettledOracle(world.dataflow, world.partitions,
                          None if config.ordered_output else p, reference)
            for p in range(world.sink_partitions)]


def settled_parts(world, parts: List[int]) -> None:
    """Each failure-free output's sink partition is ``parts`` now (a live move of the last
    stage was cut: the outputs past it go to other partitions, none of which was made
    yet): each egress's oracle follows, what it judged delivered staying judged."""
    world.moves.sinks.parts = parts
    for oracle in world.settled_oracles:
        oracle.reference.parts = parts
        if oracle.inputs is not None:
            oracle.reordered(world.inputs)


def writer_lost(world, k: int) -> bool:
    """Checkpoint ``k`` may stay incomplete only because a partition's writer halted
    before writing: every partition it waits for was crossed by the replica that does
    not write, and the S replica (the writer) was on a process that halted."""
    c = world.coordinator.checkpoints.get(k)
    if c is None:
        return False
    waiting = [(s, p) for s in range(1, world.coordinator.stages + 1)
               for p in range(world.coordinator.partitions) if (s, p) not in c.parts]
    return bool(waiting) and c.has_position and c.has_sink and all(
        (k, s, p) in world.store.skipped and Addr(s, p, S) in world.faults.halted_replicas
        for s, p in waiting)


def final_checks(world, expected: int, reference_states) -> Optional[str]:
    """What is wrong at quiescence, or None."""
    delivered = world.outcome.delivered
    problems: List[str] = []
    if len(delivered) != expected:
        problems.append(f"stalled: delivered {len(delivered)} of {expected} outputs")
    cuts = world.outcome.cuts
    # every checkpoint completes, or a later one completes (it is abandoned), or its writer
    # was lost, or a later one's was: a replica that learns of two cuts at once crosses only
    # the newer, and if that one's writer is then lost, the older one waits forever: harmless;
    # so does one a snapshot of which could not be written (its chain lost a file)
    settled = [k for k, _ in cuts if k in world.outcome.complete or writer_lost(world, k)
               or k in world.store.write_failed]
    unfinished = [k for k, _ in cuts if k not in world.outcome.complete
                  and k not in world.coordinator.abandoned()
                  and not any(j >= k for j in settled)]
    if unfinished:
        problems.append(f"checkpoints {unfinished} never completed: " + "; ".join(
            f"{k} waits for {', '.join(world.coordinator.missing(k))}" for k in unfinished))
    stalled = world.moves.pairs.leave_stalled()
    if stalled:
        problems.append(stalled)
    try:
        for oracle, egress in zip(world.settled_oracles, world.egresses):
            oracle.check(egress, ingress_claims(world))
    except Violation as exc:
        problems.append(str(exc))
    rec = world.recovery
    # (cluster pairs rebuild no lost set yet: docs/design/divergence.md)
    if rec.missing and (rec.free or rec.attempts) and rec.placement.rebuilds:
        problems.append(f"catch-up stalled: {sorted(map(str, rec.missing))} still missing "
                        f"with standbys {rec.free or sorted(a.standby for a in rec.attempts.values())}")
    for name, host in world.hosts.items():  # the StateMovers' own rules (kept copies too)
        if world.alive[name] and host.mover is not None:
            host.mover.check_invariants()
    for addr, m in world.live_machines():
        m.check_invariants()
        if not m.idle():
            problems.append(f"{addr} still holds tuples at quiescence: {describe(m)}")
        chain = getattr(m, "chain", None)
        if chain is not None and reference_states is not None:
            want = wire_form(reference_states[addr.stage - 1][addr.partition])
            got = wire_form(chain.get_state())
            if got != want:
                problems.append(f"{addr} state differs from the failure-free state: {got!r} != {want!r}")
    return "; ".join(problems) if problems else None


def describe(m) -> str:
    parts = []
    fprod = getattr(m, "fprod", None) or getattr(m, "out", None)
    out = getattr(fprod, "out", fprod)
    if out is not None and hasattr(out, "buffers"):
        parts += [f"buffer[{i}]={b!r}" for i, b in enumerate(out.buffers) if len(b)]
    fcons = getattr(m, "fcons", None)
    if fcons is not None and fcons.merge.queued():
        parts.append(repr(fcons.merge))
    return ", ".join(parts)
