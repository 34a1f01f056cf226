"""The failure-free output of a dataflow, computed in one process (DESIGN 8).

This is the oracle of failure transparency: the partitioned operators run
without replication, with the same partitioner and the same SN rules as
the real thing (DESIGN 4.1), and the output of a run with failures must
equal it tuple for tuple.

Each input is pushed depth-first through the stages, so every partition of
every stage sees its inputs in SN order, and the final outputs come out in
SN order. Records are passed as Python objects (no msgpack between stages):
compare with a runtime's output through ``flux.operator.wire_form``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from exchange.partitioner import HashPartitioner
from flux.operator import OperatorChain, OperatorRaised
from flux.sequence import SN, input_sn, output_sn

if TYPE_CHECKING:
    from flux.dataflow import Dataflow


class ReferenceRun:
    """A dataflow run without replication that can be extended one input at a time.

    ``chains[s][p]`` is the operator chain of partition ``p`` of stage ``s``
    (0-based), so tests can compare operator states with ``get_state()``.
    """

    def __init__(self, dataflow: Dataflow, partitions: int):
        self.dataflow = dataflow
        self.partitioner = HashPartitioner(partitions)
        self.chains: list[list[OperatorChain]] = [
            [stage.build_chain() for _ in range(partitions)] for stage in dataflow.stages
        ]
        #: Number of inputs fed so far; the next input gets ISN (fed + 1,).
        self.fed = 0

    def feed(self, record: Any) -> list[tuple[SN, Any]]:
        """Push the next input through every stage; the final outputs it caused, in SN order."""
        self.fed += 1
        out: list[tuple[SN, Any]] = []
        self._push(0, input_sn(self.fed), record, out)
        return out

    def _push(self, s: int, sn: SN, record: Any, out: list) -> None:
        if s == len(self.chains):
            out.append((sn, record))
            return
        stage = self.dataflow.stages[s]
        partition = self.partitioner(stage.key(record))
        try:
            produced = self.chains[s][partition].process(record)
        except OperatorRaised as exc:
            exc.where = exc.where or f"stage {s + 1} ({stage.name!r}), partition {partition}"
            raise
        for k, next_record in enumerate(produced, 1):
            self._push(s + 1, output_sn(sn, k), next_record, out)


def reference_output(
    dataflow: Dataflow, inputs: Iterable[Any], partitions: int
) -> list[tuple[SN, Any]]:
    """Every final ``(sn, record)`` of a failure-free run over ``inputs``, in SN order."""
    run = ReferenceRun(dataflow, partitions)
    out: list[tuple[SN, Any]] = []
    for record in inputs:
        out.extend(run.feed(record))
    return out
