"""The simulator's connections when a zombie and its replacement share addresses
(``flux.sim.channels``): a crash loses what was addressed to the crashed process, and
nothing a zombie's connections carry to the zombie (seed 19056 of the 6,3,5 shape with
false suspicions: the crash of the replacement on standby1 dropped an item one zombie
replica had sent another on node2, and the zombie crossed a cut without it)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from flux.addresses import Addr, S
from flux.envelope import Envelope
from flux.sim.channels import Channels

pytestmark = pytest.mark.timeout(30)

PRODUCER, CONSUMER = Addr(1, 1, S), Addr(2, 1, S)


def _channels(zombies: set) -> Channels:
    hosts = {"node2": SimpleNamespace(inc=6), "standby1": SimpleNamespace(inc=11)}
    world = SimpleNamespace(
        hosts=hosts, alive={"node2": True, "standby1": True},
        host_of={PRODUCER: "standby1", CONSUMER: "standby1"},  # rebuilt on standby1
        faults=SimpleNamespace(zombies=zombies), outcome=SimpleNamespace(mover_lost=0),
        config=SimpleNamespace(mover_loss=0.0))
    return Channels(world)


def _batch(inc: int, item: str) -> Envelope:
    return Envelope(PRODUCER, CONSUMER, 3, item, inc=inc, dst_inc=inc)


def test_a_crash_of_the_replacement_keeps_what_the_zombie_sent_the_zombie():
    net = _channels({"node2"})
    zombie_first, replacement, zombie_next = _batch(6, "5.1"), _batch(11, "b40"), \
        _batch(6, "8.1")
    net.send([zombie_first, replacement, zombie_next])
    assert net.route(zombie_first) == "node2" and net.route(replacement) == "standby1"
    net.world.alive["standby1"] = False
    net.halt("standby1", {PRODUCER, CONSUMER}, {}, rng=None)
    assert list(net.queues[(PRODUCER, CONSUMER)]) == [zombie_first, zombie_next]


def test_without_a_zombie_a_crash_loses_everything_addressed_to_it():
    net = _channels(set())
    net.send([_batch(11, "a"), _batch(11, "b")])
    net.halt("standby1", {PRODUCER, CONSUMER}, {}, rng=None)
    assert (PRODUCER, CONSUMER) not in net.busy and not net.queues[(PRODUCER, CONSUMER)]
