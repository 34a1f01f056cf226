"""An item's rows in buffers' and merges' states, of either form (DESIGN 11): ``Rows``
or ``exchange.columns.ArrowRows``, told apart by what stands in place of the records.
"""
from __future__ import annotations

from typing import Any, Sequence

from exchange.rows import NumberedRows, Rows


def rows_to_state(rows: NumberedRows) -> list:
    """Msgpack-safe form of an item's rows, of either form (buffers' and merges' states)."""
    return rows.to_state()


def rows_from_state(state: Sequence[Any]) -> NumberedRows:
    """The rows ``rows_to_state`` gave: Arrow IPC bytes in place of a record list are a
    columnar item's (``exchange.columns``, imported only where one is met)."""
    if len(state) == 4 and isinstance(state[3], (bytes, bytearray, memoryview)):
        from exchange.columns import ArrowRows  # pyarrow only where a columnar item is
        return ArrowRows.from_state(state)
    return Rows.from_state(state)
