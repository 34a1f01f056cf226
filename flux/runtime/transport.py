"""ZeroMQ transport: reliable FIFO per connection, and checked (DESIGN 4.4).

One ROUTER per process receives; one DEALER per peer sends, with the
sender's ``name#incarnation`` as its identity, so a restarted process never
shares a sequence space with its dead predecessor. Every message is
``[conn_seq, envelope, envelope, ...]``: the receiver checks that
``conn_seq`` goes 1, 2, 3, ... per sender identity, and a gap (ZeroMQ can
lose what was in flight across a TCP reconnect) is reported as a failure of
that connection, never skipped.

A message carries every envelope queued for its peer when it leaves, in
order: inside ``bundling()`` (a loop's step) envelopes wait and leave
together, one ZeroMQ message per peer. Each message costs both processes a
wake-up and a few system calls whatever it carries (154 us of CPU an
envelope sent alone, 36 four to a message, 23 eight: ``experiments.message_cost``),
and a small item fans out to every replica of the next stage in small envelopes.

A process may ``watch`` a peer: when the TCP connection to it drops (the
peer's process died and its kernel closed the socket), ``poll`` reports a
``ConnectionLost`` at once, long before a heartbeat timeout would.

Sends never block: each peer has a bounded outbox, flushed without
blocking; a full outbox is back-pressure for the caller, not a hang on a
dead peer. ``LINGER=0`` everywhere. Garbage from the network is dropped
with a log line naming the peer; nothing it sends can raise out of ``poll``.
A frame over ``max_frame`` bytes never reaches Python: ZeroMQ closes that
connection (``MAXMSGSIZE``). With ``keys`` (``job_keys(secret)``) every
connection is CURVE-encrypted and a peer without the job's secret cannot
complete a handshake: it can neither register nor inject data or acks.
"""
from __future__ import annotations

import hashlib
import logging
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Deque, Dict, Iterator, List, Optional, Tuple

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from exchange.wire import MAX_FRAME, WireError, decode, encode
from flux.envelope import Envelope

log = logging.getLogger(__name__)

#: frames at least this long are handed to ZeroMQ without a copy (pyzmq's advice: 64 KiB)
ZERO_COPY_FROM = 1 << 16

#: messages one ``poll`` takes at most (more wait for the next)
DEFAULT_POLL_LIMIT = 10_000

#: envelopes a peer's outbox may hold before ``send`` reports back-pressure
DEFAULT_OUTBOX = 100_000

#: one message carries at most this many envelopes, and this many bytes of them (an
#: envelope larger than that goes alone)
BUNDLE_ENVELOPES = 256
BUNDLE_BYTES = 1 << 20

#: a message's frames' flags, as plain ints: or-ing pyzmq's flag enums costs ~1 us a frame
_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
_LAST = int(zmq.NOBLOCK)


def job_keys(secret: str) -> Tuple[bytes, bytes]:
    """The job's CURVE key pair ``(public, secret)``, computed from the job's secret: only a
    process given that secret can derive the server key, so only such a process completes
    the handshake; a connection without it never delivers a byte (DESIGN 6)."""
    secret_key = z85.encode(hashlib.sha256(b"flux-curve:" + secret.encode()).digest())
    return zmq.curve_public(secret_key), secret_key


@dataclass(frozen=True)
class ConnectionGap:
    """Messages from ``peer`` were lost between ``expected`` and ``got``: fail that link.
    ``at``: how many of the envelopes ``poll`` returned with it came before the gap."""

    peer: str
    expected: int
    got: int
    at: int = 0


@dataclass(frozen=True)
class ConnectionLost:
    """The connection to a watched ``peer`` dropped: its process is most likely gone."""

    peer: str


class Transport:
    """The sockets of one process: receive on a ROUTER, send through one DEALER per peer."""

    def __init__(self, ctx: zmq.Context, name: str, incarnation: int, host: str = "127.0.0.1",
                 outbox_limit: int = DEFAULT_OUTBOX, hwm: int = 10_000,
                 max_frame: int = MAX_FRAME + 1024,
                 keys: Optional[Tuple[bytes, bytes]] = None,
                 ports: Optional[Tuple[int, int]] = None):
        self.ctx = ctx
        self.keys = keys
        self.incarnation = incarnation
        self.identity = f"{name}#{incarnation}".encode()
        self.outbox_limit = outbox_limit
        self.hwm = hwm
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.RCVHWM, hwm)
        # a peer that connects again under its identity (after ``disconnect``, or a link
        # that was cut and its old connection never closed) takes the identity over; else
        # its messages would vanish while the stale connection lingers
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        # a larger frame closes its connection inside ZeroMQ, before it is held in memory
        self.router.setsockopt(zmq.MAXMSGSIZE, max_frame)
        if keys is not None:  # CURVE: encrypted, and only holders of the job's keys connect
            self.router.curve_server = True
            self.router.curve_publickey, self.router.curve_secretkey = keys
        # on ``host``, the interface peers reach it by (flux.runtime.network)
        low, high = ports or (49152, 65536)
        try:
            self.port = self.router.bind_to_random_port(f"tcp://{host}", low, high)
        except zmq.ZMQError as exc:
            self.router.close()
            raise OSError(f"{name}: cannot bind a socket on {host} in ports {low}-{high - 1}: "
                          f"{exc}") from exc
        self.address = f"tcp://{host}:{self.port}"
        self.dealers: Dict[str, zmq.Socket] = {}
        self.monitors: Dict[zmq.Socket, str] = {}
        self.out_seq: Dict[str, int] = {}
        #: each peer's encoded envelopes not yet handed to ZeroMQ, in order
        self.outbox: Dict[str, Deque[bytes]] = {}
        self._bundling = 0  # how many ``bundling()`` blocks are open
        #: the last ``poll`` took its limit of messages: more may wait
        self.poll_limited = False
        self.in_seq: Dict[bytes, int] = {}
        self.dropped = 0
        self._poller = zmq.Poller()
        self._poller.register(self.router, zmq.POLLIN)
        self.closed = False

    # -- sending ------------------------------------------------------------------
    def connect(self, peer: str, address: str) -> None:
        """Open the connection to ``peer`` (a process name), listening at ``address``."""
        if peer in self.dealers:
            raise ValueError(f"already connected to {peer}")
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IDENTITY, self.identity)
        dealer.setsockopt(zmq.SNDHWM, self.hwm)
        if self.keys is not None:
            dealer.curve_serverkey = self.keys[0]
            dealer.curve_publickey, dealer.curve_secretkey = self.keys
        dealer.connect(address)
        self.dealers[peer] = dealer
        self.out_seq[peer] = 0
        self.outbox[peer] = deque()

    def watch(self, peer: str) -> None:
        """Report a ``ConnectionLost`` from ``poll`` when the connection to ``peer`` drops."""
        monitor = self.dealers[peer].get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.monitors[monitor] = peer
        self._poller.register(monitor, zmq.POLLIN)

    def _unwatch(self, peer: str) -> None:
        for monitor, name in list(self.monitors.items()):
            if name == peer:
                self._poller.unregister(monitor)
                del self.monitors[monitor]
                self.dealers[peer].disable_monitor()
                monitor.close(linger=0)

    def disconnect(self, peer: str) -> None:
        """Forget a peer (declared dead): drop what was queued for it."""
        if peer in self.dealers:
            self._unwatch(peer)
        dealer = self.dealers.pop(peer, None)
        if dealer is not None:
            dealer.close(linger=0)
        self.outbox.pop(peer, None)
        self.out_seq.pop(peer, None)

    def send(self, peer: str, env: Envelope) -> bool:
        """Queue ``env`` for ``peer`` in order; False (nothing queued) when its outbox is full."""
        box = self.outbox.get(peer)
        if box is None:
            raise KeyError(f"not connected to {peer}")
        if len(box) >= self.outbox_limit:
            return False
        box.append(encode(env))
        if not self._bundling:
            self._flush(peer)
        return True

    @contextmanager
    def bundling(self) -> Iterator[None]:
        """Envelopes sent inside wait, and leave when it ends (or at ``flush``) as one
        message per peer: same order, far fewer messages."""
        self._bundling += 1
        try:
            yield
        finally:
            self._bundling -= 1
            if not self._bundling:
                self.flush()

    def pending(self, peer: Optional[str] = None) -> int:
        """Envelopes queued and not yet handed to ZeroMQ."""
        if peer is not None:
            return len(self.outbox.get(peer, ()))
        return sum(len(b) for b in self.outbox.values())

    def flush(self) -> None:
        for peer in list(self.outbox):
            self._flush(peer)

    def _flush(self, peer: str) -> None:
        box, dealer = self.outbox[peer], self.dealers[peer]
        while box:
            count, size = 0, 0
            for payload in box:
                if count == BUNDLE_ENVELOPES or count and size + len(payload) > BUNDLE_BYTES:
                    break
                count, size = count + 1, size + len(payload)
            try:
                dealer.send(str(self.out_seq[peer] + 1).encode(), _MORE)
            except zmq.Again:
                return  # the peer is slow or gone: keep them, never block
            # the rest of a message never meets the high-water mark its first frame passed
            for left in range(count - 1, -1, -1):
                payload = box.popleft()
                # zero-copy only pays for large frames (state chunks), not for batches
                dealer.send(payload, _MORE if left else _LAST, copy=len(payload) < ZERO_COPY_FROM)
            self.out_seq[peer] += 1

    # -- receiving ----------------------------------------------------------------
    def also_wake_on(self, socket: zmq.Socket) -> None:
        """``poll`` also returns (with nothing) when ``socket`` has something to read: the
        ingress process hears its feed from the driver while it waits for peers."""
        self._poller.register(socket, zmq.POLLIN)

    def poll(self, timeout_ms: int, limit: int = DEFAULT_POLL_LIMIT
             ) -> Tuple[List[Envelope], list]:
        """Wait up to ``timeout_ms`` for messages; returns the envelopes in arrival order
        and the connection failures seen (``ConnectionGap``, ``ConnectionLost``).
        Malformed frames are logged and dropped."""
        self.flush()
        envelopes: List[Envelope] = []
        gaps: list = []
        self.poll_limited = False
        ready = dict(self._poller.poll(timeout_ms))
        if not ready:
            return envelopes, gaps
        for monitor in [m for m in self.monitors if m in ready]:
            gaps.extend(self._read_monitor(monitor))
        for _ in range(limit):
            try:
                frames = self.router.recv_multipart(flags=zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            envelopes.extend(self._accept(frames, gaps, len(envelopes)))
        else:
            self.poll_limited = True
        return envelopes, gaps

    def _read_monitor(self, monitor: zmq.Socket) -> List[ConnectionLost]:
        lost = []
        while True:
            try:
                event = recv_monitor_message(monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                return lost
            if event["event"] == zmq.EVENT_DISCONNECTED:
                lost.append(ConnectionLost(self.monitors[monitor]))

    def _accept(self, frames: List[bytes], gaps: List[ConnectionGap],
                at: int = 0) -> List[Envelope]:
        """The envelopes of one message, or none (a gap, a malformed message); a
        malformed envelope is dropped alone."""
        peer = frames[0] if frames else b"?"
        who = peer.decode("utf-8", "replace")
        if len(frames) < 3:
            return self._drop(who, f"{len(frames) - 1} frames: no envelope after the "
                                   f"sequence number")
        try:
            seq = int(frames[1])
        except ValueError:
            return self._drop(who, "connection sequence number is not an int")
        expected = self.in_seq.get(peer, 0) + 1
        if seq != expected:
            gaps.append(ConnectionGap(who, expected, seq, at))
            log.warning("connection from %s skipped from %d to %d: treating it as failed",
                        who, expected, seq)
            self.in_seq[peer] = max(seq, expected - 1)
            return []
        self.in_seq[peer] = seq
        envelopes = []
        for frame in frames[2:]:
            try:
                envelopes.append(decode(frame))
            except WireError as exc:
                self._drop(who, str(exc))
        return envelopes

    def _drop(self, who: str, reason: str) -> list:
        self.dropped += 1
        log.warning("dropped a frame from %s: %s", who, reason)
        return []

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket; ``linger_ms`` > 0 gives queued messages that long to leave
        (a last word, e.g. a start failure), never longer."""
        if self.closed:
            return
        self.flush()
        for peer in set(self.monitors.values()):
            self._unwatch(peer)
        for dealer in self.dealers.values():
            dealer.close(linger=linger_ms)
        self.dealers.clear()
        self.router.close(linger=0)
        self.closed = True
