"""Logs kept as one small object per write, named by the range of places it covers
(``<first>-<last>.json``): the driver's input log (``flux.runtime.input_log``) and the
splits' epoch logs (``flux.runtime.split_log``). The same on a local disk and on an
object store, where nothing can be appended to."""
from __future__ import annotations

from typing import List, Tuple


def ranged_path(folder: str, first: int, last: int) -> str:
    """The object of places ``first`` to ``last`` in ``folder``."""
    return f"{folder}/{first:012d}-{last:012d}.json"


def ranged_objects(fs, folder: str) -> List[Tuple[int, int]]:
    """The ranges of the objects in ``folder`` (an fsspec filesystem's), in order; other
    files are not a log's."""
    found = []
    for entry in fs.ls(folder, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        stem = name[:-len(".json")] if name.endswith(".json") else ""
        first, _, last = stem.partition("-")
        if first.isdigit() and last.isdigit():
            found.append((int(first), int(last)))
    return sorted(found)
