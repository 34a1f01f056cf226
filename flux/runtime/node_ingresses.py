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
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from flux.control_messages import IngressEnded
from flux.errors import OperatorError
from flux.operator import describe
from flux.protocol.host import Host
from flux.runtime.source_intake import SourceIntake

log = logging.getLogger(__name__)


class NodeIngresses:
    """The intakes of the ingress replicas on one node, and their epoch clock."""

    def __init__(self, source: Any, interval: float, origin: float,
                 wall: Callable[[], float] = time.time):
        """``source``: the job's ``SplitSource``; ``wall``: the clock epochs follow."""
        self.source = source
        self.interval = interval
        self.origin = origin
        self.wall = wall
        #: ingress address -> (the replica, the intake of its split)
        self.intakes: Dict[Any, Tuple[Any, SourceIntake]] = {}
        #: the replicas that said their split is read (one report each)
        self.reported: set = set()

    def epoch_now(self) -> int:
        """The epoch the wall clock is in."""
        return max(0, int((self.wall() - self.origin) // self.interval))

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
        for addr, ingress in running:
            if ingress.decides() and epoch > ingress.epoch:
                continue  # its epoch is over: it ends it (``advance``) before taking more
            try:
                intake = self._intake(addr, ingress)
                if not intake.done and intake.feed(ingress, ingress.batch_rows):
                    touch(addr)
                    moved = True
            except OperatorError:
                raise  # the next stage's key raised on an input: named already
            except Exception as exc:
                # both replicas read the same split: failing over would fail again
                raise OperatorError(f"reading split {addr.partition} of "
                                    f"{type(self.source).__name__}", 0, addr.partition,
                                    (ingress.accepted + 1,), describe(exc)) from exc
        return moved

    def _intake(self, addr, ingress) -> SourceIntake:
        """The intake of ``ingress``'s split; opened where its numbering stands when the
        replica is new here."""
        held = self.intakes.get(addr)
        if held is None or held[0] is not ingress:
            held = self.intakes[addr] = (ingress, SourceIntake(
                iter(self.source.read_split(addr.partition, ingress.inputs))))
            log.info("%s reads split %d from input %d", addr, addr.partition, ingress.inputs)
        return held[1]

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
        alone decided), written: its items they end may leave, a follower acks its
        leader. No file holds them yet (a split source refuses ``checkpoint=``, so no
        restart reads them): written at once."""
        effects: List = []
        for addr, ingress in self._running(host):
            if ingress.log_due():
                effects += ingress.journal_written(ingress.unwritten()[-1][0])
                touch(addr)
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
        begins; None: none here."""
        epochs = [m.epoch for _, m in self._running(host)]
        if not epochs:
            return None
        return now + max(0.0, self.epoch_start(min(epochs) + 1) - self.wall())

    def ended(self) -> List[IngressEnded]:
        """A report for each replica that read its whole split and whose last item left
        (a leader's, once its twin acked it: the SN it reports is then the one its twin
        would cut should it die)."""
        out = []
        for addr, (ingress, intake) in self.intakes.items():
            if addr in self.reported or not intake.done or not ingress.items_left():
                continue
            self.reported.add(addr)
            out.append(IngressEnded(addr.partition, ingress.last_item, ingress.inputs))
        return out

    def ready(self, host: Host) -> bool:
        """Could taking from a split, or writing a split's log, now move anything?"""
        return any(intake.ready() for _, intake in self.intakes.values()) or any(
            m.log_due() for _, m in self._running(host))


__all__ = ["NodeIngresses"]
