"""Every endpoint a host runs is a ``Machine`` and declares the local work it does: a
segment every kind, the ingress only flushing, the egress none. The host learns that once,
as it takes a machine in (``LocalWork``); nothing probes for methods afterwards."""
from __future__ import annotations

import inspect

import pytest

from flux.addresses import Addr, P
from flux.control_messages import Avail, View
from flux.protocol.builder import MachineBuilder
from flux.protocol.host import Host
from flux.protocol.machine import Flushes, LocalWork, Machine, Processes, SendsParts, Snapshots
from flux.testing.dataflows import counting_dataflow

KINDS = (Processes, Flushes, SendsParts, Snapshots)


@pytest.fixture
def builder():
    return MachineBuilder(counting_dataflow(2), partitions=2, capacity=8, batch_size=4)


def machines(builder):
    return [builder.segment(Addr(1, 0, P)), builder.segment(Addr(2, 1, P)),
            builder.standby_segment(Addr(1, 1, P)), builder.ingress(), builder.egress()]


def kinds_of(machine):
    return {kind for kind in KINDS if isinstance(machine, kind)}


def test_every_machine_is_a_machine(builder):
    for machine in machines(builder):
        assert isinstance(machine, Machine), type(machine).__name__


def test_each_machine_declares_only_the_work_it_does(builder):
    *segments, ingress, egress = machines(builder)
    for seg in segments:
        assert kinds_of(seg) == set(KINDS)
    assert kinds_of(ingress) == {Flushes}
    assert kinds_of(egress) == set()


def test_methods_take_the_protocols_arguments(builder):
    for machine in machines(builder):
        for protocol in (Machine,) + tuple(kinds_of(machine)):
            for name, member in inspect.getmembers(protocol, inspect.isfunction):
                if name.startswith("_"):
                    continue
                wanted = list(inspect.signature(member).parameters)[1:]
                got = list(inspect.signature(getattr(machine, name)).parameters)
                assert got[:len(wanted)] == wanted, f"{type(machine).__name__}.{name}{got}"


def test_the_host_learns_the_work_of_a_machine_as_it_takes_it_in(builder):
    seg, ingress, egress = builder.segment(Addr(1, 0, P)), builder.ingress(), builder.egress()
    host = Host("node0", {seg.addr: seg, ingress.addr: ingress, egress.addr: egress},
                segment_factory=builder.standby_segment)
    assert host.work[seg.addr] == LocalWork(seg, seg, seg, seg, feeds_writers=seg)
    assert host.work[ingress.addr] == LocalWork(flushes=ingress, items=ingress)
    assert host.work[egress.addr] == LocalWork()
    assert list(host.work) == list(host.machines)
    new = Addr(1, 1, P)  # the ingress's replica 1.1P died; a standby for it here
    host.on_view(View(1, failed=frozenset({new}), failed_incs=frozenset({9})))
    host.on_view(View(2, avail=(Avail(new, 7, 1, "node0", "node1"),)))
    assert host.work[new].processes is host.machines[new]
    assert list(host.work) == list(host.machines)
    host.on_view(View(3, failed=frozenset({new}), failed_incs=frozenset({10})))
    assert new not in host.work and list(host.work) == list(host.machines)  # discarded


def test_the_kinds_learnt_once_per_class_are_what_isinstance_says(builder):
    """``LocalWork.of`` asks each class once (a protocol's isinstance is slow): a class made
    at run time, as the simulator makes one per world, gets the kinds of its instances."""
    seg = builder.segment(Addr(1, 0, P))
    made = type("Segment", (type(seg),), {"bulk_pairs": 2})
    twin = made.__new__(made)
    twin.__dict__.update(seg.__dict__)
    for machine in (seg, twin, builder.ingress(), builder.egress()):
        work = LocalWork.of(machine)
        got = {kind for kind, does in zip(KINDS, (work.processes, work.flushes, work.parts,
                                                  work.snapshots)) if does is machine}
        assert got == kinds_of(machine), type(machine).__name__
