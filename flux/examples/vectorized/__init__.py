"""The paper's two operators on whole Arrow batches, for the columnar data plane (DESIGN 11).

A batch operator takes a whole batch as a ``pyarrow.RecordBatch``, as PySpark's
``mapInArrow`` hands it, and must give exactly what its per-record twin gives
fed the rows one by one: the same outputs in the same order (they are numbered
from the input's SN, DESIGN 4.1) and, after every batch, the same
``get_state()``, so a replica can catch up from either kind (DESIGN 5).
``VectorizedSessions`` is ``SessionReconstruction``'s twin, ``VectorizedStats``
``WindowedDurationStats``'s.

Columns, by name (others are ignored):

- packets, into ``VectorizedSessions``: ``src``, ``dst`` (the key: integers or
  strings), ``app`` (string), ``kind`` (string, "start" or "end"), ``ts``
  (integer event time);
- sessions, out of it and into ``VectorizedStats``: ``app`` (string), ``src``
  (as it came in), ``duration``, ``ts_end`` (int64);
- stats, out of ``VectorizedStats``: ``app`` (string), ``src``,
  ``max_duration`` (int64), ``avg_duration`` (float64), ``newest`` (int64).

A key that repeats inside a batch keeps its sequential meaning without a loop
over rows: the rows are sorted by ``(key, row)``, so a key's rows are contiguous
and in input order, and each row reads what the row before it of its key did (a
group-wise shift) or, for the key's first row, the state. Sessions need nothing
more. A stats window at a row is the key's entries not cut yet: an entry stays
from its row up to the first later row whose ``newest - window`` reaches it, a
range of rows, so window sums are difference arrays and window maxima a stabbing
query over ranges (``_stab_max``); event time out of order within a key is
exact the same way. Expiry (``flux.expiry``) is replayed with running maxima,
one loop step per sweep, none per row.

The state is columnar (``tables.KeyTable``): a key is two int64s (a column's
integers, or codes of its strings), found by one gather when the keys fill a
small rectangle (``_Box``: the paper's ids) and by a vectorized hash table
otherwise (``_PairMap``), and a key's slot indexes numpy columns; the stats'
windows are segments of two flat arrays (``_Entries``). Each operator's table is
its ``self.state`` and a ``flux.KeyedStore`` (``store.SlotStore``) with the
per-record twin's wire form, so the runtime moves it in a catch-up's two phases
and checkpoints only the keys changed (DESIGN 10); while it records changes, a
batch marks the slots it wrote in one numpy call. Python objects appear only
where the state is taken out or put in, and for a batch's distinct strings.

Exact within int64 (the per-record operators' Python ints have no bound): event
times, durations and a window's sum of durations must fit; an average is divided
in float64 while the sum is below 2**53 (then it is the correctly rounded
quotient, as Python's) and in Python above. A key column keeps one kind, ints or
strings, where a Python dict would take both. A batch with a bad row raises
before it changes the state, where the per-record operator would have processed
the rows before it.
"""
from __future__ import annotations

from flux.examples.vectorized.columns import (
    PACKET_SCHEMA,
    SESSION_SCHEMA,
    STATS_SCHEMA,
    ArrowOperator,
    run_chain,
    to_batch,
    to_records,
)
from flux.examples.vectorized.sessions import VectorizedSessions
from flux.examples.vectorized.stats import VectorizedStats

__all__ = ["PACKET_SCHEMA", "SESSION_SCHEMA", "STATS_SCHEMA", "ArrowOperator", "run_chain",
           "to_batch", "to_records", "VectorizedSessions", "VectorizedStats"]
