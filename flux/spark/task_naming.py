"""How an attempt names its Spark tasks: nodes placed so that no pair shares a host, the
others standbys (DESIGN 6).

Every task registers with the controller, which holds it (``PENDING``) until the
attempt names them all at once, knowing their hosts; a task that registers after that
joins the running job as a standby. A part of ``flux.spark.attempt.Attempt`` (its
attributes are the attempt's: ``parts``, ``controller``, ``config``, ``topology``,
``_running``, ``_named``, ``_enough_since``, ``number``, ``restored``).
"""
from __future__ import annotations

import logging
import time
from typing import Optional

from controller.hosts import PlacementError, assign_hosts
from controller.topology import standby_name
from flux.control_messages import Register
from flux.runtime.controller_service import PENDING

log = logging.getLogger("flux.spark.attempt")

#: seconds the job waits for standby tasks to register once every node task has
STANDBY_GRACE = 3.0


class TaskNaming:
    """Naming the registered tasks; mixed into ``Attempt``."""

    def _name_for(self, reg: Register) -> Optional[str]:
        """Until every task is named, a registration waits (``_name_tasks``); after, every
        attempt joins as a standby. A retried task's earlier attempt is dead: forgotten."""
        if self._named:
            return standby_name(reg.inc)
        pending = self.controller.pending
        for key in [k for k in pending if k[0] == reg.task and k[1] < reg.inc]:
            del pending[key]
        if any(t == reg.task and i > reg.inc for t, i in pending):
            return None  # a late message of an attempt already replaced
        return PENDING

    def _ready_to_name(self) -> bool:
        """Every node and standby task registered, or every node and the standbys were
        given ``STANDBY_GRACE`` seconds more (a standby's slot may come later)."""
        nodes, waiting = self._running, len(self.controller.pending)
        if waiting >= nodes + self.parts.standbys:
            return True
        if waiting < nodes:
            self._enough_since = None
            return False
        now = time.monotonic()
        self._enough_since = self._enough_since or now
        # a restart or a resumed job does not wait for its standbys: they join the running
        # job as they come (its output has waited long enough)
        grace = 0.0 if self.number or self.restored else STANDBY_GRACE
        return now - self._enough_since >= grace

    def _name_tasks(self) -> None:
        """Name the registered tasks: the nodes such that no pair shares a host (when
        ``distinct_hosts``; otherwise task k's attempt is node k), the others standbys."""
        c = self.controller
        regs = sorted(c.pending.values(), key=lambda r: (r.task, r.inc))
        if self.parts.distinct_hosts:
            try:
                chosen = assign_hosts(self.config.placement(),
                                      [(i, r.host) for i, r in enumerate(regs)])
            except PlacementError as exc:
                c.error = exc
                return
        else:
            chosen = dict(enumerate(range(self._running)))
        nodes = self.topology.nodes
        for node, i in sorted(chosen.items()):
            c.admit(regs[i], nodes[node])
        for i in sorted(set(range(len(regs))) - set(chosen.values())):
            c.admit(regs[i], standby_name(regs[i].inc))
        self._named = True
        log.info("nodes placed: %s", ", ".join(f"{n} on {c.hosts[n]}" for n in nodes))
