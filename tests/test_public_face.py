"""The public face: users import from ``flux`` alone, and ``import flux`` is light."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import flux
from flux.operator import Operator

ROOT = Path(__file__).resolve().parents[1]


def test_everything_exported_resolves():
    for name in flux.__all__:
        assert getattr(flux, name) is not None, name


def test_importing_flux_opens_no_sockets_and_starts_no_spark():
    """Executors and the simulator import the package: it must not drag ZeroMQ or Spark in."""
    code = ("import sys, flux; heavy = [m for m in ('zmq', 'pyspark', 'flux.runtime',"
            " 'flux.spark') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "[]"


def test_the_readme_example_imports_from_flux_alone():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    imports = re.findall(r"^\s*(?:from|import) (\S+)", block, re.M)
    assert imports and set(imports) == {"flux"}, imports


def test_the_library_operators_meet_the_operator_contract():
    for op in (flux.SessionReconstruction(), flux.WindowedDurationStats(),
               flux.Map(str), flux.Filter(bool), flux.FlatMap(list),
               flux.KeyedAggregate(key=lambda r: r, fold=lambda old, r: r)):
        assert isinstance(op, Operator), type(op).__name__


def test_an_unknown_name_is_an_attribute_error():
    try:
        flux.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("flux.NoSuchThing resolved")
