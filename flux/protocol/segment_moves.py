"""A segment's side of a live move of key groups (DESIGN 13, docs/design/rescaling.md).

A move of a range of key groups of stage ``s`` from partition ``a`` to ``b`` takes
effect at a checkpoint's cut ``C``, which carries it in band (``flux.protocol.cuts``).
As a replica crosses ``C`` it is, per move:

- a producer of stage ``s`` (a replica of stage ``s - 1``): it routes what comes after
  ``C`` by the map after the move (the ingress does so for stage 1 as it chooses ``C``);
- the source ``a``: it takes the range out of its keyed stores (its state at ``C``) and
  reports it (``RangePacked``); both replicas do, the controller keeps one;
- the destination ``b``: it processes nothing past ``C`` until it installed the range
  (``InstallRange``, which may come before it crossed ``C``: kept until then).

No input is processed by both owners or by neither: inputs up to ``C`` reach ``a``, the
ones after it ``b``, which holds them until it has ``a``'s state at ``C``. Taking and
installing are writes to the stores, so catch-up's tracking, the snapshots' deltas and
the digests see them as any other change.

Two phases, as catch-up moves state (paper 3.3): an earlier cut ``B`` may carry the
move's *prepare*. Crossing it, the source's replicas keep a reference to the range's
bulk (the values, which stores replace and never change in place) and have their host
pack it (``PackRange``: the runtime packs it off its loop, and reports it); the
destination's replicas keep the bulk aside when it comes (not in their state: they own
none of it before ``C``). At ``C`` the source sends only the keys whose values differ
from the bulk's and those gone since, and the destination installs bulk and changes:
its pause is the changes' way, not the range's: each source replica sends them straight
to both destination replicas too (the first copy to come is installed, the others and
the controller's acknowledged), so the controller is not on that way unless a replica
was lost. A source replica without the bulk's
reference (rebuilt after ``B``) sends the whole range at ``C``, as a move without a
prepare does; a destination replica rebuilt before it installed gets the bulk again
from the controller, which keeps it until the move is installed.

A part of ``flux.protocol.segment.Segment`` (its attributes are the segment's).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from exchange.group_map import GroupMap, GroupMove, moves_from_wire, stage_moves
from exchange.routing import moved
from flux.control_messages import InstallRange, RangeInstalled, RangePacked
from flux.addresses import P, S, Addr
from flux.effects import PackRange, RangeAwaited, Send
from flux.errors import LocalProtocolError, RescaleRefused
from flux.keys import PARTITION_WIDE, sorted_keys, tuplify
from flux.rescale import key_groups_of
from flux.state_codec import unpack_state

MoveKey = Tuple[int, GroupMove]
#: per keyed store: ``[operator, keys, values]``, as a range is packed
Parts = List[list]


class MoveSide:
    """Live moves of key groups; mixed into ``Segment``."""

    #: moves whose cut this replica crossed as their destination, not installed yet
    moves_due: Dict[MoveKey, bool]
    #: ranges that came before they could be installed: (the bulk's checkpoint, data)
    ranges_arrived: Dict[MoveKey, Tuple[Optional[int], bytes]]
    #: moves installed here (an install sent again is acknowledged, not installed twice)
    moves_installed: set
    #: as a source: move -> the prepare's checkpoint and the bulk it packed there
    bulks_kept: Dict[GroupMove, Tuple[int, Parts]]
    #: as a destination: (prepare's checkpoint, move) -> the bulk, unpacked
    bulks_staged: Dict[MoveKey, Parts]

    def _init_moves(self) -> None:
        self.moves_due, self.ranges_arrived, self.moves_installed = {}, {}, set()
        self.bulks_kept, self.bulks_staged = {}, {}

    def awaiting_range(self) -> bool:
        """Is a range due that is not installed? Then nothing past its cut is processed."""
        return bool(self.moves_due)

    def cross_moves(self, number: int, moves: Sequence[GroupMove]) -> List:
        """Checkpoint ``number``'s cut is crossed, and it carries ``moves``."""
        stage, me = self.addr.stage, self.addr.partition
        self.router = moved(self.router, stage_moves(moves, stage + 1))
        mine = stage_moves(moves, stage)
        # every range taken out before any comes in: a pack is the state at the cut,
        # the same bytes at both replicas whenever each got what it gains
        effects: List[Any] = []
        for move in mine:
            if move.source == me and move.prepare:
                effects.append(PackRange(number, move, self.addr, self._keep_bulk(number,
                                                                                 move)))
            elif move.source == me:
                over, data = self._take_range(number, move)
                effects.append(RangePacked(number, move, self.addr, data, over))
                # and straight to the destination's replicas, ahead of the controller's
                effects += [Send(self.addr, Addr(stage, move.dest, r),
                                 InstallRange(number, move, data, over)) for r in (P, S)]
        for move in mine:
            if move.dest == me and not move.prepare:
                self.moves_due[number, move] = True
                effects += self._try_install(number, move) or \
                    [RangeAwaited(number, move, self.addr)]  # the pause begins
        return effects

    def on_install_range(self, msg: InstallRange) -> List:
        """The controller sends the range of a move (or a prepare's bulk) this replica
        is the destination of."""
        move = msg.move
        if move.stage != self.addr.stage or move.dest != self.addr.partition:
            raise LocalProtocolError(f"{self.addr}: the range of {move}, which is not "
                                     f"this partition's")
        done = [RangeInstalled(msg.number, move, self.addr)]
        if move.prepare:
            return self._stage_bulk(msg.number, move.settled(), msg.data) + done
        key = (msg.number, move)
        if key in self.moves_installed:
            return done
        self.ranges_arrived[key] = (msg.over, msg.data)
        return self._try_install(msg.number, move)  # (its cut may be still ahead)

    # -- as the source ---------------------------------------------------------------
    def _range_parts(self, move: GroupMove, take: bool) -> Parts:
        """The range's keys in every keyed store with their values (``take``: taken
        out). Entries of the partition rather than of a key (an expiry's watermark,
        ``PARTITION_WIDE``) stay: each partition keeps its own (``regrouped_states``)."""
        parts = []
        for i, store in self._range_stores(move):
            keys = [k for k in store.held_keys() if k not in PARTITION_WIDE]
            groups = key_groups_of(self.stage_spec, keys, self.key_groups) if keys else \
                np.zeros(0, dtype=np.int64)
            mine = sorted_keys([keys[j] for j in np.flatnonzero(move.covers(groups))])
            held, values = store.take_keys(mine) if take else store.read_keys(mine)
            parts.append([i, list(held), list(values)])
        return parts

    def _keep_bulk(self, number: int, move: GroupMove) -> Parts:
        """A prepare's cut: the range's bulk, kept for the changes and packed by the host
        (``PackRange``)."""
        parts = self._range_parts(move, take=False)
        self.bulks_kept[move.settled()] = (number, parts)
        return parts

    def _take_range(self, number: int, move: GroupMove) -> Tuple[Optional[int], bytes]:
        """The move's cut: the range taken out, packed whole (``[[operator, keys,
        values], ...]``), or as its changes since the bulk this replica packed
        (``[[operator, keys, values, deleted keys], ...]``) with the bulk's checkpoint."""
        parts = self._range_parts(move, take=True)
        kept = self.bulks_kept.pop(move, None)
        when = f"the move of {move} at checkpoint {number}"
        if kept is None:
            return None, self._packed(lambda: parts, when, None)
        over, bulk = kept
        return over, self._packed(lambda: [range_changes(old, now) for old, now in
                                           zip(bulk, parts)], when, None)

    # -- as the destination ----------------------------------------------------------
    def _stage_bulk(self, number: int, move: GroupMove, data: bytes) -> List:
        """A prepare's bulk: kept aside until its move's cut (unless that move was
        installed already: a bulk sent again to a replica rebuilt since)."""
        if any(m == move and k > number for k, m in self.moves_installed):
            return []
        self.bulks_staged[number, move] = unpack_state(data)
        effects: List[Any] = []
        for k, m in [key for key in self.moves_due if key[1] == move]:
            effects += self._try_install(k, m)
        return effects

    def _try_install(self, number: int, move: GroupMove) -> List:
        """Install the move's range if its cut is crossed and all of it is here."""
        key = (number, move)
        arrived = self.ranges_arrived.get(key)
        if key not in self.moves_due or arrived is None:
            return []
        over, data = arrived
        if over is not None and (over, move) not in self.bulks_staged:
            return []  # the changes came before the bulk they change
        del self.ranges_arrived[key], self.moves_due[key]
        stores = self._stores()
        if over is not None:
            for i, keys, values in self.bulks_staged[over, move]:
                stores[i].put_keys(keys, values)
        for part in unpack_state(data):
            stores[part[0]].put_keys(part[1], part[2])
            if len(part) > 3 and part[3]:
                stores[part[0]].take_keys([tuplify(k) for k in part[3]])
        for staged in [s for s in self.bulks_staged if s[1] == move and s[0] < number]:
            del self.bulks_staged[staged]  # (a whole range makes its bulk useless)
        self.moves_installed.add(key)
        return [RangeInstalled(number, move, self.addr)]

    def _range_stores(self, move: GroupMove) -> List[Tuple[int, Any]]:
        """The operators' keyed stores; a state a move cannot split is refused, naming it."""
        out = []
        for i, (op, store) in enumerate(zip(self.chain.operators, self._stores())):
            if store is not None:
                out.append((i, store))
            elif op.get_state() is not None:
                raise RescaleRefused(
                    f"stage {self.addr.stage} operator {i} ({type(op).__name__}) keeps state "
                    f"that is not a keyed store: {move} cannot take its part of it")
        return out

    # -- the record a new replica takes over (catch-up) ---------------------------
    def moves_state(self) -> Optional[dict]:
        """What a new replica takes over of the moves; None: nothing moved here. Not the
        bulks: a new source replica sends its ranges whole, a new destination replica
        is sent its bulks again."""
        groups = self.router.groups
        if not (self.moves_due or self.ranges_arrived or self.moves_installed) and \
                groups is None:
            return None
        return {"due": [[k, m.to_wire()] for k, m in self.moves_due],
                "arrived": [[k, m.to_wire(), o, d]
                            for (k, m), (o, d) in self.ranges_arrived.items()],
                "installed": [[k, m.to_wire()] for k, m in self.moves_installed],
                "groups": None if groups is None else groups.owners.tolist()}

    def install_moves_state(self, state: dict) -> None:
        def key(k, m):
            return (k, moves_from_wire([m])[0])
        self.moves_due = {key(k, m): True for k, m in state["due"]}
        self.ranges_arrived = {key(k, m): (o, d) for k, m, o, d in state["arrived"]}
        self.moves_installed = {key(k, m) for k, m in state["installed"]}
        if state["groups"] is not None:
            self.router = self.router.regrouped(GroupMap(state["groups"],
                                                         self.router.partitions))


def range_changes(old: list, now: list) -> list:
    """One store's part of a move as its changes since its bulk: ``[operator, keys,
    values, deleted keys]``, the keys whose value is not the bulk's (the same object,
    or equal) and the bulk's keys gone since."""
    before = dict(zip(old[1], old[2]))
    keys, values = [], []
    for key, value in zip(now[1], now[2]):
        was = before.pop(key, _ABSENT)
        if not (was is value or _equal(was, value)):
            keys.append(key)
            values.append(value)
    return [now[0], keys, values, sorted_keys(before)]


_ABSENT = object()


def _equal(a: Any, b: Any) -> bool:
    """Equal values, where ``==`` says so plainly (an array's elementwise answer: not)."""
    try:
        return bool(a == b) if type(a) is type(b) else False
    except (TypeError, ValueError):
        return False
