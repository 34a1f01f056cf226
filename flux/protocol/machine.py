"""What a host may ask of a protocol machine (DESIGN 3).

Every endpoint a ``Host`` runs (a segment replica, the ingress, the egress)
is a ``Machine``: events go in, effects come out, nothing else is touched.
Messages and views arrive through the host; local work (processing an input
the merge released, flushing a connection's batch) is asked for by the
driver, which owns the clock. A machine with no local work of a kind says so
(``can_process`` False, ``flushable`` empty); the driver never probes for
methods.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Protocol, Set, Tuple, runtime_checkable

from flux.addresses import Addr, MoverAddr
from flux.control_messages import Avail


@runtime_checkable
class Machine(Protocol):
    addr: Addr

    def ready_for(self, src: Addr, msg: Any) -> bool:
        """May ``msg`` be taken now? A guarded control message waits (DESIGN 4.4)."""

    def on_message(self, src: Addr, msg: Any) -> List:
        """A message from ``src``, taken in FIFO order; returns effects."""

    def on_fail(self, dead: Set[Addr]) -> List:
        """A view declared ``dead`` failed (paper 3.2.1, Figure 4)."""

    def on_avail(self, avail: Avail, peer_mover: MoverAddr) -> List:
        """A view announced a standby replica (Figure 5 avail())."""

    def can_process(self) -> bool:
        """Is an input ready to go through the operators (Figure 3 action 1's guard)?"""

    def process(self) -> int:
        """Run the next input; returns how many outputs it made."""

    def process_ready(self, limit: int) -> int:
        """``process`` while ``can_process`` holds, up to ``limit`` inputs, in one step;
        returns how many inputs it took."""

    def flushable(self) -> Iterable[Tuple[int, int]]:
        """The connections ``(partition, destination)`` with something to send."""

    def flush(self, i: int, d: int) -> List:
        """The next batch on connection ``(i, d)``, as effects."""

    def credits_due(self) -> bool:
        """Did it take inputs whose credits should go to their producers (back-pressure)?"""

    def send_credits(self) -> List:
        """Those credits, as effects."""

    def has_part(self) -> bool:
        """Is a bulk part of a catch-up waiting to go out (phase 1)?"""

    def send_part(self) -> List:
        """Hand the next bulk part to the StateMover, as effects."""

    def snapshot_due(self) -> bool:
        """Has it crossed a checkpoint's cut it has not snapshotted (DESIGN 10)?"""

    def snapshot(self, keep: bool = True) -> List:
        """Snapshot its operators for that checkpoint, as effects (``keep`` False: cross
        the cut without packing the state)."""

    def idle(self) -> bool:
        """Nothing is waiting in this machine's buffers or merge."""

    def check_invariants(self) -> None:
        """Assert the machine's invariants (tests and the simulator call it)."""
