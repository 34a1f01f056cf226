"""Sequence numbers and progress bounds (DESIGN 4.1, 4.3).

An SN is a tuple of ints compared lexicographically. The ingress numbers its
inputs ``(1,)``, ``(2,)``, ...; the k-th output produced while processing the
input with SN ``s`` gets ``s + (k,)``. The framework assigns SNs, never the
operator writer, so they are unique, deterministic and increasing on every
producer-to-consumer connection.

A *progress bound* ``b`` on a connection promises that no SN the connection
will still carry has a prefix ``<= b``. Bounds are compared through
``b + (INF,)`` so that bounds of different lengths order correctly.
"""
from __future__ import annotations

from typing import Iterable, Tuple

SN = Tuple[int, ...]

#: Below every SN: the high-water mark of a connection that has seen nothing.
NO_SN: SN = ()

#: The weakest progress bound: ISNs start at 1, so nothing has a prefix <= (0,).
NO_PROGRESS: SN = (0,)

INF = float("inf")

#: The length of an item's SN (DESIGN 11): one int, the number of its last input, with
#: one ingress. A sub-item's connection SN is its item's SN and its producer's partition.
ITEM_WIDTH = 1


#: With several ingresses (DESIGN 12, docs/design/parallel_io.md) each numbers its own
#: inputs in **epochs**: ingress ``i`` of ``k`` gives the inputs of its epoch ``e`` the numbers
#: after ``epoch_first(e, i, k)``, at most ``EPOCH_INPUTS - 1`` of them. So an SN stays one
#: int (rows, sinks, cuts and merges unchanged) and orders by (epoch, ingress, position):
#: one order every replica agrees on, found by no central counter. One ingress never
#: advances its epoch, and numbers 1, 2, 3, ... as before.
EPOCH_INPUTS = 1 << 20


def epoch_first(epoch: int, ingress: int, ingresses: int) -> int:
    """The number below every input ingress ``ingress`` of ``ingresses`` gives in ``epoch``."""
    if not 0 <= ingress < ingresses:
        raise ValueError(f"ingress {ingress} of {ingresses}")
    return (epoch * ingresses + ingress) * EPOCH_INPUTS


def epoch_at(wall: float, origin: float, interval: float) -> int:
    """The epoch of the wall clock at ``wall``: epoch e begins at ``origin + e *
    interval`` for every ingress of a job (the nodes' and the driver's clocks alike)."""
    return max(0, int((wall - origin) // interval))


def epoch_ended_by(cut: int, ingresses: int) -> int:
    """The epoch whose end a checkpoint's cut is (``epoch_first(e + 1, 0, k)`` for the
    cut at the end of epoch ``e``); -1 for no cut (0)."""
    return cut // (ingresses * EPOCH_INPUTS) - 1


def input_sn(n: int) -> SN:
    """The SN the ingress gives its n-th input (n >= 1)."""
    if n < 1:
        raise ValueError(f"input numbers start at 1, got {n}")
    return (n,)


def output_sn(input_sn_: SN, k: int) -> SN:
    """The SN of the k-th output (k >= 1) produced while processing ``input_sn_``."""
    return input_sn_ + (k,)


def before(sn: SN) -> SN:
    """The largest bound that still lets ``sn`` arrive (its same-length predecessor)."""
    return sn[:-1] + (sn[-1] - 1,)


def bound_key(bound: SN) -> tuple:
    """Sort key of a bound: the point ``bound + (INF,)`` in SN space."""
    return bound + (INF,)


def covers(bound: SN, sn: SN) -> bool:
    """True when ``bound`` proves that ``sn`` (and anything smaller) can no longer arrive."""
    return sn < bound + (INF,)


def weakest(bounds: Iterable[SN]) -> SN:
    """The bound that holds for all of ``bounds`` (the minimum in bound order)."""
    return min(bounds, key=bound_key)


def strongest(a: SN, b: SN) -> SN:
    """The larger of two true bounds on one connection (both hold, so the stronger does)."""
    return a if bound_key(a) >= bound_key(b) else b


def item_bound(frontier: SN, width: int = ITEM_WIDTH) -> SN:
    """What a bound on the connection SNs still to be released (``frontier``) promises
    about the items still to be processed, as a bound on the items' SNs (``width``
    long): an item the frontier covers whole is released, and so processed, already;
    one it covers only in part may still come (DESIGN 4.3, 11)."""
    if len(frontier) <= width:
        return frontier
    item = frontier[:width]
    return item[:-1] + (item[-1] - 1,)
