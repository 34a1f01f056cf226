"""Checks a job runs on sample records before it deploys (DESIGN 4.1, 5).

``check_state_round_trip``: every operator's state must cross msgpack and be
restored by ``install_state`` exactly, or a replica rebuilt by catch-up or a
checkpoint would diverge from its twin. ``check_batch_api``: an operator's
``process_batch`` must give what ``process`` gives record by record, and an
operator on Arrow batches must give for a batch what its rows give one batch
each (items are cut anywhere, DESIGN 11). Both run
the dataflow as the failure-free reference does (``flux.reference``) and raise
``DataflowError`` naming the operator.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import msgpack

from flux.dataflow import Dataflow
from flux.errors import DataflowError
from flux.operator import OperatorChain, _apply, _apply_batch, is_batch_operator, wire_form
from flux.reference import ReferenceRun, input_records
from flux.state_codec import paused_gc


# --- state round trip (DESIGN 4.1) ----------------------------------------

class _Twin:
    """An operator and its copy rebuilt from msgpack'd state, run side by side.

    Only the original's outputs travel on; the copy's must be the same.
    The first operator of a chain gets its input as it would off the wire
    (through msgpack), later ones get what the previous operator emitted.
    """

    def __init__(self, where: str, factory: Callable[[], Any], original: Any, first: bool):
        self.where = where
        self.original = original
        self.first = first
        packed = self._packed_state(original, "get_state()")
        state = self._decoded(packed, original)
        self.copy = factory()
        try:
            self.copy.install_state(state)
        except Exception as exc:
            raise self._error(f"install_state() failed on its own state: {exc!r}") from exc
        self._check_copy_state(packed)

    def _error(self, what: str) -> DataflowError:
        return DataflowError(f"{self.where}: {what}")

    def _packed_state(self, op: Any, which: str) -> bytes:
        state = op.get_state()
        try:
            return msgpack.packb(state, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise self._error(
                f"{which} cannot be serialized by msgpack ({exc}): {state!r:.200}"
            ) from exc

    def _decoded(self, packed: bytes, op: Any) -> Any:
        try:
            return msgpack.unpackb(packed, raw=False, strict_map_key=False)
        except Exception as exc:
            raise self._error(
                f"get_state() does not decode from msgpack ({exc!r}); encode keyed "
                f"state as [key, value] pairs: {op.get_state()!r:.200}"
            ) from exc

    def check_same_state(self) -> None:
        """The original's state must still decode, and the copy must report the same."""
        packed = self._packed_state(self.original, "get_state()")
        self._decoded(packed, self.original)
        self._check_copy_state(packed)

    def _check_copy_state(self, expected_packed: bytes) -> None:
        """Equal bytes are equal states; only where they differ are both decoded and
        compared as objects (a map's keys may come in another order): a state of 100 MB
        is compared as bytes, not as millions of objects, so the check does not hold a
        job's start for minutes."""
        got_packed = self._packed_state(self.copy, "get_state() after install_state()")
        if got_packed == expected_packed:
            return
        got = self._decoded(got_packed, self.copy)
        expected = msgpack.unpackb(expected_packed, raw=False, strict_map_key=False)
        if got != expected:
            raise self._error(
                f"state does not round-trip: install_state() then get_state() gives "
                f"{got!r:.200}, expected {expected!r:.200}"
            )

    def process(self, record: Any) -> list:
        expected = list(self.original.process(record))
        if self.first:
            try:
                record = wire_form(record)
            except (TypeError, ValueError, OverflowError) as exc:
                raise self._error(f"input {record!r:.200} cannot cross msgpack: {exc}") from exc
        try:
            got = list(self.copy.process(record))
        except Exception as exc:
            raise self._error(
                f"copy rebuilt from msgpack'd state failed on {record!r:.200}: {exc!r}"
            ) from exc
        if _comparable(got) != _comparable(expected):
            raise self._error(
                f"copy rebuilt from msgpack'd state emits {got!r:.200} for "
                f"{record!r:.200}, the original emits {expected!r:.200}"
            )
        return expected


class _BatchTwin(_Twin):
    """``_Twin`` for an operator on Arrow batches: the copy gets each batch as it would
    off the wire (through Arrow IPC) and must give the same rows and outputs."""

    def process(self, record: Any) -> list:
        raise DataflowError(f"{self.where}: an operator on Arrow batches got a record")

    def process_arrow(self, batch: Any) -> tuple:
        from exchange.columns import from_ipc, to_ipc, to_records
        rows, out = self.original.process_arrow(batch)
        try:
            got_rows, got = self.copy.process_arrow(from_ipc(to_ipc(batch), batch.num_rows))
        except Exception as exc:
            raise self._error(f"copy rebuilt from msgpack'd state failed on a batch: "
                              f"{exc!r}") from exc
        expected = (list(map(int, rows)), _comparable(to_records(out)))
        if (list(map(int, got_rows)), _comparable(to_records(got))) != expected:
            raise self._error(f"copy rebuilt from msgpack'd state emits {to_records(got)!r:.200}"
                              f", the original emits {to_records(out)!r:.200}")
        return rows, out

    def get_state(self) -> Any:
        return self.original.get_state()

    def install_state(self, state: Any) -> None:
        raise DataflowError(f"{self.where}: a twin of the deploy check takes no state")


def _comparable(records: list) -> Any:
    """Records compared as they would cross the wire; as they are if msgpack cannot carry them."""
    try:
        return wire_form(records)
    except (TypeError, ValueError, OverflowError):
        return records


def check_state_round_trip(dataflow: Dataflow, inputs: Iterable[Any], partitions: int) -> None:
    """Check DESIGN 4.1's rule on ``inputs``; raise DataflowError naming the operator that breaks it.

    Runs the reference over the first half of ``inputs``; then, for every
    operator of every partition, sends ``get_state()`` through msgpack,
    installs it into a fresh instance from the same factory, and runs
    original and copy side by side on the rest: their outputs for each
    input (hence their (SN, record) outputs) and their final states must
    agree, after msgpack normalisation.
    """
    with paused_gc():  # big states are acyclic: collecting while they are copied costs 4x
        _run_twins(dataflow, list(inputs), partitions)


def _run_twins(dataflow: Dataflow, inputs: list, partitions: int) -> None:
    mid = len(inputs) // 2
    run = ReferenceRun(dataflow, partitions)
    for record in inputs[:mid]:
        run.feed(record)
    twins: list[_Twin] = []
    for s, stage in enumerate(dataflow.stages):
        for p, chain in enumerate(run.chains[s]):
            chain_twins = [
                (_BatchTwin if is_batch_operator(op) else _Twin)(
                    f"stage {stage.name!r} operator {i} ({type(op).__name__}) "
                    f"in partition {p}",
                    factory,
                    op,
                    first=(i == 0),
                )
                for i, (factory, op) in enumerate(zip(stage.operators, chain.operators))
            ]
            run.chains[s][p] = OperatorChain(chain_twins)
            twins.extend(chain_twins)
    for record in inputs[mid:]:
        run.feed(record)
    for twin in twins:
        twin.check_same_state()



def check_batch_api(dataflow: Dataflow, inputs: Iterable[Any]) -> None:
    """An operator with ``process_batch`` must give what ``process`` gives record by record
    (flux.operator): two fresh instances of it run side by side on the stage's inputs
    (``inputs`` through the operators before it, unpartitioned), one record by record, the
    other in batches of uneven sizes; their (index, output) pairs must agree as they cross
    the wire. Raises DataflowError naming the operator."""
    columnar = dataflow.columnar or (False,) * len(dataflow.stages)
    if not any(columnar) and not any(hasattr(factory(), "process_batch")
                                     for stage in dataflow.stages
                                     for factory in stage.operators):
        return  # nothing to compare
    batch = input_records(inputs)
    schema = None  # the columns of ``batch``, after a stage of batch operators
    for stage, takes_batches in zip(dataflow.stages, columnar):
        schema = stage.schema if stage.schema is not None else schema
        for i, factory in enumerate(stage.operators):
            if takes_batches:  # a stage holds operators of one kind
                batch, schema = _batch_pairs(stage, i, factory, batch, schema)
                continue
            schema = None
            single, batched = factory(), factory()
            pairs = [(n, out) for n, record in enumerate(batch) for out in _apply(single, record)]
            if hasattr(batched, "process_batch"):
                got, start, size = [], 0, 1
                while start < len(batch):
                    chunk = batch[start:start + size]
                    got += [(start + n, out) for n, out in _apply_batch(batched, chunk)]
                    start, size = start + len(chunk), size % 7 + 3
                if _comparable(got) != _comparable(pairs):
                    raise DataflowError(
                        f"stage {stage.name!r} operator {i} ({type(batched).__name__}): "
                        f"process_batch gives {got!r:.200}, process record by record gives "
                        f"{pairs!r:.200} (they must agree, with each output's input index)")
            batch = [out for _, out in pairs]


def _batch_pairs(stage: Any, i: int, factory: Callable[[], Any], records: list,
                 schema: Any) -> tuple:
    """An operator on Arrow batches must give for a batch what it gives for its rows fed
    one batch each (the reference feeds them so; the runtime's items are cut anywhere):
    one instance on one-row batches, another on batches of uneven sizes. Returns its
    outputs (as tuples) and their columns."""
    from exchange.columns import to_batch, to_records
    from flux.operator import OperatorChain, OperatorRaised

    where = f"stage {stage.name!r} operator {i}"
    single, batched = OperatorChain([factory()]), OperatorChain([factory()])
    columns = to_batch(records, schema)

    def run(chain: OperatorChain, sizes) -> tuple:
        pairs, start, out_schema = [], 0, None
        for size in sizes:
            chunk = columns.slice(start, size)
            try:
                rows, out = chain.process_arrow(chunk)
            except OperatorRaised as raised:
                raise DataflowError(f"{where} ({type(raised.op).__name__}): "
                                    f"{raised.error!r}") from raised.error
            pairs += [(start + int(r), rec) for r, rec in zip(rows, to_records(out))]
            start, out_schema = start + size, out.schema
        return pairs, out_schema

    one, out_schema = run(single, [1] * len(records))
    sizes, left, size = [], len(records), 1
    while left > 0:
        sizes.append(min(size, left))
        left, size = left - sizes[-1], size % 7 + 3
    many, _ = run(batched, sizes)
    if _comparable(one) != _comparable(many):
        raise DataflowError(
            f"{where} ({type(batched.operators[0]).__name__}): a batch gives {many!r:.200}, "
            f"its rows one batch each give {one!r:.200} (they must agree, with each "
            f"output's row)")
    return [record for _, record in one], out_schema
