"""Which input an output came from, read again from the source (LOG.io's lineage).

An output's SN starts with the number of the input that caused it (DESIGN 4.1): input
``x`` is the ``x``-th the job took from its source, counted across restarts (a restart
numbers the inputs after its checkpoint's cut as they were numbered before). So the
input is found again by reading the source from a known position: the newest kept
checkpoint whose cut is before ``x`` (its manifest holds the source's position after the
cut) or, without one, the source's start; a source whose partitions interleave by
arrival (Kafka's) is read in the order the input log recorded, as a restart reads it
(DESIGN 10). What comes back is the input's number, where the source was just before it
(``source.open(position)`` reads it next), its source partition, and the record.

The source must be a fresh copy of the job's (the same files, topic, or sequence): the
job's own is being read by the job.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

from flux.connector_api import LOGGED, replay_order_of

SN = Tuple[int, ...]


@dataclass(frozen=True)
class Lineage:
    """Where output ``output`` came from."""

    output: SN
    input: int  # the input's number: its SN is ``(input,)``
    position: Any  # the source's position just before it (a batch's row: before its batch)
    partition: Any  # the source partition it came from (a Kafka partition), or None
    record: Any  # the input, as the source gives it (a batch's row: its values, a tuple)


def lineage(sn: Sequence[int], source: Any, checkpoint: Optional[str] = None,
            timeout: float = 30.0) -> Lineage:
    """The input output ``sn`` derives from, read again from ``source`` (a fresh copy of
    the job's). ``checkpoint``: the job's checkpoint location, to start at the newest
    kept checkpoint before the input (needed for a source whose order is logged, where
    it also replays that order); without it the source is read from its start, where
    the job began. ``LookupError`` when the input cannot be found again."""
    from flux.connectors.sources import replayable

    sn = tuple(int(v) for v in sn)
    if not sn or sn[0] < 1:
        raise ValueError(f"not an output's SN: {sn!r}")
    x = sn[0]
    readable = replayable(source)
    if readable is None:
        raise ValueError(f"lineage needs a source it can read again from a position (a "
                         f"flux.Source or a sequence), got {type(source).__name__}")
    logged = _declares_logged(readable)
    start, position, order = _starting_point(x, readable, checkpoint, logged)
    if position is not None:
        readable.open(position)
    if logged:
        readable.replay(order)
    return _read_to(x, sn, start, readable, logged, timeout)


def _declares_logged(source: Any) -> bool:
    from flux.errors import SourceOrderUnknown

    try:
        return replay_order_of(source) == LOGGED
    except SourceOrderUnknown:
        return False  # read by position: a restart would have needed more, not lineage


def _starting_point(x: int, source: Any, checkpoint: Optional[str], logged: bool):
    """``(inputs before the start, the position to open, the logged order from there)``."""
    if checkpoint is None:
        if logged:
            raise LookupError(f"input {x} came from a source whose partitions interleave by "
                              f"arrival: its order is in the job's input log, give "
                              f"checkpoint= (the job's checkpoint location)")
        return 0, None, []
    from flux.runtime.checkpoint_store import CheckpointStore
    from flux.runtime.input_log import InputLog

    store = CheckpointStore(checkpoint)
    before = [store.manifest(k) for k in store.complete_ids()]
    before = [m for m in before if m["cut"] < x]
    best = max(before, key=lambda m: m["cut"], default=None)
    cut = best["cut"] if best else 0
    if not logged:
        return cut, best["source"] if best else None, []
    if best is None:  # a Kafka consumer group's start moved on with the job
        raise LookupError(f"no kept checkpoint of {checkpoint} is before input {x}: where "
                          f"the source was then is not known any more")
    order = InputLog(store).read(after=cut)
    if cut + len(order) < x:
        raise LookupError(f"input {x} is not in the input log of {checkpoint} (it replays "
                          f"inputs {cut + 1} to {cut + len(order)}): it was never logged")
    return cut, best["source"], order[:x - cut]


def _read_to(x: int, sn: SN, start: int, source: Any, logged: bool,
             timeout: float) -> Lineage:
    from flux.connectors.sources import NOT_YET
    from exchange.rows import is_columnar

    n, deadline = start, time.monotonic() + timeout
    while True:
        position = source.position
        try:
            record = next(source)
        except StopIteration:
            raise LookupError(f"the source ends after input {n}: input {x} is not in it "
                              f"(is it a copy of the job's?)") from None
        if record is NOT_YET:
            if time.monotonic() > deadline:
                raise LookupError(f"input {x}: the source gave nothing more after input {n} "
                                  f"for {timeout} s")
            time.sleep(0.01)
            continue
        rows = record.num_rows if is_columnar(record) else 1
        if n + rows >= x:
            partition = source.last[0] if logged else None
            if is_columnar(record):
                from exchange.columns import to_records

                if logged:  # a batch of rows of several partitions (flux.PartitionedBatches)
                    partition = source.last_rows[x - n - 1][0]
                record = to_records(record.slice(x - n - 1, 1))[0]
            return Lineage(sn, x, position, partition, record)
        n += rows
