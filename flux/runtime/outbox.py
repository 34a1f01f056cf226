"""What one process sends, in the order the protocol needs (DESIGN 4.4).

Acks and credits are cumulative: each waits ``ack_delay`` for a later one on
its connection that replaces it, so a consumer sends one per connection and
interval instead of one per batch it takes (messages, not tuples, were most
of a node's CPU). Anything else for the same process sends them first, so
they keep their place before the control messages that must follow them.
What the transport refuses (an outbox full) waits here in FIFO order, and
nothing is sent to a process known dead (TCP to it is lost anyway).
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Deque, Dict, Optional, Set, Tuple

from flux.data_messages import Ack, Credit
from flux.envelope import Envelope
from flux.runtime.transport import Transport


class Outbox:
    """The envelopes of one process on their way to the transport."""

    def __init__(self, transport: Transport, addresses: Dict[str, str], dead: Set[str],
                 clock: Callable[[], float], ack_delay: float):
        """``addresses`` and ``dead`` are the loop's own, which it keeps up to date: where
        each process listens, and the processes whose incarnation is fenced."""
        self.transport = transport
        self.addresses = addresses
        self.dead = dead
        self.clock = clock
        self.ack_delay = ack_delay
        self._held_acks: Dict[str, Dict[tuple, Envelope]] = {}  # peer -> connection -> latest
        self._held_since: Dict[str, float] = {}
        #: envelopes the transport refused (outbox full): local work waits for them
        self.overflow: Deque[Tuple[str, Envelope]] = deque()

    def send(self, peer: str, env: Envelope) -> None:
        if peer in self.dead:
            return  # TCP to a dead process: lost, as the protocol expects
        if self.ack_delay > 0 and isinstance(env.msg, (Ack, Credit)):
            held = self._held_acks.setdefault(peer, {})
            held[(env.src, env.dst, type(env.msg), env.dst_inc)] = env  # replaces an older one
            self._held_since.setdefault(peer, self.clock())
            return
        if peer in self._held_since:
            self._send_held(peer)  # what went before goes first (DESIGN 4.4)
        self._transmit(peer, env)

    def acks_due(self) -> Optional[float]:
        """When the oldest held ack or credit is due (None: none is held)."""
        return min(self._held_since.values()) + self.ack_delay if self._held_since else None

    def send_held_acks(self, older_than: float) -> None:
        """Send the acks and credits that waited since before ``older_than``."""
        for peer in [p for p, since in self._held_since.items() if since <= older_than]:
            self._send_held(peer)

    def drain(self) -> bool:
        """Hand the transport what it refused before; False while it still refuses."""
        while self.overflow:
            peer, env = self.overflow[0]
            if not self.transport.send(peer, env):
                return False
            self.overflow.popleft()
        return True

    def forget(self, peer: str) -> None:
        """``peer`` is fenced: what waits for it will never be sent."""
        self.overflow = deque((p, e) for p, e in self.overflow if p != peer)

    def _send_held(self, peer: str) -> None:
        del self._held_since[peer]
        for env in self._held_acks.pop(peer).values():
            if peer not in self.dead:
                self._transmit(peer, env)

    def _transmit(self, peer: str, env: Envelope) -> None:
        if peer not in self.transport.dealers:
            self.transport.connect(peer, self.addresses[peer])
        if self.overflow or not self.transport.send(peer, env):
            self.overflow.append((peer, env))  # keeps FIFO order behind what waits
