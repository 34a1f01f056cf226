"""The data plane: what producers and consumers say to each other (paper 3.1, 3.3, 5).

Data, acks and credits, the take-over's reverse, and the catch-up's in-band control
(pause, pause-ack, csync, psync), which travel on the same FIFO connections
as the data they must follow (DESIGN 4.4).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from flux.sequence import SN

Item = Tuple[SN, Any]


@dataclass(frozen=True, slots=True)
class Batch:
    """Data from a producer: tuples in SN order, then a progress bound (DESIGN 4.3), and
    the newest checkpoint cut ``(k, n)`` the producer knows (DESIGN 10; None: none yet)."""

    items: Tuple[Item, ...]
    bound: SN
    cut: Optional[Tuple[int, int]] = None


@dataclass(frozen=True, slots=True)
class Ack:
    """Cumulative ack: the consumer holds every SN <= ``hwm`` of this connection (3.1.3).
    ``moves``: the newest move cut the consumer crossed (None: it keeps no moves, an
    egress): a producer forgets the move cuts every consumer crossed (DESIGN 13)."""

    hwm: SN
    moves: Optional[int] = 0


@dataclass(frozen=True, slots=True)
class Credit:
    """Consumer to its data source: I took (released from my merge, to process) every
    tuple <= ``sn`` you sent me; that many more may come (back-pressure, docs/design/backpressure.md).
    ``moves``: as ``Ack.moves``."""

    sn: SN
    moves: Optional[int] = 0


@dataclass(frozen=True, slots=True)
class Reverse:
    """Consumer to the surviving producer: send me data from after ``hwm`` (Figure 4, 5.2).

    A sink's writer (docs/design/parallel_io.md) holds more than it may let the producer
    evict: ``hwm`` is then what its sink committed (the producer's ack), ``held`` what
    it received (the producer sends from after it); None: ``held`` is ``hwm``."""

    hwm: SN
    held: Optional[SN] = None


@dataclass(frozen=True, slots=True)
class Pause:
    """Consumer A to a data source: stop sending to me, answer after your last data (5.3.1)."""

    version: int


@dataclass(frozen=True, slots=True)
class PauseAck:
    """Producer to A, after its last data: nothing more until your csync (5.3.1)."""

    version: int


@dataclass(frozen=True, slots=True)
class CSync:
    """Fold-in, from both replicas of a rebuilt consumer to its producers (5.3.2)."""

    version: int


@dataclass(frozen=True, slots=True)
class PSync:
    """Fold-in, from both replicas of a rebuilt producer to its consumers (5.3.2).
    ``forwards``: the active goes on sending data to this consumer, which reversed to it,
    until the consumer's ``Restore`` (the hand-back, docs/design/handback.md); without
    it the active stops here, as in the paper."""

    version: int
    forwards: bool = False


@dataclass(frozen=True, slots=True)
class Restore:
    """A consumer to the active it reversed to: the new replica on my side has caught up,
    stop sending me data; answer after your last data (docs/design/handback.md)."""

    version: int


@dataclass(frozen=True, slots=True)
class Stay:
    """A consumer to the active that forwards to it: the new replica on my side died
    before I handed back; I go on taking your data (this is my reverse, 5.2)."""

    version: int


@dataclass(frozen=True, slots=True)
class Restored:
    """The active to that consumer, after its last data to it: nothing more follows."""

    version: int


@dataclass(frozen=True, slots=True)
class IngressLog:
    """An ingress's leading replica to its twin: where it ended items and epochs, in the
    order it decided (entries ``first``, ``first + 1``, ...): ``("item", x)`` an item
    ends at input ``x``, ``("epoch", e)`` epoch ``e`` starts, ``("cut", k, e)``
    checkpoint ``k``'s cut ends epoch ``e``. An item leaves only once the
    twin has its end, so the twin can always cut the items any consumer holds
    (docs/design/parallel_io.md, a pair of ingresses)."""

    first: int
    entries: Tuple[Tuple, ...]


@dataclass(frozen=True, slots=True)
class LogAck:
    """The twin holds the leading replica's entries up to ``upto``."""

    upto: int
