"""The garbage collector's thresholds while a data path runs.

CPython runs a young-generation collection every 700 container allocations by
default. A node allocates several per tuple (decoded records, SN tuples,
outputs) that mostly die young, so at tens of thousands of tuples a second the
default collects hundreds of times a second, each pass also promoting what
happens to be alive (queued tuples) toward full collections of the whole
heap, operator state included. Raising the first threshold lets the young
die between passes: measured on the paper's dataflow, 50-53K -> 60-67K
inputs/s (docs/results/throughput). Reference counting still frees
everything acyclic at once; cycles are collected, later.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator, Tuple

#: (young, middle, old) thresholds a node process runs with
DATA_PATH_THRESHOLDS: Tuple[int, int, int] = (50_000, 20, 100)


@contextlib.contextmanager
def data_path_gc(thresholds: Tuple[int, int, int] = DATA_PATH_THRESHOLDS) -> Iterator[None]:
    """Run the block with ``thresholds``; the process's own are restored after it."""
    before = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*before)
