"""What a replica digests at a cut, so its twin's can be compared with it (DESIGN 14).

Flux is right only if both replicas of a partition compute the same state and the same
outputs (DESIGN 4.1). Both compute everything anyway, so comparing them costs two
digests a cut: at every checkpoint (or verify) cut a replica crosses, it digests each
operator's state and the outputs it made since the cut it crossed before.

A ``KeyedState``'s digest is the sum of its pairs' digests: the same whatever order the
keys went in, and kept from cut to cut by the changed keys (the segment decides when a
whole pass is due: ``flux.protocol.segment_snapshots``). Any other operator's is its
``get_state()`` packed as a checkpoint packs it (a keyed store of slots gives its pairs
in key order, so two replicas holding the same keys and values give the same bytes).

The outputs' digest is a sum of one 64-bit hash per output item (the item's SN, its
rows' SNs and values), so it does not depend on how the twins interleaved their work,
only on which items they made: an item's rows are decided by the item (its SN, from the
ingress), not by timing. A replica installed by a catch-up continues its twin's sum (the
moved state carries it); one whose twin did not digest has None until its next cut.
About 0.3 us a row as records, 0.06 as an Arrow batch (msgpack's packing most of it).

Pure: no I/O, no clock.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import msgpack
import xxhash

from flux.keys import MISSING, sorted_keys, tuplify
from flux.state_codec import SLICE

MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Digest:
    """Replica ``addr``'s digests at the cut ``cut`` of checkpoint ``number``:
    ``states`` one per operator of its chain, in order; ``outputs`` of every item it made
    since it crossed the cut ``since`` (None: it did not make them all)."""

    number: int
    cut: int
    states: Tuple[int, ...]
    outputs: Optional[int]
    since: int
    #: per operator: a keyed store's ``GROUPS`` sums (``KeyedSums``), else None
    groups: Tuple[Optional[Tuple[int, ...]], ...] = ()


def bytes_digest(data: bytes) -> int:
    """A packed state (``flux.state_codec.pack_state``), as 64 bits."""
    return xxhash.xxh3_64_intdigest(data)


#: a keyed store's digest is kept as this many sums, each of the pairs whose digest's top
#: bits say so: when two replicas' stores differ, the sums that differ say where to look,
#: and only the pairs of those groups are asked for to name the first differing key
GROUPS = 256
_GROUP_SHIFT = 64 - 8


class KeyedSums:
    """A keyed store's digest as ``GROUPS`` sums of its pairs' digests (wrapping at 2^64):
    their total is ``keyed_digest``'s; the digest of the next cut is these plus what its
    changed keys changed (``after``)."""

    __slots__ = ("sums",)

    def __init__(self, sums: Optional[List[int]] = None):
        self.sums = [0] * GROUPS if sums is None else sums

    @classmethod
    def of(cls, pairs: Iterable[Tuple[Any, Any]]) -> "KeyedSums":
        """A whole pass: about 0.8 us a pair here, in slices of ``SLICE`` pairs (one C loop
        over a million pairs would hold the GIL for most of a second, and the node's
        heartbeats with it, ``flux.state_codec``; numpy's ``add.at`` held it 100 ms and
        more over 300K pairs, a Python loop over a slice's digests lets threads turn)."""
        sums = cls()
        sums._add(pairs)
        return sums

    def after(self, changes: Sequence[Tuple[Any, Any, Any]]) -> "KeyedSums":
        """These sums after the changes ``(key, value before, value now)`` (``MISSING``:
        absent; ``KeyedState.changed_pairs``), as many as half the store's keys: in slices
        too."""
        sums = KeyedSums(list(self.sums))
        sums._add(((k, was) for k, was, _ in changes if was is not MISSING), -1)
        sums._add((k, now) for k, _, now in changes if now is not MISSING)
        return sums

    def _add(self, pairs: Iterable[Tuple[Any, Any]], sign: int = 1) -> None:
        """Add (``sign`` -1: take away) the pairs' digests to their groups' sums, wrapped
        at 2^64 when read (Python's ints do not overflow meanwhile)."""
        sums, pairs = self.sums, iter(pairs)
        while True:
            part = list(islice(pairs, SLICE))  # between two slices, other threads run
            if not part:
                return
            for h in _pair_hashes(part):
                sums[h >> _GROUP_SHIFT] += sign * h

    @property
    def total(self) -> int:
        return sum(self.sums) & MASK

    def groups(self) -> Tuple[int, ...]:
        return tuple(x & MASK for x in self.sums)


def _pair_hashes(pairs: list) -> List[int]:
    pack = msgpack.Packer(autoreset=True).pack  # one per call: a packer is not thread-safe
    return list(map(xxhash.xxh3_64_intdigest, map(pack, pairs)))


def group_pairs(pairs: Iterable[Tuple[Any, Any]], groups: Iterable[int]) -> list:
    """``[key, pair digest]`` of each pair whose digest is in one of ``groups``: what a
    replica answers when asked where its store differs from its twin's."""
    wanted = frozenset(groups)
    found, pairs = [], iter(pairs)
    while True:
        part = list(islice(pairs, SLICE))
        if not part:
            return found
        found.extend([pair[0], h] for pair, h in zip(part, _pair_hashes(part))
                     if h >> _GROUP_SHIFT in wanted)


def first_differing_key(mine: Sequence, twins: Sequence) -> Any:
    """The first key, in key order, whose pair digests differ between two replicas'
    ``group_pairs`` answers (held by one only, or with another value), or MISSING."""
    a = {tuplify(k): h for k, h in mine}
    b = {tuplify(k): h for k, h in twins}
    differ = [k for k in a.keys() | b.keys() if a.get(k) != b.get(k)]
    return sorted_keys(differ)[0] if differ else MISSING


def keyed_digest(pairs: Iterable[Tuple[Any, Any]]) -> int:
    """A keyed store's state: the sum of one digest per ``(key, value)`` pair. A sum does
    not depend on the order the pairs come in, and the digest of the next cut is this one
    plus what the keys changed since changed: a cut costs the changed keys, not the whole
    store (``KeyedSums``, which keeps it in groups)."""
    return KeyedSums.of(pairs).total


def keyed_digest_after(total: int, changes: Sequence[Tuple[Any, Any, Any]]) -> int:
    """``total`` after the changes ``(key, value before, value now)`` (``MISSING``: absent;
    ``KeyedState.changed_pairs``)."""
    return (total + KeyedSums().after(changes).total) & MASK


def item_digest(item: Sequence[int], rows: Any) -> int:
    """One output item (``exchange.rows.NumberedRows``) under its SN ``item``: its rows'
    SNs and values in the item's own msgpack-safe form (``to_state``: records, or a
    columnar item's Arrow IPC)."""
    h = xxhash.xxh3_64(msgpack.packb(list(item)))
    h.update(msgpack.packb(rows.to_state()))  # records cross the wire as msgpack
    return h.intdigest()


class OutputDigest:
    """The sum of the item digests of a replica's outputs since a cut (``since``), or
    None when it did not make all of them."""

    __slots__ = ("total", "since")

    def __init__(self, since: Optional[int] = 0):
        self.total = 0
        self.since = since

    def add(self, item: Sequence[int], rows: Any) -> None:
        self.total = (self.total + item_digest(item, rows)) & MASK

    def crossed(self, cut: int) -> Tuple[Optional[int], int]:
        """The digest up to ``cut`` (None if incomplete) and the cut it began at; from now
        on it counts the outputs after ``cut``, complete."""
        value = self.total if self.since is not None else None
        began = self.since if self.since is not None else -1
        self.total, self.since = 0, cut
        return value, began

    def to_state(self) -> list:
        """What a catch-up moves: the active's outputs since its last cut are the new
        replica's too (its state holds their effects)."""
        return [self.total, self.since]

    def install_state(self, state: Optional[list]) -> None:
        """A state moved from the twin; None (a twin that does not digest): this replica
        did not make the outputs since the last cut."""
        if state is None:
            self.total, self.since = 0, None
        else:
            self.total, self.since = state
