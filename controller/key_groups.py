"""Key groups: which partition owns which groups, and what a rescale reads (DESIGN 13).

Partition ``p`` of ``n`` owns the contiguous range of key groups ``g`` with
``g * n // G == p`` (``exchange.partitioner``). From ``n`` partitions to ``m``, a new
partition's range overlaps a few old ones (about ``n / m + 1``): a restore reads only
those partitions' snapshots, not every one.

Pure: no I/O.
"""
from __future__ import annotations

from typing import List

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
