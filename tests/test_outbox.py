"""When a process's acks and credits leave (flux/runtime/outbox.py, DESIGN 4.4).

They are cumulative, so each waits ``ack_delay`` for a later one on its connection
that replaces it; anything else for the same peer sends the held ones first, so they
keep their place before what must follow them.
"""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P, S
from flux.data_messages import Ack, Batch, Credit
from flux.envelope import Envelope
from flux.runtime.outbox import Outbox

pytestmark = pytest.mark.timeout(30)

DELAY = 1 / 128  # exact in binary: the clock steps by it without rounding
INGRESS = Addr(0, 0, P)


class Wire:
    """A transport that takes everything and keeps what it was handed, in order."""

    def __init__(self):
        self.dealers = {}
        self.sent = []

    def connect(self, peer, address):
        self.dealers[peer] = address

    def send(self, peer, env):
        self.sent.append((peer, env))
        return True


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def outbox():
    wire, clock = Wire(), Clock()
    box = Outbox(wire, {"ingress": "tcp://x", "node1": "tcp://y"}, set(), clock, DELAY)
    return box, wire, clock


def credit(consumer, sn):
    return Envelope(consumer, INGRESS, 0, Credit((sn, 0)))


def end_of_turn(box, clock):
    """What the loop does as a turn ends."""
    box.send_held_acks(clock() - DELAY)


def test_a_credit_waits_the_ack_delay_and_a_later_one_replaces_it():
    box, wire, clock = outbox()
    box.send("ingress", credit(Addr(1, 0, P), 3))
    box.send("ingress", credit(Addr(1, 1, S), 3))  # another consumer on this node
    end_of_turn(box, clock)
    assert wire.sent == [] and box.acks_due() == pytest.approx(100.0 + DELAY)
    clock.now += DELAY / 2
    box.send("ingress", credit(Addr(1, 0, P), 5))  # replaces 3 of its connection
    end_of_turn(box, clock)
    assert wire.sent == []
    clock.now = 100.0 + DELAY
    end_of_turn(box, clock)
    assert sorted((env.src.partition, env.msg.sn) for _, env in wire.sent) == [
        (0, (5, 0)), (1, (3, 0))]
    assert box.acks_due() is None


def test_each_peer_waits_on_its_own_and_held_acks_go_before_anything_else_to_it():
    box, wire, clock = outbox()
    box.send("ingress", credit(Addr(1, 0, P), 3))
    clock.now += DELAY / 2
    box.send("node1", Envelope(Addr(2, 0, P), Addr(1, 0, P), 0, Ack((7, 0))))
    clock.now = 100.0 + DELAY
    end_of_turn(box, clock)
    assert [peer for peer, _ in wire.sent] == ["ingress"]  # node1's has waited half
    batch = Envelope(Addr(1, 0, P), Addr(2, 0, P), 0, Batch((), (9,), None))
    box.send("node1", batch)  # anything else for node1: its held ack first
    assert [env.msg for _, env in wire.sent[1:]] == [Ack((7, 0)), batch.msg]
    assert box.acks_due() is None


def test_nothing_waits_for_a_peer_known_dead():
    wire, clock = Wire(), Clock()
    box = Outbox(wire, {"ingress": "tcp://x"}, {"ingress"}, clock, DELAY)
    box.send("ingress", credit(Addr(1, 0, P), 3))
    box.send("ingress", Envelope(Addr(1, 0, P), INGRESS, 0, Batch((), (9,), None)))
    clock.now += DELAY
    end_of_turn(box, clock)
    assert wire.sent == [] and box.acks_due() is None
