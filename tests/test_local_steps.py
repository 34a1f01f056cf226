"""When the ingress's pending inputs leave as an item (flux/runtime/local_steps.py, DESIGN 11).

An item not full leaves once stage 1 took every item before it, and its first input
waited ``item_delay`` or no item left within ``item_delay``: at once on a slow feed
(latency), larger while the dataflow is busy (each item costs every replica a fixed
amount).
"""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P
from flux.protocol.host import Host
from flux.runtime.local_steps import LocalSteps

pytestmark = pytest.mark.timeout(30)

INGRESS = Addr(0, 0, P)
DELAY = 1 / 128  # exact in binary: the clock steps by it without rounding


class Gatherer:
    """An ingress as ``LocalSteps`` sees it (``CutsItems``): inputs pending, and how many
    sub-items per connection stage 1 holds and has not taken."""

    def __init__(self):
        self.pending = 0
        self.in_flight = 0.0
        self.items = 0

    def pending_rows(self) -> int:
        return self.pending

    def all_taken(self) -> bool:
        return self.in_flight == 0

    def can_cut(self) -> bool:
        return self.pending > 0

    def cut_item(self) -> int:
        self.items += 1
        self.pending = 0
        return self.items


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def steps(gatherer: Gatherer, clock: Clock) -> LocalSteps:
    host = Host("ingress", {INGRESS: gatherer})
    return LocalSteps(host, lambda *effects: None, clock, flush_delay=DELAY,
                      keeps_snapshot=lambda addr, both: True, item_delay=DELAY)


def test_an_item_leaves_at_once_when_none_left_within_the_item_delay():
    g, clock = Gatherer(), Clock()
    local = steps(g, clock)
    g.pending = 3
    local.run()
    assert g.items == 1 and g.pending == 0 and local.cut_due() is None
    clock.now += DELAY  # a slow feed: the next input waits for nothing either
    g.pending = 1
    local.touch(INGRESS)
    local.run()
    assert g.items == 2


def test_after_an_item_the_next_waits_the_item_delay_and_gathers_what_comes():
    g, clock = Gatherer(), Clock()
    local = steps(g, clock)
    g.pending = 1
    local.run()
    assert g.items == 1
    clock.now = 100.0 + DELAY / 4
    g.pending = 2
    local.touch(INGRESS)
    local.run()
    assert g.items == 1 and local.cut_due() == pytest.approx(100.0 + DELAY)
    clock.now = 100.0 + DELAY / 2
    g.pending = 5
    local.touch(INGRESS)
    local.run()
    assert g.items == 1
    clock.now = 100.0 + DELAY
    local.run()
    assert g.items == 2 and g.pending == 0 and local.cut_due() is None


@pytest.mark.parametrize("in_flight", [0.25, 1.0])
def test_an_item_waits_while_stage_1_has_not_taken_the_one_before(in_flight):
    """One sub-item untaken on one connection of eight is enough to wait: the inputs
    that come meanwhile join the item, which leaves once stage 1 took the last one."""
    g, clock = Gatherer(), Clock()
    local = steps(g, clock)
    g.pending, g.in_flight = 1, in_flight
    local.run()
    assert g.items == 0
    assert local.cut_due() is None  # the credits wake the loop, not a timer: no spinning
    clock.now += 10 * DELAY
    g.pending = 40  # more came while stage 1 was busy
    local.run()
    assert g.items == 0 and local.cut_due() is None
    g.in_flight = 0.0  # its credits came back
    local.touch(INGRESS)
    local.run()
    assert g.items == 1 and g.pending == 0
