"""Sub-items for tests that drive the machines by hand (DESIGN 11): the payload of a
protocol tuple is a ``Rows``; its connection SN is its item's number and its producer's
partition."""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from exchange.routing import RecordRouter
from exchange.rows import Rows
from flux.data_messages import Batch
from flux.effects import Send


def rows(*pairs: Tuple[Tuple[int, ...], Any]) -> Rows:
    """``Rows`` of ``(row SN, record)`` pairs, in the order given."""
    if not pairs:
        raise ValueError("a sub-item has rows; an empty one is never sent")
    return Rows(np.array([sn for sn, _ in pairs], dtype=np.int64), [r for _, r in pairs])


def by(route) -> RecordRouter:
    """A router that sends a record to ``route(record)`` (a test's own routing)."""
    return RecordRouter(route, 0)


def inputs(first: int, *records: Any) -> Rows:
    """The ingress's rows: inputs numbered from ``first``."""
    return Rows.of_inputs(first, list(records))


def pairs(items) -> list:
    """``(row SN, record)`` of every row of ``(connection SN, Rows)`` tuples, in order."""
    return [pair for _, sub in items for pair in sub.pairs()]


def plain(x):
    """``x`` with every ``Rows`` as its ``(row SN, record)`` pairs: Rows compare by
    identity, so assertions compare what they hold."""
    if isinstance(x, Rows):
        return tuple(x.pairs())
    if isinstance(x, Send):
        return Send(x.src, x.dst, plain(x.msg))
    if isinstance(x, Batch):
        return Batch(plain(x.items), x.bound, x.cut)
    if isinstance(x, (list, tuple)):
        return type(x)(plain(y) for y in x)
    return x
