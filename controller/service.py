"""The controller service: failure detection and totally ordered views (paper 3.2.1).

It listens for heartbeats (any message counts) from every process it
watches; one that stays silent longer than ``timeout`` is declared dead, and
so is one whose connection shows a gap (DESIGN 4.4). The pure ``Recovery``
turns failures and fold-in reports into views, which go to every live process
in order over its FIFO connection. The ingress and the egress are assumed
always available (paper 3.1.1) and are never declared dead.
"""
from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional

from controller.recovery import PairLost, Recovery
from exchange.transport import Transport
from flux.messages import CONTROLLER, Envelope, FoldedIn, ProcAddr, TakeoverDone, View

log = logging.getLogger(__name__)


class ControllerService:
    def __init__(self, transport: Transport, recovery: Recovery, incarnations: Dict[str, int],
                 addresses: Dict[str, str], watched: List[str], timeout: float = 0.3,
                 clock=time.monotonic):
        self.transport = transport
        self.recovery = recovery
        self.incarnations = dict(incarnations)
        self.addresses = addresses
        self.timeout = timeout
        self.clock = clock
        now = clock()
        self.last_seen: Dict[str, float] = {name: now for name in watched}
        self.dead: set = set()
        self.views: List[View] = []
        self.events: List[tuple] = []  # (time, what, detail) for metrics and tests
        self.error: Optional[Exception] = None

    def turn(self, timeout_ms: int) -> None:
        envelopes, gaps = self.transport.poll(timeout_ms)
        now = self.clock()
        for env in envelopes:
            name = env.src.name if isinstance(env.src, ProcAddr) else None
            if name in self.last_seen:
                self.last_seen[name] = now
            if isinstance(env.msg, FoldedIn):
                self._broadcast(self.recovery.folded_in(env.msg.reporter, env.msg.addr,
                                                        env.msg.version))
                if not self.recovery.pending():
                    self.events.append((now, "catch-up done", env.msg.addr))
            elif isinstance(env.msg, TakeoverDone):
                self.events.append((now, "take-over done", env.msg.addr))
        for gap in gaps:
            self.fail(gap.peer.split("#")[0], f"connection gap {gap.expected}->{gap.got}")
        for name, seen in list(self.last_seen.items()):
            if now - seen > self.timeout:
                self.fail(name, f"silent for {now - seen:.3f}s")

    def fail(self, name: str, why: str) -> None:
        if name in self.dead or self.error is not None:
            return
        log.warning("declaring %s dead: %s", name, why)
        self.dead.add(name)
        self.last_seen.pop(name, None)
        self.events.append((self.clock(), "detected", name))
        try:
            self._broadcast(self.recovery.node_failed(name))
        except PairLost as exc:
            self.error = exc  # the job must stop: both replicas of a partition are gone
            log.error("%s", exc)

    def _broadcast(self, views: List[View]) -> None:
        for view in views:
            self.views.append(view)
            for name in self.addresses:
                if name in self.dead or name == "controller":
                    continue
                if name not in self.transport.dealers:
                    self.transport.connect(name, self.addresses[name])
                self.transport.send(name, Envelope(CONTROLLER, ProcAddr(name), view.number, view,
                                                   0, None))
