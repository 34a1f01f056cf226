"""``TransformWithStateInPandas``: a per-key handler with state, on Arrow batches, as
PySpark 4's ``groupBy(...).transformWithStateInPandas`` runs one (DESIGN 5, 11).

One rule shapes it (docs/design/batches.md, "Columns"): items are cut anywhere and a
restart may cut them elsewhere, so a batch must give what its rows give one at a
time, and every output is numbered from the input row that caused it (DESIGN 4.1).
Two ways to call the handler keep that rule:

- ``calls="per row"`` (the default): ``handleInputRows`` gets one row at a time, in
  row order, and all it yields belongs to that row. Any processor written for PySpark
  runs unchanged (its micro-batch is one row); one pandas call per row.
- ``calls="per key"``: one call per key and batch with all that key's rows, the rows
  keeping their positions in the batch as their index; every output row's index must
  name the row it comes from (as ``MapInPandas``'s), and the handler must give what it
  would give one row at a time (a running count per row, not one count per call). The
  deploy check runs batches of uneven sizes against one-row batches and says so when
  a handler breaks it; an index not among the call's rows is refused at once.

The state is a ``KeyedState`` (the key: a tuple of the key columns' values; the value:
the key's named states), so catch-up moves it in parts and checkpoints take only the
changed keys (DESIGN 10).
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from flux.keyed_state import KeyedOperator, KeyedState
from flux.stateful_processor import (
    KeyStates,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    _plain,
)

PER_ROW, PER_KEY = "per row", "per key"


class TransformWithStateInPandas(KeyedOperator):
    """``processor`` (a ``StatefulProcessor``, or a function making one) per key of the
    ``key`` columns, its outputs in ``output_schema`` (a ``pyarrow.Schema``)."""

    def __init__(self, processor: Any, key: Any, output_schema: Any,
                 calls: str = PER_ROW, time_mode: str = "None"):
        import pyarrow as pa

        self.key: Tuple[str, ...] = (key,) if isinstance(key, str) else tuple(key)
        if not self.key or not all(isinstance(c, str) for c in self.key):
            raise ValueError(f"key must name columns (a str or a tuple of str), got {key!r}")
        if not isinstance(output_schema, pa.Schema):
            raise TypeError(f"output_schema must be a pyarrow.Schema, got "
                            f"{type(output_schema).__name__}")
        if calls not in (PER_ROW, PER_KEY):
            raise ValueError(f"calls is {PER_ROW!r} or {PER_KEY!r}, got {calls!r}")
        if time_mode != "None":
            raise NotImplementedError(f"time_mode {time_mode!r} is not supported yet: "
                                      f"timers need event time carried in band")
        self.output_schema, self.calls = output_schema, calls
        self.processor = processor() if not isinstance(processor, StatefulProcessor) \
            else processor
        if not isinstance(self.processor, StatefulProcessor):
            raise TypeError(f"processor must be a flux.StatefulProcessor (or make one), got "
                            f"{type(self.processor).__name__}")
        self.state = KeyedState()
        self._key_states = KeyStates()
        self._timers = TimerValues()
        handle = StatefulProcessorHandle(self._key_states)
        self.processor.init(handle)
        if not handle.declared:
            raise ValueError(f"{type(self.processor).__name__}.init declared no state: "
                             f"a stateless function is MapInPandas's")

    # -- the batch -----------------------------------------------------------------
    def process_arrow(self, batch: Any) -> tuple:
        import pyarrow as pa

        missing = [c for c in self.key if c not in batch.schema.names]
        if missing:
            raise KeyError(f"key columns {missing} are not in the batch's columns "
                           f"{batch.schema.names}")
        frame = batch.to_pandas()
        rows: List[np.ndarray] = []
        outputs: List[Any] = []
        for key, positions in self._groups(frame):
            self._key_states.load(self.state.get(key))
            if self.calls == PER_ROW:
                for p in positions:
                    self._call(key, frame.iloc[p:p + 1], rows, outputs, row=int(p))
            else:
                self._call(key, frame.iloc[positions], rows, outputs, row=None)
            if self._key_states.changed:
                stored = self._key_states.stored()
                if stored is None:
                    self.state.pop(key, None)
                else:
                    self.state[key] = stored
        if not outputs:
            return np.zeros(0, np.int64), pa.RecordBatch.from_pylist(
                [], schema=self.output_schema)
        return self._assemble(rows, outputs)

    def _groups(self, frame: Any) -> List[Tuple[tuple, np.ndarray]]:
        """(key, its rows' positions), keys in the order of their first row."""
        groups = frame.groupby(list(self.key), sort=False, dropna=False).indices
        out = []
        for k, positions in groups.items():
            key = tuple(_plain(v) for v in (k if isinstance(k, tuple) else (k,)))
            out.append((key, np.asarray(positions, np.int64)))
        out.sort(key=lambda kp: kp[1][0])
        return out

    def _call(self, key: tuple, rows_frame: Any, rows: List[np.ndarray],
              outputs: List[Any], row: Any) -> None:
        import pandas as pd

        yielded = self.processor.handleInputRows(key, iter([rows_frame]), self._timers)
        for out in yielded or ():
            if not isinstance(out, pd.DataFrame):
                raise TypeError(f"handleInputRows must yield pandas DataFrames, got "
                                f"{type(out).__name__}")
            if not len(out):
                continue
            if row is not None:
                made_by = np.full(len(out), row, np.int64)
            else:
                made_by = np.asarray(out.index)
                if made_by.dtype.kind not in "iu" or not np.isin(
                        made_by, rows_frame.index.to_numpy()).all():
                    raise ValueError(
                        f"with calls='per key' each output row's index names the input "
                        f"row it comes from (one of {list(rows_frame.index)[:8]}...); got "
                        f"{list(out.index)[:8]}: keep the rows' index, or use "
                        f"calls='per row'")
                made_by = made_by.astype(np.int64)
            rows.append(made_by)
            outputs.append(out)

    def _assemble(self, rows: Sequence[np.ndarray], outputs: Sequence[Any]) -> tuple:
        """The outputs in the order of the rows that made them (one row's in the order
        they were yielded), as one batch of ``output_schema``."""
        import pandas as pd
        import pyarrow as pa

        made_by = np.concatenate(rows)
        frame = pd.concat(outputs, ignore_index=True)
        try:
            batch = pa.RecordBatch.from_pandas(frame, schema=self.output_schema,
                                               preserve_index=False)
        except (KeyError, pa.ArrowException, TypeError, ValueError) as exc:
            raise ValueError(f"the handler's outputs do not fit output_schema "
                             f"{self.output_schema}: {exc}") from exc
        order = np.argsort(made_by, kind="stable")
        return made_by[order], batch.take(pa.array(order))
