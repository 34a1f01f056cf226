"""What the controller does for a live move of key groups (DESIGN 13).

The source's replicas report the range they took out at the move's cut
(``RangePacked``); the pure ``RangeRelay`` keeps one pack, and the service sends it to
each replica of the destination where it is hosted now (``InstallRange``, addressed to
the segment: it waits at the head of its connection until the segment may take it, as
data does), again to a standby that replaces one, until both say they hold it
(``RangeInstalled``). Packs that differ between the source's replicas are a divergence:
the job stops with ``ReplicasDiverged``.

A range travels in one frame: a move's range must pack to less than ``RANGE_LIMIT``
(a node refuses a bigger one with a clear error, ``flux.runtime.loop``).

A part of ``flux.runtime.controller_service.ControllerService`` (its attributes are the
service's).
"""
from __future__ import annotations

import logging
from typing import Optional

from flux.addresses import Addr
from flux.control_messages import RangeInstalled, RangePacked
from flux.errors import ReplicasDiverged

log = logging.getLogger("flux.runtime.controller_service")


class MoveRelaySide:
    """Ranges of live moves from their source replicas to their destination replicas;
    mixed into ``ControllerService`` (``self.ranges``: its ``RangeRelay``)."""

    def on_range_packed(self, msg: RangePacked) -> None:
        wrong = self.ranges.packed(msg)
        if wrong is not None and self.error is None:
            log.error("%s", wrong)
            self.error = ReplicasDiverged(wrong, msg.move.stage, msg.move.source, msg.number)

    def on_range_installed(self, msg: RangeInstalled, process: str) -> None:
        if self.ranges.installed(msg, process, self._hosting):
            self.events.append((self.clock(), "range moved",
                                f"stage {msg.move.stage} groups {msg.move.first}.."
                                f"{msg.move.last}: partition {msg.move.source} -> "
                                f"{msg.move.dest} (checkpoint {msg.number})"))

    def send_ranges(self) -> None:
        """Each pack to every destination replica, where it is hosted now, not sent it."""
        if not self.ranges.pending() or self.recovery is None:
            return
        for key, addr, process in list(self.ranges.unsent(self._hosting)):
            msg = self.ranges.send(key, addr, process)
            self._send_to(process, addr, msg, self.recovery.view)

    def _hosting(self, addr: Addr) -> Optional[str]:
        node = self.recovery.node_of.get(addr)
        return None if node is None or node in self.dead else node
