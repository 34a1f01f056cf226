"""Stateless batch operators written as Arrow or pandas functions, as PySpark's
``mapInArrow``/``mapInPandas`` take them (DESIGN 5, 11).

The framework numbers every output from the input row that made it (DESIGN
4.1), so a function says which row each output row comes from:

- ``MapInPandas(fn)``: ``fn(df) -> DataFrame`` whose *index* holds, for each
  output row, the position of the input row it comes from. ``df`` arrives with
  the positions ``0..n-1`` as its index, so row-wise pandas keeps them by
  itself: a filter (``df[df.x > 0]``), new columns (``df.assign(...)``),
  ``df.explode(...)`` (one input row, several output rows, in order). The index
  must not decrease (one row's outputs together, in input order); it is not an
  output column.
- ``MapInArrow(fn)``: ``fn(batch) -> (rows, batch)``, ``rows`` the input row of
  each output (the ``process_arrow`` contract itself).

Both must give for a batch what they give for its rows one batch each, as every
operator on batches must (the deploy check runs them so).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np


class _StatelessBatch:
    """Base of the stateless batch operators: the snapshot is ``None``."""

    def get_state(self) -> None:
        return None

    def install_state(self, state: Any) -> None:
        if state is not None:
            raise ValueError(f"{type(self).__name__} is stateless, got state {state!r:.80}")


class MapInPandas(_StatelessBatch):
    """``fn(DataFrame) -> DataFrame`` over each batch; the output's index names each
    output row's input row (see the module's docstring)."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn

    def process_arrow(self, batch: Any) -> tuple:
        import pandas as pd
        import pyarrow as pa

        frame = batch.to_pandas()
        frame.index = pd.RangeIndex(batch.num_rows)
        out = self.fn(frame)
        if not isinstance(out, pd.DataFrame):
            raise TypeError(f"the function must return a pandas DataFrame, got "
                            f"{type(out).__name__}")
        rows = np.asarray(out.index)
        if rows.dtype.kind not in "iu":
            raise TypeError(f"the output's index must hold input row positions (ints), "
                            f"got {rows.dtype}: keep the index pandas gave the input")
        return rows.astype(np.int64), pa.RecordBatch.from_pandas(out, preserve_index=False)


class MapInArrow(_StatelessBatch):
    """``fn(RecordBatch) -> (rows, RecordBatch)`` over each batch."""

    def __init__(self, fn: Callable[[Any], tuple]):
        self.fn = fn

    def process_arrow(self, batch: Any) -> tuple:
        return self.fn(batch)
