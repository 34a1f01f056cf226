"""Key groups: which partition owns which groups, and what a rescale reads (DESIGN 13).

Partition ``p`` of ``n`` owns the contiguous range of key groups ``g`` with
``g * n // G == p`` (``exchange.partitioner``). From ``n`` partitions to ``m``, a new
partition's range overlaps a few old ones (about ``n / m + 1``): a restore reads only
those partitions' snapshots, not every one.

Pure: no I/O.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from exchange.group_map import GroupMap
from exchange.partitioner import group_owner, owned_groups


def sources(partition: int, partitions: int, old_partitions: int, key_groups: int) -> List[int]:
    """The old partitions (of ``old_partitions``) that own a key group that
    ``partition`` of ``partitions`` owns, in order."""
    groups = owned_groups(partition, partitions, key_groups)
    if not groups:
        return []
    return list(range(group_owner(groups[0], key_groups, old_partitions),
                      group_owner(groups[-1], key_groups, old_partitions) + 1))


def plan(partitions: int, old_partitions: int, key_groups: int) -> List[List[int]]:
    """Per new partition, the old partitions its state is read from (``sources``)."""
    return [sources(p, partitions, old_partitions, key_groups) for p in range(partitions)]


# -- maps in a checkpoint's manifest (live moves, DESIGN 13) ----------------------------

def groups_to_manifest(before: Dict[int, GroupMap], after: Dict[int, GroupMap]) -> dict:
    """What a checkpoint's manifest says of its key groups (JSON: a stage is a string, a
    map the owner of each group): ``groups``, the stages routed after its cut by a map
    other than contiguous ranges; ``groups_before``, the stages whose map its cut's
    moves changed, as its snapshots hold them (absent: none moved)."""
    out = {}
    moved = {str(s): m.owners.tolist() for s, m in sorted(before.items()) if m != after.get(s)}
    routed = {str(s): m.owners.tolist() for s, m in sorted(after.items())
              if m != GroupMap.even(m.partitions, len(m.owners))}
    if routed:
        out["groups"] = routed
    if moved:
        out["groups_before"] = moved
    return out


def manifest_maps(manifest: dict) -> Tuple[Dict[int, GroupMap], Dict[int, GroupMap]]:
    """A checkpoint's maps: the groups its snapshots hold (before its cut's moves) and the
    groups the job routes by after its cut, for every stage; contiguous ranges where the
    manifest names none (and for every stage of a checkpoint before key groups moved)."""
    partitions, groups = manifest["partitions"], manifest.get("key_groups")
    stages = manifest["stages"]
    if groups is None:
        return {}, {}
    after = {s: GroupMap.even(partitions, groups) for s in range(1, stages + 1)}
    for s, owners in manifest.get("groups", {}).items():
        after[int(s)] = GroupMap(np.asarray(owners, dtype=np.int64), partitions)
    before = dict(after)
    for s, owners in manifest.get("groups_before", {}).items():
        before[int(s)] = GroupMap(np.asarray(owners, dtype=np.int64), partitions)
    return before, after


def restore_maps(manifest: dict, partitions: int) -> Dict[int, Tuple[GroupMap, GroupMap]]:
    """Per stage, the groups each old partition's snapshots hold and the groups each
    partition of the restarted job owns: the manifest's map after its cut's moves at its
    own count, contiguous ranges at another (a rescale from a checkpoint)."""
    before, after = manifest_maps(manifest)
    if partitions != manifest["partitions"]:
        groups = manifest["key_groups"]
        after = {s: GroupMap.even(partitions, groups) for s in before}
    return {s: (before[s], after[s]) for s in before}


def map_sources(partition: int, before: GroupMap, after: GroupMap) -> List[int]:
    """The old partitions holding a key group ``partition`` owns ``after``, in order."""
    return sorted({int(q) for q in before.owner(np.asarray(after.groups_of(partition),
                                                           dtype=np.int64))})
