"""The StateMover service: a thread of its own, with a socket of its own, in every node.

State moves in chunks of up to a megabyte. On the node's own connections
those frames would queue with the data batches (and the data behind them),
and sending them would be the node loop's work. So every node process runs
a ``StateMoverService``: its own ROUTER and DEALERs (one ``Transport``), on
its own thread. The ``StateMover`` machine stays in the node's ``Host``,
where the protocol decides (DESIGN 3: no rule lives in the runtime); this
service only carries its messages:

- an envelope from the local node to another node's mover goes out through
  this service's socket to that node's service (``name/mover`` in Members);
- an envelope from another node's service goes on to the local node.

Mover channels are FIFO per pair of movers, as in the simulator, where they
were always channels of their own. Messages a link lost (a gap in its
connection numbers) are reported to the local mover as a ``LinkLost`` from
that peer, before the message after the gap, so the transfers it sends to us
ask for what they miss again (``statemover.resend``) instead of waiting for
the catch-up's deadline. Envelopes for a process declared dead
are dropped (as TCP to it would fail); hostile frames are dropped by the
transport with a log line.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, Optional, Tuple

import zmq

from flux.addresses import MoverAddr
from flux.envelope import Envelope
from flux.runtime.transport import ConnectionGap, Transport
from statemover.messages import LinkLost

log = logging.getLogger(__name__)

#: the local node, as a peer of this service's transport
LOCAL = "node"
#: how long the service's poll waits while it has nothing left to send: a message wakes
#: it at once, so this only bounds how late it sees ``stop`` (polls of 5 ms woke every
#: node's thread 200 times a second, each a GIL hand-over with the node's loop)
IDLE_POLL_MS = 50
#: ... and while a peer refused a send (its pipe full): retried at each poll
BUSY_POLL_MS = 5


def mover_peer(name: str) -> str:
    """The peer name of process ``name``'s StateMover socket (in Members, in transports)."""
    return f"{name}/mover"


class StateMoverService:
    def __init__(self, ctx: zmq.Context, name: str, inc: int, keys=None,
                 host: str = "127.0.0.1", ports: Optional[Tuple[int, int]] = None):
        self.name = name
        self.me = MoverAddr(name)
        # used by the thread only; ``keys``: the job's CURVE keys, as the node's own transport
        self.transport = Transport(ctx, mover_peer(name), inc, host=host, keys=keys,
                                   ports=ports)
        self.address = self.transport.address
        self.addresses: Dict[str, str] = {}
        self.is_dead: Callable[[str], bool] = lambda name: False
        self.relayed = 0  # envelopes carried, both ways
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None

    def start(self, name: str, node_address: str, addresses: Dict[str, str],
              is_dead: Callable[[str], bool]) -> None:
        """Run, now that the node knows its name and where everyone listens. ``addresses``
        is the node loop's own dict (Members keep it current); the thread only reads it."""
        self.name, self.me = name, MoverAddr(name)
        self.addresses, self.is_dead = addresses, is_dead
        self.node_address = node_address
        self._thread = threading.Thread(target=self._run, name=f"{name}-statemover", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; it closes its sockets on the way out."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self.transport.close()

    def _run(self) -> None:
        try:
            self.transport.connect(LOCAL, self.node_address)
            while not self._stop.is_set():
                self.turn(BUSY_POLL_MS if self.transport.pending() else IDLE_POLL_MS)
        except BaseException as exc:  # the node loop sees it and stops the process
            self.error = exc
            log.exception("the StateMover service of %s failed", self.name)
        finally:
            self.transport.close()

    def turn(self, timeout_ms: int) -> None:
        envelopes, gaps = self.transport.poll(timeout_ms)
        lost = [g for g in gaps if isinstance(g, ConnectionGap)]
        for i, env in enumerate(envelopes):
            while lost and lost[0].at <= i:  # in the link's order: before what followed it
                self.link_lost(lost.pop(0))
            self.relay(env)
        for gap in lost:
            self.link_lost(gap)

    def link_lost(self, gap: ConnectionGap) -> None:
        """Tell the local mover that messages from a peer's mover vanished in transit."""
        peer, _, inc = gap.peer.partition("#")
        if not peer.endswith("/mover") or not inc.isdigit():
            log.warning("%s: lost messages from %s (not a mover): ignored",
                        mover_peer(self.name), gap.peer)
            return
        src = MoverAddr(peer[:-len("/mover")])
        log.warning("%s: messages from %s lost in transit (#%d to #%d): asked for again",
                    mover_peer(self.name), gap.peer, gap.expected, gap.got - 1)
        self.transport.send(LOCAL, Envelope(src, self.me, 0, LinkLost(gap.expected, gap.got),
                                            int(inc), None))

    def relay(self, env: Envelope) -> None:
        dst, src = env.dst, env.src
        if not isinstance(dst, MoverAddr) or not isinstance(src, MoverAddr):
            log.warning("%s: dropped a %s that is not between movers (%s -> %s)",
                        mover_peer(self.name), type(env.msg).__name__, src, dst)
            return
        if dst == self.me:  # from another node's mover: on to ours
            if not self.transport.send(LOCAL, env):
                log.warning("%s: outbox to the node full: dropped", mover_peer(self.name))
                return
        elif src == self.me:  # from ours: out to the other node's service
            peer = mover_peer(dst.node)
            if self.is_dead(dst.node):
                self.transport.disconnect(peer)  # and what was queued for it
                return
            if peer not in self.transport.dealers:
                address = self.addresses.get(peer)
                if address is None:
                    log.warning("%s: no address for %s yet: dropped", mover_peer(self.name), peer)
                    return
                self.transport.connect(peer, address)
            if not self.transport.send(peer, env):
                log.warning("%s: outbox to %s full: dropped", mover_peer(self.name), peer)
                return
        else:
            log.warning("%s: dropped an envelope %s -> %s that is none of ours",
                        mover_peer(self.name), src, dst)
            return
        self.relayed += 1
