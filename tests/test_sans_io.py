"""House rule (DESIGN 2, 3): the folder line is the layer line.

Every module under the pure folders is checked; only whole folders do I/O:
``flux/runtime`` (ZeroMQ, threads, clocks, files), ``flux/connectors`` (files,
Kafka, Delta), ``flux/spark`` (Spark), ``flux/testing`` (the rig, a test broker,
seeded workloads) and ``flux/sim`` (the simulator's seeded scheduler). A new module is covered by where it is put, never by a list.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["flux", "exchange", "controller", "statemover"]
#: The folders that may do I/O or draw random numbers: the drivers of the machines.
IO_FOLDERS = ("flux/runtime", "flux/connectors", "flux/spark", "flux/testing", "flux/sim")
FORBIDDEN = {"zmq", "pyspark", "threading", "time", "random", "socket", "asyncio", "multiprocessing",
             "os", "pathlib", "io", "fsspec", "subprocess", "signal", "logging"}


def pure_modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(rel.startswith(folder + "/") for folder in IO_FOLDERS):
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
    assert {"flux/protocol/buffer.py", "flux/protocol/flux_producer.py",
            "flux/protocol/flux_consumer.py", "flux/protocol/ingress.py", "flux/protocol/egress.py",
            "exchange/merge.py", "controller/placement.py", "statemover/mover.py",
            "flux/__init__.py"} <= found



@pytest.mark.parametrize("path", list(pure_modules()))
def test_protocol_module_imports_no_io(path):
    bad = imported_roots((ROOT / path).read_text()) & (FORBIDDEN | {"__import__"})
    assert not bad, f"{path} imports {sorted(bad)}"


def imported_modules(source: str) -> set:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", list(pure_modules()))
def test_protocol_module_imports_no_io_layer(path):
    """A pure module imports no module of an I/O folder (which would bring the I/O along)."""
    layers = tuple(folder.replace("/", ".") for folder in IO_FOLDERS)
    bad = {m for m in imported_modules((ROOT / path).read_text())
           if m in layers or m.startswith(tuple(layer + "." for layer in layers))}
    assert not bad, f"{path} imports {sorted(bad)}"


def test_the_check_catches_a_forbidden_import():
    assert imported_roots("import time\nfrom zmq import Context\n") & FORBIDDEN == {"time", "zmq"}
