"""The operator API (DESIGN 5) and the helpers that make state msgpack-safe.

An operator is any object with

- ``process(record) -> iterable of records``: non-blocking; the *order* of
  the outputs is part of the contract, because the framework numbers the
  k-th output of the input with SN ``s`` as ``s + (k,)`` (DESIGN 4.1);
- ``get_state()``: a msgpack-serializable snapshot, treated as immutable
  (it must not alias structures that ``process`` later mutates);
- ``install_state(state)``: replace the operator's state by one produced by
  ``get_state()`` and sent through msgpack (so tuples come back as lists);
- optional ``init_trans()`` / ``end_trans()`` quiesce hooks;
- optional ``process_batch(records) -> iterable of (index, output)``: the
  outputs of several records at once, for operators that can vectorize
 . ``index`` is the position in ``records`` of the record that
  produced ``output``; the pairs come in input order, and one record's
  outputs in the order ``process`` would emit them, so the SNs are those of
  the per-record API. It must give exactly what ``process`` called on each
  record in turn gives (checked when the dataflow is built).

Records and state cross the wire as msgpack: records may arrive as lists
where they were emitted as tuples, so operators index records, never test
their type.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Protocol, Sequence, runtime_checkable

import msgpack

from flux.errors import DataflowError, OperatorError  # noqa: F401 (raised by the chain)
from flux.keyed_state import (
    KeyedOperator,
    KeyedState,
    keyed_state_of,
    sorted_keys,
    tuplify,
)


@runtime_checkable
class Operator(Protocol):
    """What an operator writer implements (DESIGN 5); see the module's docstring.

    Optional quiesce hooks, called around a state movement (paper 3.3.1):
    ``init_trans()`` before the state is taken, ``end_trans()`` after. Operators
    whose output depends on time must read it from the records (event time),
    never from a clock (DESIGN 4.8)."""

    def process(self, record: Any) -> Iterable[Any]:
        """The outputs of ``record``, in a deterministic order (DESIGN 4.1)."""

    def get_state(self) -> Any:
        """A msgpack-serializable snapshot that ``process`` will not mutate later."""

    def install_state(self, state: Any) -> None:
        """Replace the state by one ``get_state`` made, after a msgpack round trip."""


REQUIRED_METHODS = ("process", "get_state", "install_state")


@runtime_checkable
class BatchOperator(Protocol):
    """The operator API for whole Arrow batches (DESIGN 5, 11), as PySpark's
    ``mapInArrow`` hands them: ``process_arrow(batch)`` gives ``(rows, outputs)``,
    ``outputs`` a ``pyarrow.RecordBatch`` of everything the batch's rows produce and
    ``rows[i]`` (int64, non-decreasing) the index in ``batch`` of the row that produced
    output row ``i``, one row's outputs in the order a per-record ``process`` would emit
    them, so outputs are numbered as record by record (DESIGN 4.1). No outputs: a
    zero-row batch. A batch must give exactly what its rows give fed one batch each
    (replicas and restarts may see other batch boundaries than the reference).
    ``get_state``/``install_state``: as ``Operator``'s."""

    def process_arrow(self, batch: Any) -> tuple:
        """The outputs of ``batch``'s rows and, per output, the row that produced it."""

    def get_state(self) -> Any:
        """A msgpack-serializable snapshot that ``process_arrow`` will not mutate later."""

    def install_state(self, state: Any) -> None:
        """Replace the state by one ``get_state`` made, after a msgpack round trip."""


BATCH_METHODS = ("process_arrow", "get_state", "install_state")


def is_batch_operator(op: Any) -> bool:
    """Does ``op`` take whole Arrow batches (``process_arrow``)?"""
    return isinstance(op, BatchOperator)


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class OperatorRaised(Exception):
    """Inside a chain: which operator raised (the segment adds where and on what)."""

    def __init__(self, op: Any, error: BaseException):
        super().__init__(f"operator {type(op).__name__} raised {describe(error)}")
        self.op, self.error = op, error
        self.where = ""  # the stage and partition, where the caller knows them
        #: the index of the record it raised on, among a batch's (None: a process_batch
        #: raised for its whole batch)
        self.row: Optional[int] = None


def check_operator_api(op: Any, name: str) -> None:
    """Reject ``op`` unless it has every method of the operator API (the record one, or
    the batch one when it has ``process_arrow``)."""
    methods = BATCH_METHODS if is_batch_operator(op) else REQUIRED_METHODS
    for method in methods:
        if not callable(getattr(op, method, None)):
            raise DataflowError(
                f"{name}: {type(op).__name__} object has no {method}() method; "
                f"an operator needs {', '.join(REQUIRED_METHODS)} (or, on Arrow batches, "
                f"{', '.join(BATCH_METHODS)})"
            )


# --- msgpack-safe state ---------------------------------------------------

def wire_form(value: Any) -> Any:
    """``value`` as it looks after a msgpack round trip (tuples become lists)."""
    return msgpack.unpackb(
        msgpack.packb(value, use_bin_type=True), raw=False, strict_map_key=False
    )


def keyed_state(table: dict) -> list:
    """A dict as a sorted list of ``[key, value]`` pairs.

    msgpack refuses tuple map keys, and a rebuilt dict may iterate in another
    order (DESIGN 4.1), so keyed state travels as pairs in key order. Keys of
    mixed types that Python cannot compare are ordered by their msgpack bytes.
    """
    return [[key, table[key]] for key in sorted_keys(table)]


def keyed_table(pairs: Iterable | None) -> dict:
    """The dict of a ``keyed_state`` list that crossed msgpack (list keys become tuples)."""
    return {tuplify(key): value for key, value in (pairs or ())}


# --- stateless helpers ----------------------------------------------------

class _Stateless:
    """Base of the helpers that keep no state: the snapshot is ``None``."""

    def get_state(self) -> None:
        return None

    def install_state(self, state: Any) -> None:
        if state is not None:
            raise DataflowError(f"{type(self).__name__} is stateless, got state {state!r}")


class Map(_Stateless):
    """One output per input: ``fn(record)``."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn

    def process(self, record: Any) -> list:
        return [self.fn(record)]


class Filter(_Stateless):
    """The input itself when ``pred(record)`` holds, nothing otherwise."""

    def __init__(self, pred: Callable[[Any], bool]):
        self.pred = pred

    def process(self, record: Any) -> list:
        return [record] if self.pred(record) else []


class FlatMap(_Stateless):
    """Every record of ``fn(record)``, in the order ``fn`` yields them."""

    def __init__(self, fn: Callable[[Any], Iterable[Any]]):
        self.fn = fn

    def process(self, record: Any) -> list:
        return list(self.fn(record))


# --- keyed aggregate ------------------------------------------------------

def _emit_key_and_value(key: Any, value: Any, record: Any) -> list:
    return [(key, value)]


_ABSENT = object()


class KeyedAggregate(KeyedOperator):
    """A per-key fold whose state the library extracts itself.

    For each record: ``k = key(record)``, ``value = fold(old, record)`` where
    ``old`` is the key's value or ``initial`` (called if callable, so each key
    gets a fresh one), then the outputs are ``emit(k, value, record)``
    (default: ``[(k, value)]``).

    Values must be msgpack-safe and treated as immutable (fold returns a new
    value); after ``install_state`` they come back with lists where tuples
    were. Output order must not depend on dict iteration order: ``emit``
    sees one key, never the whole table. List keys are turned into tuples.
    The values live in ``self.state``, a ``KeyedState``.
    """

    def __init__(
        self,
        key: Callable[[Any], Any],
        fold: Callable[[Any, Any], Any],
        initial: Any = None,
        emit: Callable[[Any, Any, Any], Iterable[Any]] | None = None,
    ):
        self.key = key
        self.fold = fold
        self.initial = initial
        self.emit = emit or _emit_key_and_value
        self.state = KeyedState()

    def process(self, record: Any) -> list:
        k = tuplify(self.key(record))
        state = self.state
        old = state.get(k, _ABSENT)
        if old is _ABSENT:
            old = self.initial() if callable(self.initial) else self.initial
        value = state[k] = self.fold(old, record)
        return list(self.emit(k, value, record))



# --- chains ---------------------------------------------------------------

def _whole_store(op: Any):
    store = keyed_state_of(op)
    cls = type(op)
    if store is None or cls.get_state is not KeyedOperator.get_state or (
            cls.install_state is not KeyedOperator.install_state):
        return None  # no store, or state beyond it: moved whole
    return store


def _apply_batch(op: Any, records: list) -> list:
    """``op``'s outputs for ``records`` as ``(index, output)`` pairs in input order: its
    ``process_batch`` if it has one, else ``process`` record by record."""
    batch = getattr(op, "process_batch", None)
    if batch is None:
        pairs = []
        for i, record in enumerate(records):
            try:
                outs = _apply(op, record)
            except OperatorRaised as raised:
                raised.row = i  # which record: the error names its SN
                raise
            pairs.extend((i, out) for out in outs)
        return pairs
    try:
        pairs = list(batch(records))
    except DataflowError:
        raise
    except Exception as exc:
        raise OperatorRaised(op, exc) from exc
    last = 0
    for pair in pairs:  # the SNs depend on it: refuse what would misnumber them
        if not (isinstance(pair, tuple) and len(pair) == 2 and type(pair[0]) is int
                and last <= pair[0] < len(records)):
            raise OperatorRaised(op, ValueError(
                f"process_batch must return (index, output) pairs with indices in input "
                f"order, within 0..{len(records) - 1}; got {pair!r:.80}"))
        last = pair[0]
    return pairs


def _apply_each(op: Any, records: list) -> list:
    """``op``'s outputs per record, as lists; the index of a record it raised on goes
    with the error (``OperatorRaised.row``)."""
    out: list = []
    append, process = out.append, op.process
    try:
        for record in records:
            append(list(process(record)))
    except DataflowError:
        raise  # the library's own checks (e.g. a state round trip), not user code
    except Exception as exc:
        raised = OperatorRaised(op, exc)
        raised.row = len(out)
        raise raised from exc
    return out


def _apply(op: Any, record: Any) -> list:
    """``op``'s outputs for ``record``; what user code raises comes out as ``OperatorRaised``."""
    try:
        return list(op.process(record))
    except DataflowError:
        raise  # the library's own checks (e.g. a state round trip), not user code
    except Exception as exc:
        raise OperatorRaised(op, exc) from exc


def _checked_rows(op: Any, produced: Any, batch: Any, size: int) -> tuple:
    """What ``process_arrow`` returned, refused unless it numbers its outputs right: the
    SNs depend on it (DESIGN 4.1). A ``pyarrow.Table`` is taken as one batch."""
    import numpy as np
    import pyarrow as pa

    def refuse(why: str) -> OperatorRaised:
        return OperatorRaised(op, ValueError(f"process_arrow must return (rows, RecordBatch), "
                                             f"rows non-decreasing in 0..{size - 1}: {why}"))

    if isinstance(batch, pa.Table):  # one batch of its rows
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else \
            pa.RecordBatch.from_pylist([], schema=batch.schema)
    if not isinstance(batch, pa.RecordBatch):
        raise refuse(f"outputs are a {type(batch).__name__}")
    rows = np.asarray(produced)
    if rows.ndim != 1 or len(rows) != batch.num_rows or (len(rows) and rows.dtype.kind not in "iu"):
        raise refuse(f"{batch.num_rows} outputs and rows of shape {rows.shape}, "
                     f"type {rows.dtype}")
    rows = rows.astype(np.int64, copy=False)
    if len(rows) and (rows[0] < 0 or rows[-1] >= size or (np.diff(rows) < 0).any()):
        raise refuse("a row out of order or out of range")
    return rows, batch


class OperatorChain:
    """The operators of one stage partition, run one after the other.

    Each output of operator i is fed to operator i+1 before the next output
    of operator i (depth-first), so the final outputs keep their order and
    their emission index k is well defined (DESIGN 4.1). An empty chain
    passes records through.
    """

    def __init__(self, operators: Sequence[Any]):
        self.operators = list(operators)
        self._batched = any(hasattr(op, "process_batch") for op in self.operators)
        #: its operators take whole Arrow batches (a stage's are all of one kind)
        self.columnar = bool(self.operators) and all(map(is_batch_operator, self.operators))

    def process_arrow(self, batch: Any) -> tuple:
        """A columnar chain's outputs for ``batch`` and, per output, the row of ``batch``
        that caused it (the rows compose from operator to operator)."""
        rows = None
        for op in self.operators:
            size = batch.num_rows
            try:
                produced, batch = op.process_arrow(batch)
            except DataflowError:
                raise
            except Exception as exc:
                raise OperatorRaised(op, exc) from exc
            produced, batch = _checked_rows(op, produced, batch, size)
            rows = produced if rows is None else rows[produced]
        return rows, batch

    def process(self, record: Any) -> list:
        """The outputs of ``record``; an operator that raises is named in ``OperatorRaised``."""
        if len(self.operators) == 1:  # the common case, without the recursion
            return _apply(self.operators[0], record)
        out: list = []
        self._run(0, record, out)
        return out

    def process_many(self, records: list) -> list:
        """Per record of ``records``, its outputs (what ``process`` would give each in
        turn). Each operator takes the whole batch, through its ``process_batch`` when it
        has one: every operator still sees the same inputs in the same order, so the
        outputs are the same as record by record."""
        ops = self.operators
        if len(ops) == 1 and not self._batched:  # the common case: one process(record)
            return _apply_each(ops[0], records)
        pairs = [(i, record) for i, record in enumerate(records)]
        for op in ops:
            try:
                done = _apply_batch(op, [record for _, record in pairs])
            except OperatorRaised as raised:
                if raised.row is not None:  # an index among this operator's inputs
                    raised.row = pairs[raised.row][0]
                raise
            pairs = [(pairs[j][0], out) for j, out in done]
        outs: list = [[] for _ in records]
        for i, out in pairs:
            outs[i].append(out)
        return outs

    def batched(self) -> bool:
        """Has any operator of the chain a ``process_batch``? (asked once per run of inputs)"""
        return self._batched

    def _run(self, i: int, record: Any, out: list) -> None:
        if i == len(self.operators):
            out.append(record)
            return
        for produced in _apply(self.operators[i], record):
            self._run(i + 1, produced, out)

    def get_state(self, skip: Iterable[int] = ()) -> list:
        """Every operator's state; ``None`` for the operators whose index is in ``skip``
        (their keyed state moves in pieces, two-phase catch-up)."""
        skip = set(skip)
        return [None if i in skip else op.get_state() for i, op in enumerate(self.operators)]

    def install_state(self, states: Sequence[Any], skip: Iterable[int] = ()) -> None:
        """Install ``get_state(skip)``; the operators in ``skip`` are left as they are."""
        if len(states) != len(self.operators):
            raise DataflowError(
                f"chain of {len(self.operators)} operators got {len(states)} states"
            )
        skip = set(skip)
        for i, (op, state) in enumerate(zip(self.operators, states)):
            if i not in skip:
                op.install_state(state)

    def keyed_stores(self) -> list:
        """Per operator, the ``KeyedState`` that is its whole state (``KeyedOperator``'s own
        ``get_state``/``install_state``), or None: such a store can move as a snapshot
        plus the changes since it (two-phase catch-up); any other state moves whole."""
        return [_whole_store(op) for op in self.operators]

    def init_trans(self) -> None:
        self._call_hook("init_trans")

    def end_trans(self) -> None:
        self._call_hook("end_trans")

    def _call_hook(self, hook: str) -> None:
        for op in self.operators:
            method = getattr(op, hook, None)
            if callable(method):
                method()
