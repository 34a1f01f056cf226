"""Aids for users' tests and ours: the multi-host rig (``rig``), a Kafka-protocol
test broker (``kafka_broker``), ``ThreadCluster`` (a whole job in threads of one
process), the reference output a failure-free run gives, seeded workloads, and
load operators (``Ballast``: state of a given size; ``BusyWork``: CPU per record;
``KeyedCounter``), and ``check_deterministic`` (a dataflow run twice in fresh
processes with different hash seeds must agree).

Names are imported on first use, so importing this package starts nothing.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Rig": "flux.testing.rig",
    "RigUnavailable": "flux.testing.rig",
    "KafkaBroker": "flux.testing.kafka_broker",
    "ThreadCluster": "flux.testing.threads",
    "reference_output": "flux.reference",
    "packet_workload": "flux.testing.workloads",
    "keyed_workload": "flux.testing.workloads",
    "Ballast": "flux.testing.ballast",
    "BusyWork": "flux.testing.busy",
    "KeyedCounter": "flux.testing.counter",
    "check_deterministic": "flux.runtime.determinism",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'flux.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
