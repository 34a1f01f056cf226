"""Drive one process's protocol machines over the ZeroMQ transport.

The runtime twin of the simulator's world, for a single process: it feeds
envelopes from the transport to the ``Host`` (which decides what may be taken
now: a message from a later view or behind a guarded control message waits
at the head of its connection, DEALER-side FIFO order kept), runs the local
steps (process every input the merges release, flush every batch), and
hands the envelopes the machines return back to the transport. No protocol
rule lives here (DESIGN 3).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from exchange.transport import ConnectionGap, Transport
from flux.host import Host, MoverAddr
from flux.ingress import INGRESS
from flux.messages import Deliver, Envelope


class HostLoop:
    """One process: its Host, its Transport, and where every endpoint lives."""

    def __init__(self, host: Host, transport: Transport, process_of: Callable[[Any], str],
                 addresses: Dict[str, str], on_effect: Callable[[Any], None] = lambda e: None,
                 source: Optional[Iterator[Any]] = None):
        self.host = host
        self.transport = transport
        self.process_of = process_of
        self.addresses = addresses
        self.on_effect = on_effect
        self.source = source
        self._next_record: Any = None
        self.held: Dict[Tuple[Any, Any], Deque[Envelope]] = {}
        #: envelopes the transport refused (outbox full): local work waits for them
        self.overflow: Deque[Tuple[str, Envelope]] = deque()
        self.gaps: List[ConnectionGap] = []
        self.source_done = source is None

    # -- one turn of the poller loop ------------------------------------------------
    def turn(self, timeout_ms: int) -> bool:
        """Receive, deliver, work, send. Returns True if anything moved."""
        envelopes, gaps = self.transport.poll(0 if self._busy() else timeout_ms)
        self.gaps += gaps
        for env in envelopes:
            self.held.setdefault((env.src, env.dst), deque()).append(env)
        moved = bool(envelopes)
        while True:
            if not self._drain_overflow():
                return moved  # back-pressure: nothing new until the outboxes empty
            step = self._deliver() | self._accept_input() | self._work()
            moved |= step
            if not step:
                return moved

    def _drain_overflow(self) -> bool:
        while self.overflow:
            peer, env = self.overflow[0]
            if not self.transport.send(peer, env):
                return False
            self.overflow.popleft()
        return True

    def _busy(self) -> bool:
        return not self.source_done or any(self.held.values())

    def _deliver(self) -> bool:
        moved = False
        for q in self.held.values():
            while q and self.host.accepts(q[0]):
                self._emit(*self.host.on_envelope(q.popleft()))
                moved = True
        return moved

    def _accept_input(self, limit: int = 1000) -> bool:
        ingress = self.host.machines.get(INGRESS)
        if ingress is None or self.source_done:
            return False
        moved = False
        for _ in range(limit):
            if self._next_record is None:
                self._next_record = next(self.source, None)
                if self._next_record is None:
                    self.source_done = True
                    break
            if ingress.accept(self._next_record) is None:
                break  # back-pressure: that partition's buffer is full
            self._next_record = None
            moved = True
        return moved

    def _work(self) -> bool:
        moved = False
        for addr, machine in list(self.host.machines.items()):
            can_process = getattr(machine, "can_process", None)
            while can_process is not None and can_process():
                machine.process()
                moved = True
            flushable = getattr(machine, "flushable", None)
            if flushable is None:
                continue
            for i, d in flushable():
                self._emit(*self.host.run_local(machine.flush(i, d)))
                moved = True
        return moved

    def _emit(self, envelopes: List[Envelope], others: List) -> None:
        for env in envelopes:
            peer = self.process_of(env.dst)
            if peer not in self.transport.dealers:
                self.transport.connect(peer, self.addresses[peer])
            if self.overflow or not self.transport.send(peer, env):
                self.overflow.append((peer, env))  # keeps FIFO order behind what waits
        for e in others:
            self.on_effect(e)


def process_name_of(placement_of: Dict[Any, str]) -> Callable[[Any], str]:
    """Where an endpoint lives: a segment by placement, a StateMover by its node."""
    def process_of(addr) -> str:
        if isinstance(addr, MoverAddr):
            return addr.node
        return placement_of[addr]
    return process_of


__all__ = ["HostLoop", "process_name_of", "Deliver"]
