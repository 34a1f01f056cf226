"""House rule (DESIGN 2): no package imports from a layer above it.

The layers, lowest first. A module's layer is that of the deepest package
listed that holds it; packages on one line are one layer and may use each
other. ``flux/__init__.py`` is the public face over everything (it imports
names from every layer, lazily for those that do I/O), so no module of the
library imports names from it.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: lowest first; the base: the user API (dataflow, operators, keyed state), the
#: protocol's vocabulary (SNs, addresses, messages, effects) and the pure libraries
#: (partitioners, the merge, the wire format, the StateMover)
LAYERS = [
    ("flux", "exchange", "statemover"),
    ("flux.protocol",),
    ("controller",),
    ("flux.examples",),
    ("flux.connectors",),
    ("flux.runtime",),
    ("flux.spark",),
    ("flux.testing",),
    ("flux.sim",),
]
FACADE = "flux"  # flux/__init__.py
PACKAGES = ("flux", "exchange", "statemover", "controller")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    best, depth = None, -1
    for rank, packages in enumerate(LAYERS):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and package.count(".") > depth:
                best, depth = rank, package.count(".")
    assert best is not None, f"{module} is in no layer: put it in a package of LAYERS"
    return best


def imports_of(path: Path) -> set:
    """Modules ``path`` imports, at any depth in it (imports inside functions count)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # ``from flux.testing import workloads`` imports the module flux.testing.workloads
            names |= {f"{node.module}.{alias.name}" for alias in node.names
                      if (ROOT / node.module.replace(".", "/") / f"{alias.name}.py").exists()}
    return {n for n in names if n.split(".")[0] in PACKAGES}


def library_modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path


@pytest.mark.parametrize("path", [p.relative_to(ROOT).as_posix() for p in library_modules()])
def test_no_import_from_a_higher_layer(path):
    module = module_name(ROOT / path)
    if module == FACADE:
        return
    mine = layer_of(module)
    higher = sorted(m for m in imports_of(ROOT / path)
                    if m == FACADE or layer_of(m) > mine)
    assert not higher, (f"{module} (layer {LAYERS[mine]}) imports {higher} from a layer above it "
                        f"(or the public face {FACADE!r}): move the code down or the import out")


def test_the_layers_cover_every_package():
    """A new package must be placed in the layer order, not fall into its parent's silently."""
    packages = {module_name(p.parent) for p in ROOT.glob("flux/*/__init__.py")}
    listed = {package for layer in LAYERS for package in layer}
    assert packages <= listed, f"packages not in LAYERS: {sorted(packages - listed)}"


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from flux.spark.job import FluxJob\n")
    assert any(layer_of(m) > layer_of("flux.protocol.host") for m in imports_of(bad))
