"""Heartbeats from a thread of their own (DESIGN 6).

A node's loop can be busy for a long step: a big state installed, a long
operator call, a garbage-collector pause. Heartbeats sent by that loop would
stop for as long, and the controller would declare a live node dead. So every
node process beats from this thread, over a socket of its own, and each beat
says how long ago the loop last turned. The controller hears a live process
whatever its loop does; a loop that has not turned for a while is reported as
stuck, a condition of its own, not a silent death.

The loop tells this thread it turned by ``loop_turned()`` (one float written,
read here: atomic under the GIL). The thread only beats; it never touches the
loop's sockets or machines. A loop stuck for ``STACK_AFTER`` seconds gets its
stack logged once (a warning naming where it waits: a sink's broker, an
operator, a lock), so a node the controller later declares stuck leaves the why.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from typing import Callable, Optional, Tuple

import zmq

from flux.addresses import CONTROLLER, ProcAddr
from flux.control_messages import Heartbeat
from flux.envelope import Envelope
from flux.runtime.transport import Transport

log = logging.getLogger(__name__)

#: seconds a loop may not turn before its stack is logged (once per stall)
STACK_AFTER = 5.0


def liveness_peer(name: str) -> str:
    """The transport name of process ``name``'s liveness socket."""
    return f"{name}/liveness"


class Liveness:
    """Beats to the controller every ``interval`` seconds, from its own thread."""

    def __init__(self, ctx: zmq.Context, name: str, inc: int, controller_address: str,
                 interval: float, keys: Optional[Tuple[bytes, bytes]] = None,
                 clock: Callable[[], float] = time.monotonic, host: str = "127.0.0.1",
                 ports: Optional[Tuple[int, int]] = None):
        self.name, self.inc = name, inc
        self.interval = interval
        self.clock = clock
        self.controller_address = controller_address
        self.transport = Transport(ctx, liveness_peer(name), inc, host=host, keys=keys,
                                   ports=ports)
        self.last_turn = clock()
        #: when the last beat left (None: none yet): the next is late past ``interval``
        self.last_beat: Optional[float] = None
        #: the view the loop has applied, carried by each beat (read from the loop)
        self.view: Callable[[], int] = lambda: 0
        self.beats = 0
        self.loop_thread: Optional[int] = None  # the loop's thread, as it last turned
        self._stack_logged_for: Optional[float] = None  # the stall whose stack was logged
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None

    def loop_turned(self) -> None:
        """Called by the node loop at every turn."""
        self.last_turn = self.clock()
        self.loop_thread = threading.get_ident()

    def start(self, view: Callable[[], int] = lambda: 0) -> "Liveness":
        self.view = view
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-liveness",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop beating; the thread closes its socket on the way out."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self.transport.close()

    def beat(self) -> None:
        """One heartbeat, with the time since the loop last turned and how late it is."""
        now = self.clock()
        lag = max(0.0, now - self.last_turn)
        late = 0.0 if self.last_beat is None else max(0.0, now - self.last_beat - self.interval)
        self.last_beat = now
        self.transport.send(CONTROLLER.name, Envelope(
            ProcAddr(self.name), CONTROLLER, self.view(),
            Heartbeat(round(lag, 3), round(late, 3)), self.inc, None))
        self.beats += 1

    def _log_stuck_stack(self) -> None:
        turned = self.last_turn
        if self.clock() - turned < STACK_AFTER or self._stack_logged_for == turned:
            return
        self._stack_logged_for = turned
        frame = sys._current_frames().get(self.loop_thread) if self.loop_thread else None
        if frame is not None:
            log.warning("%s: its loop has not turned for %.1fs; it is at:\n%s", self.name,
                        self.clock() - turned, "".join(traceback.format_stack(frame)))

    def _run(self) -> None:
        try:
            self.transport.connect(CONTROLLER.name, self.controller_address)
            while not self._stop.is_set():
                self.beat()
                self._log_stuck_stack()
                self._stop.wait(self.interval)
        except BaseException as exc:  # the node loop sees it and stops the process
            self.error = exc
            log.exception("the liveness thread of %s failed", self.name)
        finally:
            self.transport.close()
