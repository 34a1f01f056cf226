"""What the protocol machines keep between steps is what they would ask anew.

A producer keeps its open connections (DESIGN 4.4: ACTIVE, SEND, not paused), its buffers
the first unsent SN of each destination, a merge its frontier and whether it may
release (DESIGN 4.3): each is forgotten by every change that can affect it. A kept answer
that went stale would change which steps a schedule offers, so a chooser here checks
every kept answer of every machine, live or zombie, at every step of schedules with
crashes, zombies, cut links, catch-ups, checkpoints and restarts.
"""
from __future__ import annotations

import pytest

from exchange.merge import OrderedMerge
from flux.protocol.buffer import Buffer
from flux.protocol.producer import Producer, links_open_now
from flux.sim.schedule import SimParams
from test_sim_caches import CheckingChooser, run_checked

pytestmark = pytest.mark.timeout(300)


def kept_parts(world):
    """Every producer and merge of every process of the world."""
    for host in world.hosts.values():
        for machine in host.machines.values():
            for part in (getattr(machine, "out", None),
                         getattr(getattr(machine, "fprod", None), "out", None),
                         getattr(getattr(machine, "fcons", None), "merge", None)):
                if part is not None:
                    yield part


def check_kept(part) -> None:
    if isinstance(part, OrderedMerge):
        part.check_invariants()
    elif isinstance(part, Producer):
        if part._open is not None:
            assert part._open == links_open_now(part.links), part.addr
        for buffer in part.buffers:
            Buffer.check_invariants(buffer)


class Checking(CheckingChooser):
    """What every machine kept, against asking anew."""

    def check(self, world, t):
        for part in kept_parts(world):
            try:
                check_kept(part)
            except AssertionError as exc:
                self.wrong.append((t, str(exc)))


SIM = pytest.mark.sim


@pytest.mark.parametrize("params", [
    pytest.param(SimParams(), id="2x4"),
    pytest.param(SimParams(stages=3, partitions=3, crashes=3, standbys=2), id="3x3-standbys",
                 marks=SIM),
    pytest.param(SimParams(crashes=3, standbys=2, false_suspicions=1, cuts=1),
                 id="zombies-cuts", marks=SIM),
    pytest.param(SimParams(standbys=2, lossy_mover=0.05, crashes=2), id="lossy-mover",
                 marks=SIM),
    pytest.param(SimParams(crashes=3, checkpoints=3, restarts=1, source_partitions=3,
                           standbys=1), id="checkpoints-restarts", marks=SIM),
])
def test_what_the_machines_keep_is_what_they_would_ask_anew(params):
    run_checked(Checking, params)


def test_a_stale_answer_is_caught():
    merge = OrderedMerge([0, 1])
    merge.push(0, [((1, 0), "a")])
    merge.push(1, [((2, 1), "b")])
    assert merge.frontier() == (1, -1)
    merge.queues[0].clear()  # behind the merge's back: what it kept is now wrong
    with pytest.raises(AssertionError):
        merge.check_invariants()
    buffer = Buffer(4)
    buffer.put((1,), "a")
    assert buffer.first_unsent(0) == (1,)
    buffer.sent[0] = (1,)  # likewise
    with pytest.raises(AssertionError):
        buffer.check_invariants()
