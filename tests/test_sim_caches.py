"""What the simulator keeps between steps is what it would ask anew (docs/design/simulator.md).

The world keeps, per connection, whether the message at its head may be taken, and per
machine its local steps, each with the process whose speed paces it; both are asked
again only when a step could have changed them. A seed replays the same schedule only if
what is kept equals, at every step and in the same order, what asking everything anew
would give: a chooser here checks that at every step of schedules with crashes, zombies,
cut links, catch-ups, checkpoints and restarts.
"""
from __future__ import annotations

import pytest

from flux.sim.__main__ import crash_window
from flux.sim.config import ZombieMachine
from flux.sim.schedule import RandomChooser, SimParams, execute

pytestmark = pytest.mark.timeout(120)


def deliveries_anew(world):
    """The deliver steps enabled now, every connection's head asked again."""
    net, faults = world.net, world.faults
    steps = []
    for key in net.busy:
        head = net.queues[key][0]
        dst = net.route(head) if faults.zombies else world.host_of[key[1]]
        if faults.cut and (net.host_by_inc.get(head.inc) in faults.cut or dst in faults.cut):
            continue
        if world.hosts[dst].accepts(head):
            steps.append(("deliver", key))
    return steps


def local_steps_anew(world, key):
    steps = world.steps
    if isinstance(key, ZombieMachine):
        work = world.hosts[key.name].work
        return [("zombie", key.name, s) for s in steps.local_steps(key.addr, work[key.addr])]
    return steps.local_steps(key)


class CheckingChooser(RandomChooser):
    """The seeded chooser, calling ``check(world, t)`` before every choice: it takes the
    same steps, and collects in ``wrong`` what each check found."""

    def __init__(self, seed, params, window):
        super().__init__(seed, params, window)
        self.checked = 0
        self.wrong = []

    def check(self, world, t) -> None:
        raise NotImplementedError

    def __call__(self, world, rng, t):
        self.check(world, t)
        self.checked += 1
        return super().__call__(world, rng, t)


def run_checked(chooser_class, params) -> None:
    """Three seeds of ``params`` with ``chooser_class`` checking every step: no finding."""
    window = crash_window(params)
    for seed in (1, 2, 3):
        chooser = chooser_class(seed, params, window)
        result = execute(seed, params, chooser)
        assert chooser.checked > 100, (seed, result.status, result.reason)
        assert not chooser.wrong, f"seed {seed}: {chooser.wrong[:5]} ({result.reason})"


class Checking(CheckingChooser):
    """What the world kept, against asking everything anew."""

    def check(self, world, t):
        steps, hosts = world.choosable()
        net = world.net
        if [s for s in steps if s[0] == "deliver"] != deliveries_anew(world):
            self.wrong.append((t, "deliveries"))
        if hosts != [world.host_of_step(s) for s in steps]:
            self.wrong.append((t, "paces"))
        if list(net.busy) != [k for k in net.busy_hosts] or any(
                bool(q) != (k in net.busy) for k, q in net.queues.items()):
            self.wrong.append((t, "busy connections"))
        for key, kept in world.steps.local.items():
            if kept != local_steps_anew(world, key):
                self.wrong.append((t, f"local steps of {key}"))


@pytest.mark.parametrize("params", [
    SimParams(),
    SimParams(stages=3, partitions=3, crashes=3, standbys=2),
    SimParams(crashes=3, standbys=2, false_suspicions=1, cuts=1),
    SimParams(variant="hear-the-dead", cuts=2, false_suspicions=2, standbys=1),
    SimParams(standbys=2, lossy_mover=0.05, crashes=2),
    SimParams(crashes=3, checkpoints=3, restarts=1, source_partitions=3, standbys=1),
    SimParams(corrupt_checkpoints=2, checkpoints=3, restarts=2, source_partitions=3),
], ids=["2x4", "3x3-standbys", "zombies-cuts", "hear-the-dead", "lossy-mover",
        "checkpoints-restarts", "damaged-checkpoints"])
@pytest.mark.sim  # a long simulator run: CI, not the quick suite
def test_what_the_world_keeps_between_steps_is_what_it_would_ask_anew(params):
    run_checked(Checking, params)
