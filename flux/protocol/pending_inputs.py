"""The inputs the ingress accepted and has not cut into an item yet (DESIGN 11).

A source hands inputs over as records, or as Arrow record batches whose rows are
the inputs (a columnar source: no per-record work on the way in). An item is of
one kind: records become ``Rows``, batches ``ArrowRows`` (their rows numbered
in order), so a run of the other kind waits until the pending item is cut.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from exchange.rows import NumberedRows, Rows, is_columnar


class PendingInputs:
    """Records, or batches of inputs as columns, in the order accepted."""

    def __init__(self) -> None:
        self.records: List[Any] = []
        self.batches: List[Any] = []
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def takes(self, run: Any) -> bool:
        """May ``run`` join the pending inputs (nothing pending, or of its kind)?"""
        return not self.count or is_columnar(run) == bool(self.batches)

    def add(self, run: Any) -> None:
        if not self.takes(run):
            raise ValueError("an item holds records or batches of columns, not both")
        if is_columnar(run):
            self.batches.append(run)
        else:
            self.records.extend(run)
        self.count += len(run)

    def rows(self, first: int) -> NumberedRows:
        """The pending inputs as an item's rows, numbered from ``first``."""
        if not self.batches:
            return Rows.of_inputs(first, self.records)
        import pyarrow as pa

        from exchange.columns import ArrowRows
        batch = self.batches[0] if len(self.batches) == 1 else pa.concat_batches(self.batches)
        sns = np.arange(first, first + self.count, dtype=np.int64).reshape(-1, 1)
        return ArrowRows(sns, batch)

    def clear(self) -> None:
        self.records, self.batches, self.count = [], [], 0
