"""The description of a linear partitioned dataflow, and its build-time checks.

A dataflow is a sequence of stages; in front of each stage a Flux
repartitions records on the stage's key. Operators are given as zero-arg
factories (a class, or a ``functools.partial`` of one) so every replica,
standby and check gets a fresh instance; keep keys and factories
module-level so they pickle to Spark executors.

Rejected when built (DESIGN 5): no stages, a key that is not callable, a
factory that does not give a fresh object with the operator API. What
needs records to find out (a state that does not round-trip, a batch method
that disagrees with its record method) is checked at deploy
(``flux.deploy_checks``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence

from flux.errors import DataflowError
from exchange.routing import column_names
from flux.operator import OperatorChain, check_operator_api, is_batch_operator


#: inputs per item by default (DESIGN 11)
BATCH_ROWS = 16384
#: seconds an item not full waits for more inputs by default, and where a stage takes
#: Arrow batches
ITEM_DELAY = 0.005
ITEM_DELAY_COLUMNAR = 0.025


def factory_name(factory: Any) -> str:
    """A readable name for an operator factory (class, function or partial)."""
    inner = getattr(factory, "func", factory)
    return getattr(inner, "__qualname__", None) or repr(factory)


def operator_names(dataflow: "Dataflow") -> Dict[int, List[str]]:
    """Stage number (from 1) -> its operators' names, in the chain's order."""
    return {s: [factory_name(f) for f in stage.operators]
            for s, stage in enumerate(dataflow.stages, 1)}


@dataclass(frozen=True)
class Stage:
    """One stage: its input partition key and the factories of its operator chain.

    ``key``: a function of a record, or the names of columns (a str or a tuple of str)
    when the stage's input comes as Arrow columns. ``schema``: a ``pyarrow.Schema``, the
    columns a stage of batch operators (``process_arrow``) takes when its input comes
    as records (from the source or a stage of record operators); the records are
    tuples (or lists) of values in the schema's order (DESIGN 11)."""

    name: str
    key: Any
    operators: tuple[Callable[[], Any], ...] = ()
    schema: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.operators, list):
            object.__setattr__(self, "operators", tuple(self.operators))

    def build_chain(self) -> OperatorChain:
        """A chain of fresh operators, one per factory."""
        return OperatorChain([factory() for factory in self.operators])


class Dataflow:
    """A linear pipeline of stages, validated when built."""

    #: per stage: do its operators take whole Arrow batches? (set when built; a dataflow
    #: made without its checks reads as taking none)
    columnar: tuple = ()

    def __init__(self, stages: Sequence[Stage]):
        self.stages: tuple[Stage, ...] = tuple(stages)
        if not self.stages:
            raise DataflowError("a dataflow needs at least one stage")
        names = set()
        self.columnar = ()
        columns_in = False  # does the stage's input come as Arrow columns?
        for stage in self.stages:
            columnar = _check_stage(stage)
            if stage.name in names:
                raise DataflowError(f"two stages are named {stage.name!r}")
            names.add(stage.name)
            columns_in = stage.schema is not None or columns_in
            _check_columns(stage, columnar, columns_in)
            columns_in = columnar
            self.columnar += (columnar,)

    def __len__(self) -> int:
        return len(self.stages)

    def takes_batches(self) -> bool:
        """Does a stage's chain take whole Arrow batches (``process_arrow``)?"""
        return any(self.columnar)

    def default_batch_rows(self) -> int:
        """Inputs per item unless the job says (DESIGN 11). Each item costs every replica
        of every stage a fixed amount (a message per connection, numpy calls, an operator
        on Arrow batches ~0.5 ms a call), and a partition gets 1/n of it: the paper's
        dataflow on 4 nodes, fed as fast as taken, alternated runs, inputs/s: per-record
        operators 89K at 1024 rows, 125K at 4096, 135K at 8192, 144K at 16384 and 32768;
        operators on batches 239K at 8192, 307K at 16384, 300-330K above. The item delay
        keeps items small below full rate."""
        return BATCH_ROWS

    def default_item_delay(self) -> float:
        """Seconds an item waits for more inputs unless the job says (DESIGN 11): 5 ms,
        or 25 ms where operators on Arrow batches pay per batch (the vectorized paper
        dataflow at 20K inputs/s on 2 cores, median latency: 0.10 s at 5 ms, 64 ms at
        25 ms, 60 ms at 50 ms; per-record operators 37 ms at 5 ms)."""
        return ITEM_DELAY_COLUMNAR if self.takes_batches() else ITEM_DELAY

    def __repr__(self) -> str:
        return f"Dataflow({[stage.name for stage in self.stages]})"


def _check_columns(stage: Stage, columnar: bool, columns_in: bool) -> None:
    """A stage of batch operators, or keyed by columns, needs its input as columns: from
    a stage of batch operators before it, or its own ``schema`` (DESIGN 11)."""
    where = f"stage {stage.name!r}"
    if stage.schema is not None:
        import pyarrow as pa  # only where a dataflow has columns
        if not isinstance(stage.schema, pa.Schema):
            raise DataflowError(f"{where}: schema must be a pyarrow.Schema, "
                                f"got {stage.schema!r:.80}")
    if columnar and not columns_in:
        raise DataflowError(f"{where}: its operators take Arrow batches (process_arrow), "
                            f"and its input comes as records: give it schema=, the "
                            f"columns of its input records")
    columns = column_names(stage.key)
    if columns is not None:
        if not columns_in:
            raise DataflowError(f"{where}: key {stage.key!r} names columns, and its input "
                                f"comes as records: give it schema= (or key a function)")
        if stage.schema is not None:
            missing = [c for c in columns if c not in stage.schema.names]
            if missing:
                raise DataflowError(f"{where}: key columns {missing} are not in its schema "
                                    f"{stage.schema.names}")


def _check_grouping(stage: Stage, op: Any, where: str) -> None:
    """A per-key handler sees all of a key's rows only if the stage routes every row of
    a key to one partition: its key columns must be among the handler's (and they, and
    its event time, among the stage's columns where it names them)."""
    from flux.transform_with_state import TransformWithStateInPandas

    if not isinstance(op, TransformWithStateInPandas):
        return
    columns = column_names(stage.key)
    if columns is None or not set(columns) <= set(op.key):
        raise DataflowError(f"{where}: groups rows by {list(op.key)}, and the stage routes "
                            f"them by {stage.key!r}: give the stage key= some of "
                            f"{list(op.key)} (columns), so each key's rows meet in one "
                            f"partition")
    needed = op.key + ((op.event_time,) if op.event_time else ())
    if stage.schema is not None and not set(needed) <= set(stage.schema.names):
        raise DataflowError(f"{where}: columns {sorted(set(needed) - set(stage.schema.names))} "
                            f"are not in the stage's schema {stage.schema.names}")


def _check_stage(stage: Any) -> bool:
    """The stage's own checks; is it a stage of batch operators?"""
    if not isinstance(stage, Stage):
        raise DataflowError(f"expected a Stage, got {stage!r}")
    if not isinstance(stage.name, str) or not stage.name:
        raise DataflowError(f"stage name must be a non-empty str, got {stage.name!r}")
    if not callable(stage.key) and column_names(stage.key) is None:
        raise DataflowError(f"stage {stage.name!r}: key {stage.key!r} is neither callable "
                            f"nor column names")
    if not isinstance(stage.operators, tuple):
        raise DataflowError(
            f"stage {stage.name!r}: operators must be a tuple of factories, "
            f"got {stage.operators!r}"
        )
    kinds = set()
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
        kinds.add(is_batch_operator(first))
        _check_grouping(stage, first, where)
    if len(kinds) > 1:
        raise DataflowError(f"stage {stage.name!r} mixes operators on Arrow batches "
                            f"(process_arrow) with operators on records: give each kind "
                            f"a stage of its own")
    return kinds == {True}
