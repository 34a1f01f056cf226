"""The ingress replicas a node runs: pairs of ingresses, one pair per split of a
``flux.SplitSource`` (DESIGN 12, docs/design/parallel_io.md).

Each replica reads its split by itself (``read_split``), from the count its state says:
a replica built with the node from the first input, one rebuilt on a standby from where
its twin's numbering stopped. Epochs end on the wall clock: epoch ``e`` begins at
``origin + e * interval`` for every ingress of the job, so the ingresses keep in step
(a merge releases an epoch's items once every ingress ended it) and a replica that
falls behind jumps to the clock's epoch rather than holding every merge back. The
leader ends its epochs; a follower cuts what it heard (``flux.protocol.ingress_pair``).
A replica that read its whole split says so once (``IngressEnded``): the driver's end of
the job waits for every split's last SN.

With checkpoints, each replica's due entries go to its split's durable log
(``SplitLogWriter``, off this thread) before what they number leaves; the coordinator's
cuts (``CutAtEpoch``) are told to the replicas that decide, again after every view (a
replica that took over may never have heard its dead leader's), and a restart has both
replicas of each pair follow their split's log past the restored cut (``resume``).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from flux.connector_api import SeekableSplits, SplitReader
from flux.control_messages import HoldInputs, IngressEnded
from flux.errors import OperatorError
from flux.operator import describe
from flux.protocol.host import Host
from flux.runtime.source_intake import SourceIntake
from flux.sequence import epoch_at
from flux.runtime.split_log_writer import SplitLogWriter

log = logging.getLogger(__name__)

#: the coordinator's cuts a node keeps telling its replicas after views (the newest)
CUTS_KEPT = 16
#: how soon the loop looks again while a log write is under way (seconds)
WRITE_POLL = 0.001


class NodeIngresses:
    """The intakes of the ingress replicas on one node, and their epoch clock."""

    def __init__(self, source: Any, interval: float, origin: float,
                 wall: Callable[[], float] = time.time,
                 logs: Optional[SplitLogWriter] = None):
        """``source``: the job's ``SplitSource``; ``wall``: the clock epochs follow;
        ``logs``: the splits' durable logs (None without checkpoints: entries count as
        written at once, no restart reads them)."""
        self.source = source
        self.logs = logs
        #: replicas with a write under way (address -> the replica)
        self.writing: Dict[Any, Any] = {}
        #: the coordinator's cuts told so far: checkpoint -> (the epoch its cut ends, the
        #: live moves it carries)
        self.cuts: Dict[int, Tuple[int, tuple]] = {}
        #: a drained rescale's epoch (``HoldInputs``): no replica that decides takes an
        #: input into a later one (None: no drain)
        self.hold_after: Optional[int] = None
        self.interval = interval
        self.origin = origin
        self.wall = wall
        #: ingress address -> (the replica, the intake of its split, the split's reader if
        #: it knows its position, else None)
        self.intakes: Dict[Any, Tuple[Any, SourceIntake, Any]] = {}
        #: split -> where its source stood at a count at or before a restart's cut
        #: (seekable sources: ``resume``)
        self.restored_marks: Dict[int, Tuple[int, Any]] = {}
        #: the replicas that said their split is read (one report each)
        self.reported: set = set()

    def epoch_now(self) -> int:
        """The epoch the wall clock is in."""
        return epoch_at(self.wall(), self.origin, self.interval)

    def epoch_start(self, epoch: int) -> float:
        """When epoch ``epoch`` began (wall clock)."""
        return self.origin + epoch * self.interval

    def _running(self, host: Host) -> List[Tuple[Any, Any]]:
        return [(a, m) for a, m in host.machines.items() if a.stage == 0 and m.running()]

    def accept(self, host: Host, touch: Callable[[Any], None]) -> bool:
        """Each running replica accepts what its split has (one whose epoch the clock
        ended takes nothing until it ends it: under load, its buffers' room would
        otherwise go to more inputs of an epoch that never ends); did any accept?"""
        moved, epoch = False, self.epoch_now()
        running = self._running(host)
        for addr in [a for a in self.intakes if a not in host.machines]:
            del self.intakes[addr]  # no longer here (its node's view moved it)
        hold = self.hold_after
        for addr, ingress in running:
            if ingress.decides() and epoch > ingress.epoch:
                continue  # its epoch is over: it ends it (``advance``) before taking more
            if hold is not None and ingress.decides() and ingress.epoch > hold:
                continue  # a rescale drains: nothing past its cut (a follower takes only
                # what its leader numbered)
            try:
                intake, reader = self._intake(addr, ingress)
                if not intake.done and intake.feed(ingress, ingress.batch_rows):
                    touch(addr)
                    moved = True
                    if reader is not None and intake.drained():
                        ingress.mark_source(ingress.inputs, reader.position)
            except OperatorError:
                raise  # the next stage's key raised on an input: named already
            except Exception as exc:
                # both replicas read the same split: failing over would fail again
                raise OperatorError(f"reading split {addr.partition} of "
                                    f"{type(self.source).__name__}", 0, addr.partition,
                                    (ingress.accepted + 1,), describe(exc)) from exc
        return moved

    def _intake(self, addr, ingress) -> Tuple[SourceIntake, Any]:
        """The intake of ``ingress``'s split and its reader (None: it knows no position;
        asked once, not at every turn); opened where its numbering
        stands when the replica is new here (a seekable source from the newest mark
        known at or before that count)."""
        held = self.intakes.get(addr)
        if held is None or held[0] is not ingress:
            split, count = addr.partition, ingress.inputs
            mark = self._mark(ingress, split, count) \
                if isinstance(self.source, SeekableSplits) else None
            if mark is None:
                reader = self.source.read_split(split, count)
            else:
                reader = self.source.read_split_from(split, mark[1], count - mark[0])
            held = self.intakes[addr] = (ingress, SourceIntake(iter(reader)), reader
                                         if isinstance(reader, SplitReader) else None)
            log.info("%s reads split %d from input %d%s", addr, split, count,
                     f" (at {mark[1]!r}, input {mark[0]})" if mark else "")
        return held[1], held[2]

    def advance(self, host: Host, touch: Callable[[Any], None]) -> List:
        """End the epoch of every replica that leads (or is alone) once the clock is in a
        later one, and have every follower cut what it heard of; the effects of the ends
        (``CutPassed``: none without checkpoints)."""
        effects: List = []
        now = self.epoch_now()
        for addr, ingress in self._running(host):
            if not ingress.decides():
                if ingress.can_cut():  # a follower: the items and epochs it heard of, now
                    ingress.cut_item()  # (an epoch's start with no input pending too)
                    touch(addr)
            elif now > ingress.epoch and ingress.can_advance():
                effects += ingress.advance_epoch(now)
                touch(addr)
        return effects

    def write_logs(self, host: Host, touch: Callable[[Any], None]) -> List:
        """Each replica's entries due for its split's log (what a follower heard, what one
        alone decided), once written: its items they end may leave, a follower acks its
        leader. Without a durable log: at once."""
        effects: List = []
        if self.logs is not None:
            for (addr, ingress), upto in self.logs.done():
                if self.writing.get(addr) is ingress:
                    del self.writing[addr]
                if host.machines.get(addr) is ingress and ingress.log_due():
                    effects += ingress.journal_written(upto)
                    touch(addr)
        for addr, ingress in self._running(host):
            if not ingress.log_due() or addr in self.writing:
                continue
            if self.logs is None:
                effects += ingress.journal_written(ingress.unwritten()[-1][0])
                touch(addr)
            else:
                self.writing[addr] = ingress
                self.logs.submit((addr, ingress), addr.partition, ingress.unwritten())
        return effects

    def step(self, host: Host, touch: Callable[[Any], None]) -> Tuple[bool, List, List]:
        """One turn: the entries heard are written, the epochs due end (inputs go into the
        clock's epoch), then the splits are read; whether inputs were taken, the effects,
        the reports."""
        effects = self.write_logs(host, touch)
        effects += self.advance(host, touch)
        effects += self.write_logs(host, touch)  # the leader's ends alone: theirs at once
        return self.accept(host, touch), effects, self.ended()

    def due(self, host: Host, now: float) -> Optional[float]:
        """When (on the clock ``now`` is read from) the next epoch of a replica here
        begins, or soon while a log write is under way; None: none here."""
        epochs = [m.epoch for _, m in self._running(host)]
        if not epochs:
            return None
        if self.writing:
            return now + WRITE_POLL
        return now + max(0.0, self.epoch_start(min(epochs) + 1) - self.wall())

    def ended(self) -> List[IngressEnded]:
        """A report for each replica that read its whole split and whose last item left
        (a leader's, once its twin acked it: the SN it reports is then the one its twin
        would cut should it die)."""
        out = []
        for addr, (ingress, intake, _) in self.intakes.items():
            if addr in self.reported or not intake.done or not ingress.items_left():
                continue
            self.reported.add(addr)
            out.append(IngressEnded(addr.partition, ingress.last_item, ingress.inputs))
        return out

    def ready(self, host: Host) -> bool:
        """Could taking from a split, or writing a split's log, now move anything?"""
        return any(intake.ready() for _, intake, _ in self.intakes.values()) or any(
            m.log_due() and a not in self.writing for a, m in self._running(host))

    # -- checkpoints ---------------------------------------------------------------
    def told(self, host: Host, msg: Any, touch: Callable[[Any], None]) -> None:
        """The coordinator's word: a checkpoint's cut (``CutAtEpoch``), or a drained
        rescale's hold (``HoldInputs``)."""
        if isinstance(msg, HoldInputs):
            self.hold_after = msg.after_epoch
        else:
            self.cut_at(host, msg.number, msg.epoch, touch, msg.moves)

    def cut_at(self, host: Host, number: int, epoch: int,
               touch: Callable[[Any], None], moves: tuple = ()) -> None:
        """The coordinator's cut of checkpoint ``number`` at the end of ``epoch``, with the
        live ``moves`` it carries: kept, and told to the replicas here that decide."""
        self.cuts[number] = (epoch, tuple(moves))
        for old in sorted(self.cuts)[:-CUTS_KEPT]:
            del self.cuts[old]
        self.tell_cuts(host, touch)

    def tell_cuts(self, host: Host, touch: Callable[[Any], None]) -> None:
        """Every cut kept, to every replica here that takes it (after a view too: one that
        took over may never have heard its dead leader's entry); a replica bound past a
        cut's epoch refuses it, and that checkpoint never completes."""
        for addr, ingress in self._running(host):
            for number, (epoch, moves) in sorted(self.cuts.items()):
                if ingress.takes_cut(number, epoch):
                    ingress.cut_at_epoch(number, epoch, moves)
                    touch(addr)

    def resume(self, machines: Dict, cut: int, logs: Dict[int, Any],
               marks: Dict[int, Any]) -> None:
        """A restart: both replicas of each pair here follow their split's log past the
        restored cut ``cut`` (0: none). ``logs``: split -> (its count at the cut, the
        entries of its log past the cut, the log's last place); ``marks``: split -> where
        its source stood at a count at or before the cut (seekable sources)."""
        self.restored_marks = dict(marks)
        for addr, ingress in machines.items():
            if addr.stage == 0 and addr.partition in logs:
                ingress.resume_from_log(cut, *logs[addr.partition])

    def mark(self, split: int, count: int) -> Optional[Tuple[int, Any]]:
        """Where split ``split``'s source stood at the newest count known here at or
        before ``count`` (a cut's: the manifest keeps it), or None."""
        held = next((h for a, h in self.intakes.items() if a.partition == split), None)
        return self._mark(held[0] if held else None, split, count)

    def _mark(self, ingress, split: int, count: int) -> Optional[Tuple[int, Any]]:
        """The newest mark at or before ``count``: the replica's own (or its survivor's,
        from a catch-up state), else the last restart's."""
        mark = ingress.source_mark(count) if ingress is not None else None
        if mark is None:
            restored = self.restored_marks.get(split)
            mark = restored if restored is not None and restored[0] <= count else None
        return mark

    def stop(self) -> None:
        if self.logs is not None:
            self.logs.stop()


__all__ = ["NodeIngresses"]
