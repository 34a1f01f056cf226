"""What the controller does for a live move of key groups (DESIGN 13).

The source's replicas report the range they took out at the move's cut
(``RangePacked``); the pure ``RangeRelay`` keeps one pack, and the service sends it to
each replica of the destination where it is hosted now (``InstallRange``, addressed to
the segment: it waits at the head of its connection until the segment may take it, as
data does), again to a standby that replaces one, until both say they hold it
(``RangeInstalled``). Packs that differ between the source's replicas are a divergence:
the job stops with ``ReplicasDiverged``.

A prepare's bulk is relayed alike; once both replicas of the destination hold it,
``bulks_staged`` says so to the driver, which then cuts the moves (DESIGN 13).

A range travels in one frame: a move's range must pack to less than ``RANGE_LIMIT``
(a node refuses a bigger one with a clear error, ``flux.runtime.range_timing``). The
event ``range moved`` says ``(stage, first, last, source, dest, checkpoint, pause,
source pause, bulk checkpoint)``: the pause the longest of the destination's replicas'
(seconds they processed nothing), the source pause the longest step of the source's
replicas that packed the range or its bulk, the bulk checkpoint None for a range
moved whole.

A part of ``flux.runtime.controller_service.ControllerService`` (its attributes are the
service's).
"""
from __future__ import annotations

import logging
from typing import Optional

from flux.addresses import Addr
from flux.control_messages import CheckpointDone, RangeInstalled, RangePacked
from flux.errors import ReplicasDiverged

log = logging.getLogger("flux.runtime.controller_service")


class MoveRelaySide:
    """Ranges of live moves from their source replicas to their destination replicas;
    mixed into ``ControllerService`` (``self.ranges``: its ``RangeRelay``;
    ``self.range_waits``: the longest pause of a move's destination replicas so far;
    ``self.range_took``: of its source's replicas; ``self.staged``: prepares whose bulk
    both replicas of the destination hold)."""

    def bulks_staged(self, number: int, moves) -> bool:
        """Do both replicas of each destination hold the bulks of ``moves``, prepared at
        checkpoint ``number``? (Asked from the driver's threads.)"""
        return all((number, m.prepared()) in self.staged for m in moves)

    def on_range_packed(self, msg: RangePacked) -> None:
        key = (msg.number, msg.move)
        self.range_took[key] = max(self.range_took.get(key, 0.0), msg.took)
        wrong = self.ranges.packed(msg)
        if wrong is not None and self.error is None:
            log.error("%s", wrong)
            self.error = ReplicasDiverged(wrong, msg.move.stage, msg.move.source, msg.number)

    def on_range_installed(self, msg: RangeInstalled, process: str) -> None:
        key = (msg.number, msg.move)
        if msg.move.prepare:
            self.ranges.installed(msg, process, self._hosting)
            if self.ranges.staged(msg.number, msg.move, self._hosting):
                self.staged.add(key)
            return
        self.range_waits[key] = max(self.range_waits.get(key, 0.0), msg.waited)
        if self.ranges.installed(msg, process, self._hosting):
            m, waited = msg.move, self.range_waits.pop(key)
            bulks = [k for k in self.range_took if k[1] == m.prepared() and k[0] < msg.number]
            took = max([self.range_took.pop(k) for k in bulks + [key] if k in self.range_took],
                       default=0.0)
            bulk = max(k[0] for k in bulks) if bulks else None
            self.staged.difference_update(bulks)
            log.info("key groups %d..%d of stage %d moved from partition %d to %d at "
                     "checkpoint %d (bulk at %s); the destination paused %.3fs, the source "
                     "%.3fs", m.first, m.last, m.stage, m.source, m.dest, msg.number, bulk,
                     waited, took)
            self.events.append((self.clock(), "range moved", (
                m.stage, m.first, m.last, m.source, m.dest, msg.number, round(waited, 4),
                round(took, 4), bulk)))

    def send_ranges(self) -> None:
        """Each pack to every destination replica, where it is hosted now, not sent it."""
        if not self.ranges.pending() or self.recovery is None:
            return
        for key, addr, process in list(self.ranges.unsent(self._hosting)):
            msg = self.ranges.send(key, addr, process)
            self._send_to(process, addr, msg, self.recovery.view)

    def checkpoint_done(self, number: int, cut: int) -> None:
        """Any thread: checkpoint ``number`` (cut ``cut``) is complete, or is the newest
        when the attempt began (the restored one): told to every egress of one partition
        (``CheckpointDone``) at the controller's next turn."""
        self.newest_done = (number, cut)

    def send_done(self) -> None:
        """The newest complete checkpoint to each egress of one partition where it runs
        now, once per place: an egress holding the output past a move of the last stage's
        groups lets it go, and a writer started again on another node is told it as one
        made at the start (docs/design/rescaling.md)."""
        done = self.newest_done
        if done is None or self.recovery is None:
            return
        egresses = self.recovery.topology.egresses
        if len(egresses) < 2:
            return  # one ordered egress: no move changes its sink
        placed, first = self.recovery.placed(), self.recovery.topology.where
        for addr in egresses:  # a writer on its node now, or the driver's egress process
            where = placed.get(addr, first.get(addr))
            if where is None or where in self.dead or self.done_told.get(addr) == (where,
                                                                                 done[0]):
                continue
            self.done_told[addr] = (where, done[0])
            self._send_to(where, addr, CheckpointDone(*done), self.recovery.view)

    def _hosting(self, addr: Addr) -> Optional[str]:
        node = self.recovery.node_of.get(addr)
        return None if node is None or node in self.dead else node
