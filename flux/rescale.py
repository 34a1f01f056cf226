"""A checkpoint's operator states at another partition count (DESIGN 13).

A partition's keyed stores are split by key group: each pair goes to the new partition
that owns its key's group (``controller.key_groups``), so the state a new partition
starts from is exactly the one a failure-free run at the new count would hold after the
same inputs, as long as every key a stage's stores hold is that stage's partition key
(the contract of Flink's keyed state and of PySpark's ``transformWithStateInPandas``).
That is checked, not assumed: a key whose group the old partition did not own shows a
store keyed by something else, and the rescale is refused naming it; so is an operator
whose state is not a keyed store (it cannot be split). Entries of a partition, not of a
key (an expiry's watermark, ``flux.keys.PARTITION_WIDE``), take the smallest of those the
old partitions held; where key groups moved live at one count, each partition keeps its
own.

Pure: no I/O.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from exchange.group_map import GroupMap
from exchange.partitioner import KEY_GROUPS, HashPartitioner
from exchange.routing import column_hash, column_names
from flux.dataflow import Stage, factory_name
from flux.errors import RescaleRefused
from flux.keys import PARTITION_WIDE, sorted_keys, tuplify


def key_groups_of(stage: Stage, keys: Sequence[Any], key_groups: int) -> np.ndarray:
    """Each key's group, hashed as ``stage``'s router hashes its partition key: msgpack
    and CRC-32 for a key function, ``column_hash`` of the key columns (with the stage's
    schema's types where it has one) for column names."""
    columns = column_names(stage.key)
    if columns is None:
        group = HashPartitioner(1, key_groups).group
        return np.fromiter(map(group, keys), dtype=np.int64, count=len(keys))
    import pyarrow as pa

    values: List[list] = [[] for _ in columns]
    for key in keys:
        fields = key if isinstance(key, tuple) else (key,)
        if len(fields) != len(columns):
            raise RescaleRefused(f"stage {stage.name!r} is keyed by columns "
                                 f"{list(columns)}, and its state holds key {key!r}")
        for column, value in zip(values, fields):
            column.append(value)
    schema = stage.schema
    arrays = [pa.array(v, type=schema.field(c).type if schema is not None
                       and c in schema.names else None)
              for c, v in zip(columns, values)]
    batch = pa.RecordBatch.from_arrays(arrays, names=list(columns))
    return (column_hash(batch, columns) % np.uint64(key_groups)).astype(np.int64)


def rescaled_states(stage: Stage, keyed: Sequence[bool], old: Mapping[int, Sequence[Any]],
                    partition: int, before: GroupMap, after: GroupMap) -> List[Any]:
    """The operator states of partition ``partition`` of another partition count, from
    the states of the old partitions it draws keys from (``old[q]``: old partition
    ``q``'s operator states, as ``OperatorChain.get_state`` gives them, holding the key
    groups ``before`` gives ``q``); it gets the groups ``after`` gives it. ``keyed[i]``:
    is operator ``i``'s whole state a keyed store (``[[key, value], ...]``)?
    ``RescaleRefused`` for state that cannot be split."""
    for i, is_keyed in enumerate(keyed):
        held = [q for q, ops in old.items() if ops[i] is not None]
        if not is_keyed and held:
            raise _not_keyed(stage, i, f" (partition {held[0]} holds some)")
    return regrouped_states(stage, keyed, old, partition, before, after, rescaled=True)


def regrouped_states(stage: Stage, keyed: Sequence[bool], old: Mapping[int, Sequence[Any]],
                     partition: int, before: GroupMap, after: GroupMap,
                     rescaled: bool = False) -> List[Any]:
    """``rescaled_states`` at one partition count, where key groups moved between
    partitions (live moves, DESIGN 13): a state that is not keyed stays where it is, and
    so do entries of a partition rather than of a key (as a live move leaves them,
    ``flux.protocol.segment_moves``). ``rescaled``: ``rescaled_states``'s rule."""
    states: List[Any] = []
    for i, is_keyed in enumerate(keyed):
        if not is_keyed:
            states.append(old[partition][i] if partition in old else None)
            continue
        states.append(_split(stage, i, factory_name(stage.operators[i]),
                             {q: ops[i] or [] for q, ops in old.items()},
                             partition, after, before, after.key_groups,
                             None if rescaled else partition))
    return states


def _split(stage: Stage, index: int, name: str, old: Mapping[int, list], partition: int,
           new_map: GroupMap, old_map: GroupMap, key_groups: int,
           wide_from: Optional[int] = None) -> list:
    """The pairs of ``partition``'s key groups in ``new_map``, in key order, from the old
    partitions' (each holding its groups in ``old_map``): each old partition's are in
    key order already (a snapshot's), so one source needs no sort. Partition-wide
    entries: the smallest of the sources', or only ``wide_from``'s where given."""
    parts: List[list] = []
    widest: Dict[Any, Any] = {}  # partition-wide entries: the smallest value of each
    for q in sorted(old):
        keys = [k if type(k) is not list else tuplify(k) for k, _ in old[q]]
        values = [v for _, v in old[q]]
        wide = [i for i, k in enumerate(keys) if type(k) is tuple and k in PARTITION_WIDE]
        for i in reversed(wide):
            k, v = keys.pop(i), values.pop(i)
            if wide_from is not None and q != wide_from:
                continue
            if k not in widest or tuplify(v) < tuplify(widest[k]):
                widest[k] = v
        if not keys:
            continue
        groups = key_groups_of(stage, keys, key_groups)
        owners = old_map.owner(groups)
        wrong = np.flatnonzero(owners != q)
        if len(wrong):
            raise RescaleRefused(
                f"stage {stage.name!r} operator {index} ({name}) holds key "
                f"{keys[int(wrong[0])]!r} in partition {q}, and the stage's key routes it to "
                f"partition {int(owners[wrong[0]])}: its state is keyed by something other "
                f"than the stage's partition key, and cannot be split over another "
                f"partition count (restart with the same number of nodes)")
        mine = np.flatnonzero(new_map.owner(groups) == partition)
        parts.append([[keys[i], values[i]] for i in mine.tolist()])
    pairs = parts[0] if len(parts) == 1 else [p for part in parts for p in part]
    if len(parts) > 1 or widest:
        pairs += [[k, v] for k, v in widest.items()]
        order = {k: i for i, k in enumerate(sorted_keys([k for k, _ in pairs]))}
        pairs.sort(key=lambda pair: order[pair[0]])
    return pairs


def check_rescalable(dataflow, sample: Sequence[Any] = (),
                     key_groups: int = KEY_GROUPS, only: Optional[int] = None) -> None:
    """Refuse, before anything stops, a rescale of a dataflow with an operator whose state
    is not a keyed store (a fresh instance's state tells: None is stateless), or whose
    stores hold keys other than their stage's key on ``sample`` (the source's first
    records, run at 2 partitions and split over 3). A key of the real state can still be
    refused when the new partitions restore (``rescaled_states``). ``only``: that stage
    (1-based) alone, whose key groups move live."""
    for s, stage in enumerate(dataflow.stages, 1):
        if only is not None and s != only:
            continue
        chain = stage.build_chain()
        for i, (op, store) in enumerate(zip(chain.operators, chain.keyed_stores())):
            if store is None and op.get_state() is not None:
                raise _not_keyed(stage, i, "")
    if not sample:
        return
    from flux.reference import ReferenceRun

    run = ReferenceRun(dataflow, 2, key_groups=key_groups)
    for record in sample:
        run.feed(record)
    for s, stage in enumerate(dataflow.stages):
        if only is not None and s + 1 != only:
            continue
        keyed = [store is not None for store in stage.build_chain().keyed_stores()]
        old = {q: run.chains[s][q].get_state() for q in range(2)}
        for p in range(3):
            rescaled_states(stage, keyed, old, p, GroupMap.even(2, key_groups),
                            GroupMap.even(3, key_groups))


def _not_keyed(stage: Stage, index: int, where: str) -> RescaleRefused:
    return RescaleRefused(
        f"stage {stage.name!r} operator {index} ({factory_name(stage.operators[index])}) "
        f"keeps state that is not a keyed store{where}: it cannot be split over another "
        f"partition count; keep it in a KeyedState (KeyedOperator) keyed by the stage's "
        f"key, or restart with the same number of nodes")
