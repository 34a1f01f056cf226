"""Incremental checkpoint snapshots: a full one, then changes since (DESIGN 10).

A partition's snapshot at checkpoint ``k`` is either *full* (every operator's
state) or a *delta* over the snapshot the same replica wrote at checkpoint
``base``: the keyed stores' net changes since then (``KeyedState.changes``),
every other operator's state whole. A *chain* is a full snapshot and the
deltas that follow it, each over the one before; the state at the chain's
last checkpoint is the full one with the deltas applied in order. A replica
writes a full snapshot the first time it writes, every ``full_every``
snapshots, and whenever one of its writes may not have reached the store, so
chains stay short and never build on a file that is not there.

The forms (after ``unpack_state``)::

    full:  {"checkpoint": k, "operators": [state, ...]}
    delta: {"checkpoint": k, "base": b, "operators": [state or None, ...],
            "changes": [[operator index, {"set": [...], "deleted": [...]}], ...]}

Pure: no I/O.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from flux.keyed_state import KeyedState


class BrokenChain(ValueError):
    """Snapshots that do not make a chain (a delta missing, out of order, or over another
    replica's file): a checkpoint that cannot be restored."""


def full_snapshot(checkpoint: int, operators: list) -> dict:
    return {"checkpoint": checkpoint, "operators": operators}


def delta_snapshot(checkpoint: int, base: int, operators: list, changes: list) -> dict:
    """``operators``: the chain's states with ``None`` for the keyed ones, whose
    ``changes`` since the snapshot at ``base`` are ``[[index, delta], ...]``."""
    return {"checkpoint": checkpoint, "base": base, "operators": operators,
            "changes": changes}


def is_delta(snapshot: dict) -> bool:
    return "changes" in snapshot


def check(snapshots: Sequence[dict]) -> None:
    """A whole snapshot, then deltas, each over the one before: or ``BrokenChain``."""
    if not snapshots:
        raise BrokenChain("an empty chain of snapshots")
    first = snapshots[0]
    if is_delta(first):
        raise BrokenChain(f"the chain starts with a delta (checkpoint "
                          f"{first.get('checkpoint')}, over {first.get('base')})")
    previous: Optional[int] = first.get("checkpoint")
    for snap in snapshots[1:]:
        if not is_delta(snap):
            raise BrokenChain(f"a full snapshot (checkpoint {snap.get('checkpoint')}) "
                              f"inside a chain")
        if previous is not None and snap.get("base") != previous:
            raise BrokenChain(f"the delta of checkpoint {snap.get('checkpoint')} is over "
                              f"checkpoint {snap.get('base')}, the chain is at {previous}")
        if len(snap["operators"]) != len(first["operators"]):
            raise BrokenChain(f"a delta of {len(snap['operators'])} operators in a chain of "
                              f"{len(first['operators'])}")
        previous = snap.get("checkpoint")


def install(chain: Any, snapshots: Sequence[dict]) -> None:
    """Install a chain of snapshots into an operator chain (``OperatorChain``): the whole
    one, then each delta's changes applied to the keyed stores in place, the other
    operators' states installed whole: no second copy of a big state is built (a
    restart's restore; ``rebuild`` gives the same state as data)."""
    check(snapshots)
    chain.install_state(snapshots[0]["operators"])
    stores = chain.keyed_stores()
    for snap in snapshots[1:]:
        changed = {i: delta for i, delta in snap["changes"]}
        if any(not (0 <= i < len(stores)) or stores[i] is None for i in changed):
            raise BrokenChain(f"the delta of checkpoint {snap.get('checkpoint')} changes "
                              f"operators {sorted(changed)}, not all of them keyed")
        chain.install_state(snap["operators"], skip=changed.keys())
        for i, delta in changed.items():
            stores[i].apply_delta(delta)


def rebuild(snapshots: Sequence[dict]) -> List[Any]:
    """The operators' state at the last snapshot of a chain (full first, then deltas)."""
    check(snapshots)
    ops = list(snapshots[0]["operators"])
    stores: Dict[int, KeyedState] = {}  # operators whose deltas were applied so far
    for snap in snapshots[1:]:
        changed = {i: delta for i, delta in snap["changes"]}
        for i, state in enumerate(snap["operators"]):
            if i in changed:
                store = stores.get(i)
                if store is None:
                    store = stores[i] = KeyedState(ops[i])
                store.apply_delta(changed[i])
            else:
                ops[i] = state
                stores.pop(i, None)
    for i, store in stores.items():
        ops[i] = store.snapshot()
    return ops
