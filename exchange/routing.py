"""Routing an item's rows to the partitions of the next stage (DESIGN 4.1, 11).

A stage's key is either a function of a record (``Stage(key=fn)``: the stable
msgpack hash of ``exchange.partitioner``, record by record) or the names of
columns (``Stage(key=("src", "dst"))``: a stable hash of those columns,
computed over the whole batch at once). Either way every process routes a key
to the same partition. A router also puts the rows in the form the next stage
takes: columns of its ``schema`` for a stage of batch operators fed records.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from exchange.group_load import GroupLoad
from exchange.group_map import GroupMap, GroupMove, owner_changes
from exchange.partitioner import KEY_GROUPS, HashPartitioner, first_refused, group_owner
from exchange.rows import ColumnsError, NumberedRows


class RouteRefused(Exception):
    """Row ``row`` could not be put in the next stage's form or routed: ``error`` is what
    user code (the key, the records against the columns) raised; ``what`` names it."""

    def __init__(self, row: int, error: BaseException,
                 what: str = "the partition key of the next stage"):
        super().__init__(f"row {row}: {type(error).__name__}: {error}")
        self.row, self.error, self.what = row, error, what


def routed(router: Any, rows: NumberedRows, count: int,
           load: Optional[GroupLoad] = None) -> tuple:
    """``rows`` in the next stage's form, and per row its partition of ``count`` (None for
    one: no key asked). What the user's key or records refuse is a ``RouteRefused``
    naming the row: a segment and the ingress report it as the user's error. ``load``:
    counts the rows per key group (``exchange.group_load``)."""
    try:
        rows = router.prepare(rows)
        return rows, (None if count == 1 else router.partitions_of(rows, load))
    except ColumnsError as exc:  # records that do not fit the next stage's columns
        raise RouteRefused(exc.row or 0, exc, "the columns of the next stage") from exc
    except (KeyError, TypeError) as exc:  # key columns the item's batch cannot hash
        raise RouteRefused(0, exc, "the key columns of the next stage") from exc


def column_names(key: Any) -> Optional[tuple]:
    """The key's column names when it names columns (a str or a tuple/list of str), else
    None (a key function)."""
    if isinstance(key, str):
        return (key,)
    if isinstance(key, (tuple, list)) and key and all(isinstance(c, str) for c in key):
        return tuple(key)
    return None


class RecordRouter:
    """Partitions record by record, by ``route(record)`` (per-record records; the tuples
    of a columnar item's rows). ``key``, ``key_groups``: what ``route`` was made of: with
    them a whole item's groups are hashed record by record and looked up in one go (and
    counted), and a router of another group map can be made (``regrouped``)."""

    def __init__(self, route: Callable[[Any], int], partitions: int, schema: Any = None,
                 key: Any = None, key_groups: Optional[int] = None,
                 groups: Optional[GroupMap] = None):
        self.partitions = partitions
        self.schema = schema  # the next stage's columns, when it takes batches
        self.route = route
        self.key, self.key_groups = key, key_groups
        #: each group's partition where live moves changed them (None: contiguous ranges)
        self.groups = groups
        self._group_of = self._table = None
        if key is not None and key_groups is not None:
            partitioner = HashPartitioner(partitions, key_groups)
            self._group_of = partitioner.grouper(key)
            self._table = np.asarray(partitioner.owner_table(
                None if groups is None else groups.owners), dtype=np.int64)

    def regrouped(self, groups: GroupMap) -> "RecordRouter":
        """This router with each key group's partition from ``groups`` (a live move)."""
        if self.key is None or self.key_groups is None:
            raise ValueError("a router without key groups cannot follow a group map")
        route = HashPartitioner(self.partitions, self.key_groups).router(self.key,
                                                                          groups.owners)
        return RecordRouter(route, self.partitions, self.schema, self.key, self.key_groups,
                            groups)

    def prepare(self, rows: NumberedRows) -> NumberedRows:
        return _in_form(rows, self.schema)

    def group_of(self, record: Any) -> int:
        """``record``'s key group (a test's reference: where a live move sends it)."""
        if self._group_of is None:
            raise ValueError("a router without key groups")
        return self._group_of(record)

    def partitions_of(self, rows: NumberedRows, load: Optional[GroupLoad] = None) -> np.ndarray:
        records = rows.records
        try:
            if self._group_of is None:
                return np.fromiter(map(self.route, records), dtype=np.int64,
                                   count=len(records))
            groups = np.fromiter(map(self._group_of, records), dtype=np.int64,
                                 count=len(records))
        except Exception as exc:  # which record: routing is a pure function, ask again
            raise RouteRefused(first_refused(self.route, records), exc) from exc
        if load is not None:
            load.add(groups, self.key_groups)
        return self._table[groups]


class ColumnRouter:
    """A stable hash of key columns, over a whole batch at once (``column_hash``), through
    the key groups (``exchange.partitioner``)."""

    def __init__(self, columns: Sequence[str], partitions: int, schema: Any = None,
                 key_groups: Optional[int] = KEY_GROUPS, groups: Optional[GroupMap] = None):
        self.columns = tuple(columns)
        self.partitions = partitions
        self.schema = schema
        self.key_groups = key_groups
        #: each group's partition where live moves changed them (None: contiguous ranges)
        self.groups = groups

    def regrouped(self, groups: GroupMap) -> "ColumnRouter":
        """This router with each key group's partition from ``groups`` (a live move)."""
        if self.key_groups is None or groups.key_groups != self.key_groups:
            raise ValueError(f"a map of {groups.key_groups} key groups for a router of "
                             f"{self.key_groups}")
        return ColumnRouter(self.columns, self.partitions, self.schema, self.key_groups,
                            groups)

    def prepare(self, rows: NumberedRows) -> NumberedRows:
        return _in_form(rows, self.schema)

    def partitions_of(self, rows: NumberedRows, load: Optional[GroupLoad] = None) -> np.ndarray:
        batch = rows.batch
        if batch is None:
            raise TypeError(f"the key names columns {list(self.columns)}, and the rows "
                            f"are Python records, not Arrow columns (give the stage a "
                            f"schema)")
        hashes = column_hash(batch, self.columns)
        if self.key_groups is None:
            return (hashes % np.uint64(self.partitions)).astype(np.int64)
        groups = (hashes % np.uint64(self.key_groups)).astype(np.int64)
        if load is not None:
            load.add(groups, self.key_groups)
        if self.groups is not None:
            return self.groups.owner(groups)
        return group_owner(groups, self.key_groups, self.partitions)


class ToOne:
    """Everything to the one consumer (the last stage's egress)."""

    partitions = 1
    groups = None  # no key groups: nothing moves

    def prepare(self, rows: NumberedRows) -> NumberedRows:
        return rows

    def partitions_of(self, rows: NumberedRows, load: Optional[GroupLoad] = None) -> np.ndarray:
        return np.zeros(len(rows), dtype=np.int64)


def moved(router: Any, moves: Sequence[GroupMove]) -> Any:
    """``router`` after the live ``moves`` of its stage's key groups (none: itself; a
    prepare moves nothing)."""
    moves = owner_changes(moves)
    if not moves:
        return router
    if router.key_groups is None:
        raise ValueError("a live move of key groups, and the routing has none (a job "
                         "restored from a checkpoint written before key groups)")
    groups = router.groups or GroupMap.even(router.partitions, router.key_groups)
    return router.regrouped(groups.moved(moves))


def router_for(key: Any, partitions: int, schema: Any = None,
               key_groups: Optional[int] = KEY_GROUPS):
    """The router of a stage's ``key`` (a function or column names); ``schema``: the
    stage's input columns, when its operators take batches; ``key_groups``: how many
    (None: ``hash % partitions``, as before key groups)."""
    columns = column_names(key)
    if columns is not None:
        return ColumnRouter(columns, partitions, schema, key_groups)
    return RecordRouter(HashPartitioner(partitions, key_groups).router(key), partitions,
                        schema, key, key_groups)


def _in_form(rows: NumberedRows, schema: Any) -> NumberedRows:
    if schema is None:
        return rows
    from exchange.columns import ArrowRows  # pyarrow only where a stage takes batches
    return ArrowRows.of(rows, schema)


# -- a stable hash of columns ---------------------------------------------------------

_MIX = np.uint64(0x9E3779B97F4A7C15)
_NULL = np.uint64(0x5BD1E9955BD1E995)


def _finalize(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every input bit reaches every output bit."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def column_hash(batch: Any, columns: Sequence[str]) -> np.ndarray:
    """Per row of ``batch``, a uint64 hash of its values in ``columns``: the same in
    every process and run (no salted ``hash()``). Integers, booleans, floats, strings,
    binaries, dates and timestamps; a null hashes to a constant of its own."""
    import pyarrow as pa

    h = np.full(batch.num_rows, _MIX, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name in columns:
            if name not in batch.schema.names:
                raise KeyError(f"key column {name!r} is not among the columns "
                               f"{batch.schema.names}")
            column = batch.column(name)
            h = _finalize(h * _MIX + _values_hash(pa, name, column))
    return h


def _values_hash(pa, name: str, column) -> np.ndarray:
    kind = column.type
    if pa.types.is_dictionary(kind):
        column = column.dictionary_decode()
        kind = column.type
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_temporal(kind):
        out = _numbers(pa, column, pa.int64()).astype(np.int64, copy=False).view(np.uint64)
    elif pa.types.is_floating(kind):
        values = _numbers(pa, column, pa.float64()) + 0.0  # -0.0 and 0.0 are one key
        out = values.view(np.uint64)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
            pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        out = _bytes_hash(pa, column)
    else:
        raise TypeError(f"key column {name!r} of type {kind} cannot be hashed; key "
                        f"columns are integers, booleans, floats, strings, binaries, "
                        f"dates or timestamps")
    out = _finalize(out + _MIX)
    if column.null_count:
        nulls = column.is_null().to_numpy(zero_copy_only=False)
        out[nulls] = _NULL
    return out


def _numbers(pa, column, kind) -> np.ndarray:
    if column.type != kind:
        column = column.cast(kind)
    if column.null_count:
        column = column.fill_null(0)
    return column.to_numpy(zero_copy_only=False)


def _bytes_hash(pa, column) -> np.ndarray:
    """Strings by their distinct values: each distinct one hashed once (xxh64 of its
    UTF-8 bytes), the rows by a gather."""
    import xxhash

    encoded = column.dictionary_encode()
    dictionary = encoded.dictionary.to_pylist()
    digest = xxhash.xxh64_intdigest
    table = np.fromiter(
        (digest(v.encode() if isinstance(v, str) else v) for v in dictionary),
        dtype=np.uint64, count=len(dictionary))
    indices = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)
    if not len(table):
        return np.zeros(len(column), dtype=np.uint64)
    return table[indices]
