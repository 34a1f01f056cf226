"""What a host may ask of a protocol machine (DESIGN 3).

Every endpoint a ``Host`` runs (a segment replica, the ingress, the egress)
is a ``Machine``: events go in, effects come out, nothing else is touched.
Messages and views arrive through the host. Local work (an input the merge
released through the operators, a connection's batch, a bulk part of a
catch-up, a checkpoint's snapshot) is asked for by the driver, which owns the
clock; each kind is a protocol of its own, which a machine implements only if
it does that work: the ingress flushes its connections and nothing else, the
egress has no local work at all, a segment does every kind.

The host learns once, when it takes a machine in, which kinds it does
(``LocalWork.of``); the drivers ask that record, never the machine for methods.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, FrozenSet, Iterable, List, Optional, Protocol, Set, Tuple, runtime_checkable

from flux.addresses import Addr, MoverAddr
from flux.control_messages import Avail, SegmentStats


@runtime_checkable
class Machine(Protocol):
    """What every endpoint answers: its messages, the views, and its health."""

    addr: Addr

    def ready_for(self, src: Addr, msg: Any) -> bool:
        """May ``msg`` be taken now? A guarded control message waits (DESIGN 4.4)."""

    def on_message(self, src: Addr, msg: Any) -> List:
        """A message from ``src``, taken in FIFO order; returns effects."""

    def on_fail(self, dead: Set[Addr]) -> List:
        """A view declared ``dead`` failed (paper 3.2.1, Figure 4)."""

    def on_avail(self, avail: Avail, peer_mover: MoverAddr) -> List:
        """A view announced a standby replica (Figure 5 avail())."""

    def on_join(self, partitions: FrozenSet[int]) -> List:
        """A view started dormant partitions (docs/design/rescaling.md)."""

    def on_leave(self, partitions: FrozenSet[int], cut: tuple = ()) -> List:
        """A view took partitions out: a live rescale to fewer (docs/design/rescaling.md);
        ``cut``: the cut ``(k, n)`` that took their last groups (() for a machine made
        later: it was told every cut since)."""

    def stats(self) -> SegmentStats:
        """Counters for monitoring (a node reports them, DESIGN 9)."""

    def idle(self) -> bool:
        """Nothing is waiting in this machine's buffers or merge."""

    def check_invariants(self) -> None:
        """Assert the machine's invariants (tests and the simulator call it)."""


@runtime_checkable
class Processes(Protocol):
    """Takes the items its merge releases through operators, at the driver's pace, and
    credits them back to their producers (Figure 3 action 1; back-pressure)."""

    def can_process(self) -> bool:
        """Is an item ready to go through the operators (Figure 3 action 1's guard)?"""

    def process(self) -> int:
        """Run the next item; returns how many outputs it made."""

    def process_ready(self, limit: int) -> int:
        """``process`` while ``can_process`` holds, up to ``limit`` items, in one step;
        returns how many items it took."""

    def credits_due(self) -> bool:
        """Did it take inputs whose credits should go to their producers (back-pressure)?"""

    def send_credits(self) -> List:
        """Those credits, as effects."""


@runtime_checkable
class CutsItems(Protocol):
    """Gathers inputs into items and lets them go when the driver says (the ingress,
    DESIGN 11): a full item leaves by itself; the driver lets one go that waited long
    enough (``item_delay``), so items are small at low rates (latency) and full at high
    ones (throughput)."""

    def pending_rows(self) -> int:
        """How many inputs wait for their item."""

    def all_taken(self) -> bool:
        """Did its consumers take every item sent to them on the connections open now
        (a paused one, in a catch-up, holds back no other)? Then the next item need not
        wait for more inputs: they keep up."""

    def can_cut(self) -> bool:
        """Are inputs pending, with room for their item?"""

    def cut_item(self) -> int:
        """Make the pending inputs an item; returns its number (0: none made)."""


@runtime_checkable
class Flushes(Protocol):
    """Buffers what it sends per connection; the driver decides when a batch leaves
    (the batch is the protocol's item, DESIGN 11)."""

    def flushable(self) -> Iterable[Tuple[int, int]]:
        """The connections ``(partition, destination)`` with something to send."""

    def flush(self, i: int, d: int) -> List:
        """The next batch on connection ``(i, d)``, as effects."""

    def keeps_up(self, i: int, d: int) -> bool:
        """Has the consumer on ``(i, d)`` taken everything sent on it? Then a batch need
        not wait for more: the consumer keeps up (DESIGN 11)."""


@runtime_checkable
class SendsParts(Protocol):
    """Streams the bulk of its state to a new replica a part per step (phase 1 of
    catch-up, paper 5.3), between inputs."""

    def has_part(self) -> bool:
        """Is a bulk part of a catch-up waiting to go out (phase 1)?"""

    def send_part(self) -> List:
        """Hand the next bulk part to the StateMover, as effects."""


@runtime_checkable
class Snapshots(Protocol):
    """Runs operators whose state a checkpoint covers (DESIGN 10)."""

    def snapshot_due(self) -> bool:
        """Has it crossed a checkpoint's cut it has not snapshotted?"""

    def both_replicas_write(self) -> bool:
        """Must both replicas of its pair write the snapshot of the cut it crosses next?"""

    def snapshot(self, keep: bool = True) -> List:
        """Snapshot its operators for that checkpoint, as effects (``keep`` False: cross
        the cut without packing the state)."""

    def snapshot_lost(self) -> None:
        """A snapshot of it may not be in the store: the next one is whole."""

    def probe_keys(self, number: int, cut: int, operator: int, groups: Iterable[int]):
        """Its keyed store's pairs in ``groups`` as at that cut, or None (DESIGN 14)."""


@runtime_checkable
class FeedsWriters(Protocol):
    """May feed a sink's writer (a segment of the last stage may): told when a view
    starts one again elsewhere (docs/design/parallel_io.md)."""

    def on_writer_moved(self, writer: Addr) -> List:
        """Keep for ``writer`` what it did not ack, and send from its next reverse."""


@dataclass(frozen=True)
class LocalWork:
    """The kinds of local work one machine does, each the machine itself typed by what
    it does, or None: learnt once, when a host takes the machine in."""

    processes: Optional[Processes] = None
    flushes: Optional[Flushes] = None
    parts: Optional[SendsParts] = None
    snapshots: Optional[Snapshots] = None
    items: Optional[CutsItems] = None
    #: not local work, but learnt the same way: a view event only segments take
    feeds_writers: Optional[FeedsWriters] = None

    @classmethod
    def of(cls, machine: Machine) -> "LocalWork":
        kinds = _kinds_of(type(machine))
        return cls(*(machine if does else None for does in kinds))


#: machine class -> which kinds of local work its instances do. A protocol's isinstance
#: walks its members at every call (the five: 35 us here; ``LocalWork.of`` now 1.9 us),
#: and a simulated world builds dozens of machines of a few classes per schedule. Weak
#: keys: the simulator makes a segment class per world.
_KINDS: "weakref.WeakKeyDictionary[type, Tuple[bool, ...]]" = weakref.WeakKeyDictionary()


def _kinds_of(machine_class: type) -> Tuple[bool, ...]:
    """Does a machine of ``machine_class`` process, flush, send parts, snapshot, cut
    items, feed writers? Its methods say, and they are its class's."""
    kinds = _KINDS.get(machine_class)
    if kinds is None:
        kinds = _KINDS[machine_class] = tuple(
            issubclass(machine_class, kind)
            for kind in (Processes, Flushes, SendsParts, Snapshots, CutsItems, FeedsWriters))
    return kinds
