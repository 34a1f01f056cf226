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
from typing import Any, Iterable, Optional, Sequence, Tuple

import msgpack
import xxhash

from flux.keys import MISSING
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


def bytes_digest(data: bytes) -> int:
    """A packed state (``flux.state_codec.pack_state``), as 64 bits."""
    return xxhash.xxh3_64_intdigest(data)


def keyed_digest(pairs: Iterable[Tuple[Any, Any]]) -> int:
    """A keyed store's state: the sum of one digest per ``(key, value)`` pair. A sum does
    not depend on the order the pairs come in, and the digest of the next cut is this one
    plus what the keys changed since changed (``keyed_digest_after``): a cut costs the
    changed keys, not the whole store. About 0.7 us a pair here (a C packer and XXH3
    mapped over the pairs: a Python loop calling a function per pair cost 2.5 us), in
    slices of ``SLICE`` pairs: one C loop over a million pairs would hold the GIL for
    most of a second, and the node's heartbeats with it (``flux.state_codec``)."""
    pack = msgpack.Packer(autoreset=True).pack  # one per call: a packer is not thread-safe
    total, pairs = 0, iter(pairs)
    while True:
        part = list(islice(pairs, SLICE))  # between two slices, other threads run
        if not part:
            return total & MASK
        total += sum(map(xxhash.xxh3_64_intdigest, map(pack, part)))


def keyed_digest_after(total: int, changes: Sequence[Tuple[Any, Any, Any]]) -> int:
    """``total`` after the changes ``(key, value before, value now)`` (``MISSING``: absent;
    ``KeyedState.changed_pairs``)."""
    gone = keyed_digest([(key, was) for key, was, _ in changes if was is not MISSING])
    come = keyed_digest([(key, now) for key, _, now in changes if now is not MISSING])
    return (total - gone + come) & MASK


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
