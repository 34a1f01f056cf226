"""House rule (DESIGN 3): protocol modules never import I/O, threads, clocks or randomness.

The list of pure modules is every module of the protocol packages except the
drivers named below, so a new protocol module is covered without editing this.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["flux", "exchange", "controller", "statemover"]
#: Modules allowed to do I/O or use randomness: the drivers of the machines.
# drivers of the protocol, and the driver-side parts of the API that read the clock
DRIVERS = {"flux/sim", "flux/runtime", "flux/spark", "flux/workload.py", "exchange/transport.py",
           "controller/service.py", "statemover/service.py", "flux/sources.py",
           "flux/metrics.py"}
FORBIDDEN = {"zmq", "pyspark", "threading", "time", "random", "socket", "asyncio", "multiprocessing"}


def pure_modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(rel == d or rel.startswith(d + "/") for d in DRIVERS):
                yield rel


def imported_roots(source: str) -> set:
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            roots.add("__import__")
    return roots


def test_the_protocol_modules_are_found():
    found = set(pure_modules())
    assert {"flux/buffer.py", "flux/flux_producer.py", "flux/flux_consumer.py", "flux/ingress.py",
            "flux/egress.py", "exchange/merge.py", "controller/placement.py"} <= found


@pytest.mark.parametrize("path", list(pure_modules()))
def test_protocol_module_imports_no_io(path):
    bad = imported_roots((ROOT / path).read_text()) & (FORBIDDEN | {"__import__"})
    assert not bad, f"{path} imports {sorted(bad)}"


def test_the_check_catches_a_forbidden_import():
    assert imported_roots("import time\nfrom zmq import Context\n") & FORBIDDEN == {"time", "zmq"}
