"""The README's example runs as written and its output is the failure-free output (slow)."""
from __future__ import annotations

import pathlib
import re

import pytest

from flux.operator import wire_form
from flux.reference import reference_output

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no python example"
    return blocks[0]


def test_the_readme_example_runs_and_its_output_is_the_reference():
    namespace: dict = {}
    exec(compile(readme_example(), "README.md", "exec"), namespace)
    expected = reference_output(namespace["dataflow"], namespace["packets"], 4)
    assert len(namespace["output"]) == len(expected) > 1000
    assert [wire_form(x) for x in namespace["output"]] == [wire_form(x) for x in expected]
