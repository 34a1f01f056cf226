"""What the controller does to start dormant pairs at a live rescale (docs/design/rescaling.md).

The driver asks a join of partitions (``ask_join``, any thread); at its next turn the
controller's pure ``Recovery.join`` places their replicas on free standbys, fresh, in a
chain of their own, and the view that says so goes to every process in order. While a
replica is missing or being rebuilt, or too few standbys are free, the ask waits
(``Recovery.join`` gives no view) and is tried again at every turn. The cut that gives
the joined pairs key groups may be chosen only once every live process applied that
view (rule 3 of the design): every process says the last view it applied whole in
every envelope it sends the controller (a node's heartbeats at least every
``heartbeat``), and ``lagging`` names those that have not applied one yet.

A part of ``flux.runtime.controller_service.ControllerService`` (its attributes are the
service's: ``self._join_asks``, the asks not placed yet; ``self.join_views``, the view
each placed one was given; ``self.applied``, each process's last view applied).
"""
from __future__ import annotations

import logging
import queue
from typing import List, Optional, Tuple

log = logging.getLogger("flux.runtime.controller_service")


class JoinSide:
    """Dormant pairs started by a view; mixed into ``ControllerService``."""

    def ask_join(self, partitions, start: tuple = ()) -> None:
        """Any thread: start dormant ``partitions`` on standbys (``joined_view`` says when);
        ``start``: where their replicas start, ``(maps, moves seen, cut)`` (``Joined``)."""
        parts = tuple(sorted(partitions))
        self._join_withdrawn.discard(parts)  # (a withdrawal of an earlier ask of them)
        self._join_asks.put((parts, tuple(start)))

    def withdraw_join(self, partitions) -> None:
        """Any thread: an ask not placed yet is placed no more (the driver gave up
        waiting: the start it carries would be out of date by its turn)."""
        parts = tuple(sorted(partitions))
        if parts not in self.join_views:
            self._join_withdrawn.add(parts)

    def joined_view(self, partitions) -> Optional[int]:
        """The view that started ``partitions`` (asked with ``ask_join``), or None yet."""
        return self.join_views.get(tuple(sorted(partitions)))

    def heard_view(self, name: str, view: int) -> None:
        """Process ``name`` sent an envelope saying it applied ``view`` whole."""
        if view > self.applied.get(name, 0):
            self.applied[name] = view

    def lagging(self, view: int) -> List[str]:
        """The live workers (nodes and standbys) that have not applied ``view`` yet, as
        their envelopes say (any thread; the driver asks its own processes itself)."""
        return sorted(n for n in list(self.registered) if n not in self.dead
                      and self.applied.get(n, 0) < view)

    def join_waits(self) -> Tuple[int, int, bool]:
        """Why an ask waits: (standbys free, replicas missing, an attempt running)."""
        rec = self.recovery
        if rec is None:
            return 0, 0, False
        return len(rec.free), len(rec.missing), bool(rec.attempts)

    def place_joins(self) -> None:
        """The controller's turn: the oldest ask gets its view if it may be placed now
        (the asks after it wait their turn)."""
        if not self.started:
            return
        while self._join_waiting is None:
            try:
                self._join_waiting = self._join_asks.get_nowait()
            except queue.Empty:
                return
        parts, start = self._join_waiting
        if parts in self._join_withdrawn:
            self._join_withdrawn.discard(parts)
            self._join_waiting = None
            return
        views = self.recovery.join(parts, *start)
        if not views:
            return  # a replica missing, or too few standbys free: at the next turn again
        self._join_waiting = None
        self._broadcast(views)
        self.join_views[parts] = views[-1].number
        self.events.append((self.clock(), "pairs joined", (parts, views[-1].number)))
        log.info("dormant partitions %s start in view %d: %s", list(parts),
                 views[-1].number, ", ".join(f"{j.addr} on {j.node}" for j in views[-1].joined))
