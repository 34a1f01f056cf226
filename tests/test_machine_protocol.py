"""Every endpoint a host runs answers the whole ``Machine`` protocol (issue 10: no probing)."""
from __future__ import annotations

import inspect

import pytest

from flux.addresses import Addr, P
from flux.protocol.builder import MachineBuilder
from flux.testing.dataflows import counting_dataflow
from flux.protocol.machine import Machine


@pytest.fixture
def builder():
    return MachineBuilder(counting_dataflow(2), partitions=2, capacity=8, batch_size=4)


def machines(builder):
    return [builder.segment(Addr(1, 0, P)), builder.segment(Addr(2, 1, P)),
            builder.standby_segment(Addr(1, 1, P)), builder.ingress(), builder.egress()]


def test_every_machine_is_a_machine(builder):
    for machine in machines(builder):
        assert isinstance(machine, Machine), type(machine).__name__


def test_methods_take_the_protocols_arguments(builder):
    for machine in machines(builder):
        for name, member in inspect.getmembers(Machine, inspect.isfunction):
            if name.startswith("_"):
                continue
            wanted = list(inspect.signature(member).parameters)[1:]
            got = list(inspect.signature(getattr(machine, name)).parameters)
            assert got[:len(wanted)] == wanted, f"{type(machine).__name__}.{name}{got}"


def test_machines_without_local_work_say_so(builder):
    ingress, egress = builder.ingress(), builder.egress()
    assert not ingress.can_process() and not egress.can_process()
    assert list(egress.flushable()) == []
