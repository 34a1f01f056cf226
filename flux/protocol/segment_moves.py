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

A part of ``flux.protocol.segment.Segment`` (its attributes are the segment's).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from exchange.group_map import GroupMap, GroupMove, moves_from_wire, stage_moves
from exchange.routing import moved
from flux.control_messages import InstallRange, RangeInstalled, RangePacked
from flux.effects import RangeAwaited
from flux.errors import LocalProtocolError, RescaleRefused
from flux.keys import PARTITION_WIDE, sorted_keys
from flux.rescale import key_groups_of
from flux.state_codec import unpack_state

MoveKey = Tuple[int, GroupMove]


class MoveSide:
    """Live moves of key groups; mixed into ``Segment``."""

    #: moves whose cut this replica crossed as their destination, not installed yet
    moves_due: Dict[MoveKey, bool]
    #: ranges that came before their cut was crossed
    ranges_arrived: Dict[MoveKey, bytes]
    #: moves installed here (an install sent again is acknowledged, not installed twice)
    moves_installed: set

    def _init_moves(self) -> None:
        self.moves_due, self.ranges_arrived, self.moves_installed = {}, {}, set()

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
        effects: List[Any] = [RangePacked(number, move, self.addr,
                                          self._take_range(number, move))
                              for move in mine if move.source == me]
        for move in mine:
            if move.dest == me:
                self.moves_due[number, move] = True
                data = self.ranges_arrived.pop((number, move), None)
                effects += self._install_range(number, move, data) if data is not None \
                    else [RangeAwaited(number, move, self.addr)]  # the pause begins
        return effects

    def on_install_range(self, msg: InstallRange) -> List:
        """The controller sends the range of a move this replica is the destination of."""
        key = (msg.number, msg.move)
        if msg.move.stage != self.addr.stage or msg.move.dest != self.addr.partition:
            raise LocalProtocolError(f"{self.addr}: the range of {msg.move}, which is not "
                                     f"this partition's")
        if key in self.moves_installed:
            return [RangeInstalled(msg.number, msg.move, self.addr)]
        if key in self.moves_due:
            return self._install_range(msg.number, msg.move, msg.data)
        self.ranges_arrived[key] = msg.data  # its cut is still ahead
        return []

    def _take_range(self, number: int, move: GroupMove) -> bytes:
        """Take the range's keys out of every keyed store: ``[[operator, keys, values],
        ...]``. Entries of the partition rather than of a key (an expiry's watermark,
        ``PARTITION_WIDE``) stay: each partition keeps its own (``regrouped_states``)."""
        taken = []
        for i, store in self._range_stores(move):
            keys = [k for k in store.held_keys() if k not in PARTITION_WIDE]
            groups = key_groups_of(self.stage_spec, keys, self.key_groups) if keys else \
                np.zeros(0, dtype=np.int64)
            mine = np.flatnonzero(move.covers(groups)).tolist()
            held, values = store.take_keys(sorted_keys([keys[j] for j in mine]))
            taken.append([i, list(held), list(values)])
        return self._packed(lambda: taken, f"the move of {move} at checkpoint {number}",
                            None)

    def _install_range(self, number: int, move: GroupMove, data: bytes) -> List:
        stores = self._stores()
        for i, keys, values in unpack_state(data):
            stores[i].put_keys(keys, values)
        del self.moves_due[number, move]
        self.moves_installed.add((number, move))
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
        """What a new replica takes over of the moves; None: nothing moved here."""
        groups = self.router.groups
        if not (self.moves_due or self.ranges_arrived or self.moves_installed) and \
                groups is None:
            return None
        return {"due": [[k, m.to_wire()] for k, m in self.moves_due],
                "arrived": [[k, m.to_wire(), d] for (k, m), d in self.ranges_arrived.items()],
                "installed": [[k, m.to_wire()] for k, m in self.moves_installed],
                "groups": None if groups is None else groups.owners.tolist()}

    def install_moves_state(self, state: dict) -> None:
        def key(k, m):
            return (k, moves_from_wire([m])[0])
        self.moves_due = {key(k, m): True for k, m in state["due"]}
        self.ranges_arrived = {key(k, m): d for k, m, d in state["arrived"]}
        self.moves_installed = {key(k, m) for k, m in state["installed"]}
        if state["groups"] is not None:
            self.router = self.router.regrouped(GroupMap(state["groups"],
                                                         self.router.partitions))
