"""House rule (DESIGN 2, STYLE): a class stays small enough to read at once.

No class in the library has more than 300 lines or 25 methods (the ``def``s
directly in its body); a class that grows past either is split along its
seams, as the segment was into processing, catch-up and snapshots.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flux", "exchange", "statemover", "controller")
MAX_LINES, MAX_METHODS = 300, 25


def class_sizes(source: str):
    """(name, lines, methods) of every class in ``source``, nested ones too."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
            yield node.name, node.end_lineno - node.lineno + 1, methods


def offenders():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, lines, methods in class_sizes(path.read_text()):
                if lines > MAX_LINES or methods > MAX_METHODS:
                    yield f"{path.relative_to(ROOT).as_posix()}:{name} ({lines} lines, {methods} methods)"


def test_no_class_is_too_big():
    assert list(offenders()) == []


def test_the_count_sees_a_big_class():
    body = "".join(f"    def m{i}(self):\n        pass\n" for i in range(MAX_METHODS + 1))
    assert list(class_sizes("class Big:\n" + body)) == [("Big", 2 * MAX_METHODS + 3, MAX_METHODS + 1)]
