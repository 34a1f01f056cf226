"""Stable hash partitioning (DESIGN 4.1).

Keys are hashed through their msgpack bytes with CRC-32, never Python's
salted ``hash()``, so every process (driver, executors, the simulator)
routes a key to the same partition. A key's hash picks one of ``key_groups``
*key groups*, and partition ``p`` of ``n`` owns the contiguous range of groups
``g`` with ``g * n // key_groups == p`` (DESIGN 13, Flink's assignment): state
keyed by groups can be split or merged when the partition count changes.
``key_groups=None`` is the routing of checkpoints written before key groups
(``hash % n``), kept so that they restore. Tuples and lists encode alike, so a
record's key routes the same before and after a trip through msgpack; keys
that compare equal but encode differently (``1`` and ``1.0``) do not.
"""
from __future__ import annotations

import zlib
from typing import Any, Callable, List, Optional, Sequence

import msgpack


class UnhashableKey(TypeError):
    """A partition key that msgpack cannot encode."""


#: key groups by default: at most this many partitions, and the unit a rescale moves
KEY_GROUPS = 256


def check_key_groups(key_groups: Optional[int], partitions: int) -> None:
    """``key_groups`` must be an int of at least ``partitions`` (a partition owns at least
    one group), or None (the routing from before key groups)."""
    if key_groups is None:
        return
    if not isinstance(key_groups, int) or isinstance(key_groups, bool) or \
            not partitions <= key_groups <= 1 << 15:
        raise ValueError(f"key_groups must be an int from the partition count "
                         f"({partitions}) to {1 << 15}, got {key_groups!r}")


def group_owner(groups, key_groups: Optional[int], partitions: int):
    """The partition of ``partitions`` that owns key group(s) ``groups`` (an int or an
    integer array); with ``key_groups=None`` the groups are hashes, taken ``% partitions``."""
    if key_groups is None:
        return groups % partitions
    return groups * partitions // key_groups


def owned_groups(partition: int, partitions: int, key_groups: int) -> range:
    """The contiguous range of key groups partition ``partition`` of ``partitions`` owns."""
    first = -(-partition * key_groups // partitions)
    last = -(-(partition + 1) * key_groups // partitions)
    return range(first, last)


class HashPartitioner:
    """Routes a key to one of ``partitions`` by a stable hash of its msgpack bytes, through
    its key group (``key_groups``; None: ``hash % partitions``, the routing before them).

    One ``Packer`` serves every call: ``msgpack.packb`` builds a packer per call, which
    cost routing 0.7 us a key against 0.3 us. A call packs under the GIL from
    start to end (built-in types only, no ``default`` hook), and a packer that raised is
    reset, so calls from several threads and after a refused key stay exact."""

    __slots__ = ("partitions", "key_groups", "_pack")

    def __init__(self, partitions: int, key_groups: Optional[int] = KEY_GROUPS):
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise ValueError(f"partitions must be a positive int, got {partitions!r}")
        check_key_groups(key_groups, partitions)
        self.partitions, self.key_groups = partitions, key_groups
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def group(self, key: Any) -> int:
        """``key``'s key group (its hash, when there are no key groups)."""
        try:
            data = self._pack(key)
        except (TypeError, ValueError, OverflowError) as exc:
            raise UnhashableKey(
                f"partition key {key!r} of type {type(key).__name__} cannot be "
                f"encoded with msgpack: {exc}"
            ) from None
        crc = zlib.crc32(data)
        return crc if self.key_groups is None else crc % self.key_groups

    def __call__(self, key: Any) -> int:
        return group_owner(self.group(key), self.key_groups, self.partitions)

    def grouper(self, key_of: Callable[[Any], Any]) -> Callable[[Any], int]:
        """``record -> key group`` of ``record``'s key (``key_of``), in one call (its hash
        without key groups)."""
        pack, crc32, groups, slow = self._pack, zlib.crc32, self.key_groups, self.group
        if groups is None:
            def hashed(record: Any) -> int:
                key = key_of(record)
                try:
                    data = pack(key)
                except (TypeError, ValueError, OverflowError):
                    return slow(key)  # the same error, worded in one place
                return crc32(data)
            return hashed

        def group(record: Any) -> int:
            key = key_of(record)
            try:
                data = pack(key)
            except (TypeError, ValueError, OverflowError):
                return slow(key)
            return crc32(data) % groups

        return group

    def owner_table(self, owners: Optional[Sequence[int]] = None) -> List[int]:
        """Each key group's partition: ``owners`` (where live moves changed them,
        ``exchange.group_map``), or the contiguous ranges."""
        groups, partitions = self.key_groups, self.partitions
        if groups is None:
            raise ValueError("a partitioner without key groups has no owner table")
        if owners is not None and len(owners) != groups:
            raise ValueError(f"a map of {len(owners)} key groups for a partitioner of "
                             f"{groups}")
        return [int(o) for o in owners] if owners is not None else \
            [g * partitions // groups for g in range(groups)]

    def router(self, key_of: Callable[[Any], Any],
               owners: Optional[Sequence[int]] = None) -> Callable[[Any], int]:
        """``record -> partition`` of ``record``'s key (``key_of``), in one call: a
        segment routes every output it emits (a call less per tuple). ``owners``: each
        group's partition, where live moves changed them (``exchange.group_map``)."""
        group, partitions = self.grouper(key_of), self.partitions
        if self.key_groups is None:
            if owners is not None:
                raise ValueError(f"a map of {len(owners)} key groups for a partitioner "
                                 f"of None")

            def route(record: Any) -> int:
                return group(record) % partitions
        else:  # each group's owner from a table: the contiguous ranges, or a moved map
            table = self.owner_table(owners)

            def route(record: Any) -> int:
                return table[group(record)]

        return route

    def __repr__(self) -> str:
        return f"HashPartitioner({self.partitions}, key_groups={self.key_groups})"


def first_refused(route: Callable[[Any], int], records: Sequence[Any]) -> int:
    """The index of the first record ``route`` raises on: a run is routed in one call,
    and when it raises, asking again record by record (routing is a pure function) names
    the record, for the error."""
    for i, record in enumerate(records):
        try:
            route(record)
        except Exception:
            return i
    raise ValueError("routing raised on the run, and on none of its records alone")
