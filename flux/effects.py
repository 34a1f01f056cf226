"""Effects: what a protocol machine asks its driver to do (DESIGN 3).

Machines never do I/O; they return these and the simulator or the runtime
carries them out. Reports for the controller (``FoldedIn``, ``TakeoverDone``)
are effects too; they live with the control messages they become.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Optional, Tuple

from flux.data_messages import Item
from flux.digests import Digest
from flux.sequence import SN


@dataclass(frozen=True, slots=True)
class Send:
    """Put ``msg`` on the FIFO connection from ``src`` to ``dst``."""

    src: Any
    dst: Any
    msg: Any


@dataclass(frozen=True, slots=True)
class Deliver:
    """Effect of the egress: these items leave the dataflow, in order; ``partition``:
    the last-stage partition they come from, with an egress per partition (else 0)."""

    items: Tuple[Item, ...]
    partition: int = 0


@dataclass(frozen=True, slots=True)
class StateInstalled:
    """State of a catch-up ``transfer`` arrived (``nbytes``) and is installed: a bulk part,
    or the rest. The runtime times the movement; the protocol does not need it."""

    transfer: Hashable
    nbytes: int
    #: False for a bulk part (phase 1): more of the same transfer follows
    complete: bool = True


@dataclass(frozen=True, slots=True)
class SourcesPaused:
    """The active of catch-up ``transfer`` paused its sources (phase 2, 5.3.1): its
    partition's output waits from here until ``SourcesResumed``. The runtime times
    the pause; the protocol does not need it."""

    transfer: Hashable


@dataclass(frozen=True, slots=True)
class SourcesResumed:
    """The active of catch-up ``transfer`` resumed its sources (the state sent, or the
    attempt aborted): its partition's pause is over."""

    transfer: Hashable


# -- checkpoints (DESIGN 10, docs/design/checkpoints.md) ------------------------------------------

@dataclass(frozen=True, slots=True)
class RangeAwaited:
    """Replica ``addr`` crossed the cut of checkpoint ``number`` as the destination of
    ``move`` without its range: it processes nothing past the cut until it installed it
    (``RangeInstalled``). The runtime times that pause (DESIGN 13)."""

    number: int
    move: Any
    addr: Any


@dataclass(frozen=True, slots=True)
class PackRange:
    """Replica ``addr`` crossed the cut of checkpoint ``number`` as the source of the
    prepare ``move`` and kept the range's bulk: ``parts`` (``[[operator, keys, values],
    ...]``, values its stores replace and never change, so any thread may read them).
    The host packs it and reports ``RangePacked``: the runtime off its loop, so that a
    bulk of megabytes does not hold up the partition (DESIGN 13)."""

    number: int
    move: Any
    addr: Any
    parts: Any


@dataclass(frozen=True, slots=True)
class CutChosen:
    """The ingress chose the cut of checkpoint ``number``: inputs 1..``cut``. The runtime
    records the source position after input ``cut`` for it."""

    number: int
    cut: int


@dataclass(frozen=True, slots=True)
class CutPassed:
    """Ingress ``ingress`` (one of several, DESIGN 12) ended the last epoch of checkpoint
    ``number``, whose cut is ``cut``, having read ``read`` inputs of its source partition
    (a split's count: its position at the cut; the runtime keeps a source position beside
    it where a count is none); the checkpoint has its position once every ingress
    passed."""

    number: int
    cut: int
    ingress: int
    read: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Replica ``addr`` crossed the cut of checkpoint ``number``: ``data`` is its
    operators' state after every input up to ``cut`` and none beyond (packed; None when
    this replica was told not to keep it: its twin writes it), whole, or, with ``base``,
    the changes since the snapshot it made at checkpoint ``base`` (flux.snapshot_chain)."""

    number: int
    cut: int
    addr: Hashable
    data: Optional[bytes]
    base: Optional[int] = None
    #: its digests at the cut, for the comparison with its twin's (DESIGN 14), or None
    #: when its segment does not digest
    digest: Optional[Digest] = None


@dataclass(frozen=True, slots=True)
class SinkCommit:
    """The egress delivered every output of inputs up to ``cut`` (and maybe more): the
    sink (of ``partition``, with an egress per partition) commits what it has, for
    checkpoint ``number`` (0: a sink's writer commits between checkpoints, to let its
    producers evict)."""

    number: int
    cut: int
    partition: int = 0
    #: a sink's writer (docs/design/parallel_io.md): the last SN the commit covers, which
    #: it acks to both replicas once the sink returns; None for a driver-side egress
    through: Optional[SN] = None
