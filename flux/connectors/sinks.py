"""Sinks the egress hands its output to, in order, exactly once.

A sink is any callable taking one output ``(sn, record)``; a sink with a
``close()`` method is closed when the job stops. ``JsonLinesSink`` writes one
JSON object per line, ``{"sn": [...], "record": ...}``, flushed every
``flush_every`` lines so a reader sees output as it comes (and a crash of the
driver loses at most that many lines of the file, not of the dataflow).
"""
from __future__ import annotations

import json
from typing import Any, Tuple

from flux.operator import wire_form


class JsonLinesSink:
    def __init__(self, path: str, flush_every: int = 1000):
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every!r}")
        self.path = path
        self.flush_every = flush_every
        self.lines = 0
        self._file = open(path, "w", encoding="utf-8")

    def __call__(self, item: Tuple[Any, Any]) -> None:
        sn, record = item
        try:
            line = json.dumps({"sn": list(sn), "record": wire_form(record)})
        except TypeError as exc:
            raise TypeError(f"{self.path}: output {sn} cannot be written as JSON: {exc}") from exc
        self._file.write(line + "\n")
        self.lines += 1
        if self.lines % self.flush_every == 0:
            self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "JsonLinesSink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_json_lines(path: str) -> list:
    """The ``(sn, record)`` items a ``JsonLinesSink`` wrote, as lists (their wire form)."""
    with open(path, encoding="utf-8") as f:
        return [(tuple(row["sn"]), row["record"]) for row in map(json.loads, f)]
