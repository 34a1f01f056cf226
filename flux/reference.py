"""The failure-free output of a dataflow, computed in one process (DESIGN 8).

This is the oracle of failure transparency: the partitioned operators run
without replication, with the same partitioner and the same SN rules as
the real thing (DESIGN 4.1), and the output of a run with failures must
equal it tuple for tuple.

Each input is pushed depth-first through the stages, so every partition of
every stage sees its inputs in SN order, and the final outputs come out in
SN order. Records are passed as Python objects (no msgpack between stages):
compare with a runtime's output through ``flux.operator.wire_form``. A stage of
batch operators (DESIGN 11) gets each record alone, as a one-row Arrow batch,
and its outputs go on as one-row batches (a sink gets them as tuples), so the
reference is also the check that a batch gives what its rows give one by one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

import numpy as np

from exchange.partitioner import KEY_GROUPS
from exchange.routing import RecordRouter, router_for
from exchange.rows import NumberedRows, Rows, is_columnar
from flux.operator import OperatorChain, OperatorRaised
from flux.sequence import SN, input_sn, output_sn

if TYPE_CHECKING:
    from flux.dataflow import Dataflow


class ReferenceRun:
    """A dataflow run without replication that can be extended one input at a time.

    ``chains[s][p]`` is the operator chain of partition ``p`` of stage ``s``
    (0-based), so tests can compare operator states with ``get_state()``.
    """

    def __init__(self, dataflow: Dataflow, partitions: int,
                 watch: Optional[Callable[[int, SN, Any], None]] = None,
                 key_groups: Optional[int] = KEY_GROUPS, groups: bool = False):
        """``watch(stage, sn, record)``: told of every record a stage (0-based) takes in,
        in order (the determinism check compares what each stage made). ``key_groups``:
        the routing's (DESIGN 13). ``groups``: keep each output's last-stage key group
        too (``output_groups``: where a live move of the last stage sends it)."""
        self.dataflow = dataflow
        self.watch = watch
        self.routers = [router_for(stage.key, partitions, stage.schema, key_groups)
                        for stage in dataflow.stages]
        self.chains: list[list[OperatorChain]] = [
            [stage.build_chain() for _ in range(partitions)] for stage in dataflow.stages
        ]
        #: Number of inputs fed so far; the next input gets ISN (fed + 1,).
        self.fed = 0
        #: the last-stage partition of every output so far, in the order ``feed`` gave them
        self.output_partitions: list[int] = []
        #: with ``groups``: the last-stage key group of every output so far, likewise
        self.output_groups: Optional[list[int]] = [] if groups else None
        self._last_group = 0

    def feed(self, record: Any, number: Optional[int] = None) -> list[tuple[SN, Any]]:
        """Push the next input through every stage; the final outputs it caused, in SN order.
        A ``pyarrow.RecordBatch`` (a columnar source's) is as many inputs as its rows.
        ``number``: the input's SN where inputs are not numbered 1, 2, 3, ... (several
        ingresses number in epochs, DESIGN 12); a columnar record's rows from it on."""
        if number is not None:
            if number <= self.fed:
                raise ValueError(f"input {number} fed after input {self.fed}")
            self.fed = number - 1
        out: list[tuple[SN, Any]] = []
        if is_columnar(record):
            from exchange.columns import ArrowRows
            for i in range(record.num_rows):
                self.fed += 1
                sn = input_sn(self.fed)
                self._push(0, sn, ArrowRows(np.array([sn], dtype=np.int64),
                                            record.slice(i, 1)), out)
            return out
        self.fed += 1
        self._push(0, input_sn(self.fed), record, out)
        return out

    def _push(self, s: int, sn: SN, record: Any, out: list, came_from: int = 0) -> None:
        """``record``: a Python record, or one row of columns (``ArrowRows``) a stage of
        batch operators made; ``came_from``: the partition of stage ``s - 1`` it left."""
        if s == len(self.chains):
            out.append((sn, _record(record)))
            self.output_partitions.append(came_from)
            if self.output_groups is not None:  # (depth first: the last stage's input's)
                self.output_groups.append(self._last_group)
            return
        if self.watch is not None:
            self.watch(s, sn, _record(record))
        stage = self.dataflow.stages[s]
        router = self.routers[s]
        if isinstance(router, RecordRouter) and stage.schema is None:  # without numpy
            partition = router.route(_record(record))
        else:
            record = router.prepare(_one_row(sn, record))
            partition = int(router.partitions_of(record)[0])
        if self.output_groups is not None and s == len(self.chains) - 1:
            self._last_group = router.group_of(_record(record))
        chain = self.chains[s][partition]
        try:
            if chain.columnar:
                outputs = record.outputs(*chain.process_arrow(record.batch))
                produced = [outputs.sliced(k, k + 1) for k in range(len(outputs))]
            else:
                produced = chain.process(_record(record))
        except OperatorRaised as exc:
            exc.where = exc.where or f"stage {s + 1} ({stage.name!r}), partition {partition}"
            raise
        for k, next_record in enumerate(produced, 1):
            self._push(s + 1, output_sn(sn, k), next_record, out, partition)


def _record(record: Any) -> Any:
    """One row of columns as the tuple of its values; a record as itself."""
    return record.records[0] if isinstance(record, NumberedRows) else record


def _one_row(sn: SN, record: Any) -> NumberedRows:
    """A record as an item of one row (one of columns stays as it is)."""
    if isinstance(record, NumberedRows):
        return record
    return Rows(np.array([sn], dtype=np.int64), [record])


def input_records(inputs: Iterable[Any]) -> list:
    """The inputs one record each: a columnar source's batches as the tuples of their
    rows."""
    out: list = []
    for record in inputs:
        if is_columnar(record):
            from exchange.columns import to_records
            out.extend(to_records(record))
        else:
            out.append(record)
    return out


def reference_output(
    dataflow: Dataflow, inputs: Iterable[Any], partitions: int
) -> list[tuple[SN, Any]]:
    """Every final ``(sn, record)`` of a failure-free run over ``inputs``, in SN order."""
    run = ReferenceRun(dataflow, partitions)
    out: list[tuple[SN, Any]] = []
    for record in inputs:
        out.extend(run.feed(record))
    return out
