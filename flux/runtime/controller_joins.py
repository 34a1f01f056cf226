"""What the controller does to start dormant pairs at a live rescale, and to stop the pairs
a live rescale to fewer took every group from (docs/design/rescaling.md).

The driver asks a join of partitions (``ask_join``, any thread); at its next turn the
controller's pure ``Recovery.join`` places their replicas on free standbys, fresh, in a
chain of their own, and the view that says so goes to every process in order. While a
replica is missing or being rebuilt, or too few standbys are free, the ask waits
(``Recovery.join`` gives no view) and is tried again at every turn. The cut that gives
the joined pairs key groups may be chosen only once every live process applied that
view (rule 3 of the design): every process says the last view it applied whole in
every envelope it sends the controller (a node's heartbeats at least every
``heartbeat``), and ``lagging`` names those that have not applied one yet.

A leave (``ask_leave``: the pairs and the move cut that took their last groups) is
placed once every replica of theirs, as its node's last report says
(``SegmentStats.moves_crossed``, ``idle``), crossed that cut and holds nothing, and no
replica is missing or being rebuilt (``Recovery.leave``; rule 5 of the design); the
view that says so goes to every process in order.

A part of ``flux.runtime.controller_service.ControllerService`` (its attributes are the
service's: ``self._join_asks``, the asks not placed yet; ``self.join_views``, the view
each placed one was given; ``self.applied``, each process's last view applied;
``self.node_stats``, each node's last report).
"""
from __future__ import annotations

import logging
import queue
from typing import Dict, List, Optional, Tuple

from flux.addresses import P, S, Addr

log = logging.getLogger("flux.runtime.controller_service")


class JoinSide:
    """Dormant pairs started by a view, and pairs stopped by one; mixed into
    ``ControllerService``."""

    def _init_membership(self) -> None:
        """The asks of joins and leaves not placed yet, the views that placed them, and
        each process's last view applied."""
        self._join_asks: "queue.SimpleQueue" = queue.SimpleQueue()
        self._join_waiting: Optional[tuple] = None
        self._join_withdrawn: set = set()
        self.join_views: Dict[tuple, int] = {}
        self._leave_asks: "queue.SimpleQueue" = queue.SimpleQueue()
        self._leave_waiting: Optional[tuple] = None
        self.leave_views: Dict[tuple, int] = {}
        self.applied: Dict[str, int] = {}

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

    def ask_leave(self, partitions, cut: tuple) -> None:
        """Any thread: stop ``partitions``, which own no key group since the move cut
        ``cut`` ``(k, n)`` (``left_view`` says when)."""
        self._leave_asks.put((tuple(sorted(partitions)), tuple(cut)))

    def left_view(self, partitions) -> Optional[int]:
        """The view that stopped ``partitions`` (asked with ``ask_leave``), or None yet."""
        return self.leave_views.get(tuple(sorted(partitions)))

    def leave_waits(self, partitions, cut: tuple) -> List[str]:
        """Why a leave waits: the replicas of ``partitions`` whose node has not said they
        crossed move cut ``cut`` and hold nothing, and the replicas missing (any thread)."""
        rec = self.recovery
        if rec is None:
            return []
        waits = [f"{a} {why}" for a in self._replicas(partitions)
                 for why in [self._not_left_behind(a, cut[0])] if why]
        return waits + [f"{a} missing" for a in sorted(rec.missing)]

    def place_leaves(self) -> None:
        """The controller's turn: the oldest leave asked, once its replicas are left
        behind and none is missing (the asks after it wait their turn)."""
        if self._leave_waiting is None:
            try:
                self._leave_waiting = self._leave_asks.get_nowait()
            except queue.Empty:
                return
        parts, cut = self._leave_waiting
        if any(self._not_left_behind(a, cut[0]) for a in self._replicas(parts)):
            return
        views = self.recovery.leave(parts, cut)
        if not views:
            return  # a replica missing or being rebuilt: at the next turn again
        self._leave_waiting = None
        self._broadcast(views)
        self.leave_views[parts] = views[-1].number
        self.events.append((self.clock(), "pairs left", (parts, views[-1].number)))
        log.info("partitions %s leave in view %d; standbys again: %s", list(parts),
                 views[-1].number, ", ".join(self.recovery.free) or "none")

    def _replicas(self, partitions) -> List[Addr]:
        stages = self.recovery.stages
        return [Addr(s, q, r) for q in partitions for s in range(1, stages + 1)
                for r in (P, S)]

    def _not_left_behind(self, addr: Addr, moves_cut: int) -> str:
        """Why the replica at ``addr`` may not leave yet as its node's last report says
        (empty: it may): it crossed ``moves_cut`` and holds nothing."""
        node = self.recovery.node_of.get(addr)
        if node is None:
            return "not placed"
        said = self.node_stats.get(node)
        mine = [x for x in said[1].segments if x.addr == addr] if said else []
        if not mine:
            return f"not reported by {node}"
        if mine[0].moves_crossed < moves_cut:
            return f"not past move cut {moves_cut} (at {mine[0].moves_crossed})"
        return "" if mine[0].idle else "still holding what it sent or queued"
