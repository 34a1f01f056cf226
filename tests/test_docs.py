"""Every Python block of the pages under docs/ runs as written (a page's blocks run in
order in one namespace, as a reader would paste them)."""
from __future__ import annotations

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md")
               if re.search(r"```python\n", p.read_text()))

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_every_python_block_of_the_page_runs(page):
    namespace: dict = {"__name__": f"docs.{page.stem}"}
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
        exec(compile(block, f"{page.name} block {i + 1}", "exec"), namespace)


def test_the_docs_have_python_blocks_to_run():
    assert PAGES, "no page under docs/ has a python block: the test above runs nothing"
