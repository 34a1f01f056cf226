"""The description of a linear partitioned dataflow, and its build-time checks.

A dataflow is a sequence of stages; in front of each stage a Flux
repartitions records on the stage's key. Operators are given as zero-arg
factories (a class, or a ``functools.partial`` of one) so every replica,
standby and check gets a fresh instance; keep keys and factories
module-level so they pickle to Spark executors.

Rejected when built (DESIGN 5): no stages, a key that is not callable, a
factory that does not give a fresh object with the operator API. Rejected
by ``check_state_round_trip`` (DESIGN 4.1): a state that msgpack cannot
carry or that ``install_state`` does not restore.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import msgpack

from flux.errors import DataflowError
from flux.operator import OperatorChain, _apply, _apply_batch, check_operator_api, wire_form
from flux.reference import ReferenceRun


def factory_name(factory: Any) -> str:
    """A readable name for an operator factory (class, function or partial)."""
    inner = getattr(factory, "func", factory)
    return getattr(inner, "__qualname__", None) or repr(factory)


@dataclass(frozen=True)
class Stage:
    """One stage: its input partition key and the factories of its operator chain."""

    name: str
    key: Callable[[Any], Any]
    operators: tuple[Callable[[], Any], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.operators, list):
            object.__setattr__(self, "operators", tuple(self.operators))

    def build_chain(self) -> OperatorChain:
        """A chain of fresh operators, one per factory."""
        return OperatorChain([factory() for factory in self.operators])


class Dataflow:
    """A linear pipeline of stages, validated when built."""

    def __init__(self, stages: Sequence[Stage]):
        self.stages: tuple[Stage, ...] = tuple(stages)
        if not self.stages:
            raise DataflowError("a dataflow needs at least one stage")
        names = set()
        for stage in self.stages:
            _check_stage(stage)
            if stage.name in names:
                raise DataflowError(f"two stages are named {stage.name!r}")
            names.add(stage.name)

    def __len__(self) -> int:
        return len(self.stages)

    def __repr__(self) -> str:
        return f"Dataflow({[stage.name for stage in self.stages]})"


def _check_stage(stage: Any) -> None:
    if not isinstance(stage, Stage):
        raise DataflowError(f"expected a Stage, got {stage!r}")
    if not isinstance(stage.name, str) or not stage.name:
        raise DataflowError(f"stage name must be a non-empty str, got {stage.name!r}")
    if not callable(stage.key):
        raise DataflowError(f"stage {stage.name!r}: key {stage.key!r} is not callable")
    if not isinstance(stage.operators, tuple):
        raise DataflowError(
            f"stage {stage.name!r}: operators must be a tuple of factories, "
            f"got {stage.operators!r}"
        )
    for i, factory in enumerate(stage.operators):
        where = f"stage {stage.name!r} operator {i} ({factory_name(factory)})"
        if not callable(factory):
            raise DataflowError(f"{where}: factory {factory!r} is not callable")
        try:
            first, second = factory(), factory()
        except Exception as exc:
            raise DataflowError(f"{where}: factory failed: {exc!r}") from exc
        check_operator_api(first, where)
        if first is second:
            # Replicas of a pair must never share state (DESIGN 1).
            raise DataflowError(f"{where}: factory returns the same object twice")


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
        state = self._state_through_msgpack(original, "get_state()")
        self.copy = factory()
        try:
            self.copy.install_state(state)
        except Exception as exc:
            raise self._error(f"install_state() failed on its own state: {exc!r}") from exc
        self.check_same_state()

    def _error(self, what: str) -> DataflowError:
        return DataflowError(f"{self.where}: {what}")

    def _state_through_msgpack(self, op: Any, which: str) -> Any:
        state = op.get_state()
        try:
            data = msgpack.packb(state, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise self._error(
                f"{which} cannot be serialized by msgpack ({exc}): {state!r:.200}"
            ) from exc
        try:
            return msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:
            raise self._error(
                f"{which} does not decode from msgpack ({exc!r}); encode keyed "
                f"state as [key, value] pairs: {state!r:.200}"
            ) from exc

    def check_same_state(self) -> None:
        """The copy must report the state the original has."""
        expected = self._state_through_msgpack(self.original, "get_state()")
        got = self._state_through_msgpack(self.copy, "get_state() after install_state()")
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
    inputs = list(inputs)
    mid = len(inputs) // 2
    run = ReferenceRun(dataflow, partitions)
    for record in inputs[:mid]:
        run.feed(record)
    twins: list[_Twin] = []
    for s, stage in enumerate(dataflow.stages):
        for p, chain in enumerate(run.chains[s]):
            chain_twins = [
                _Twin(
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
    if not any(hasattr(factory(), "process_batch")
               for stage in dataflow.stages for factory in stage.operators):
        return  # nothing to compare
    batch = list(inputs)
    for stage in dataflow.stages:
        for i, factory in enumerate(stage.operators):
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
