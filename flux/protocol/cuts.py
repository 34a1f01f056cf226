"""The checkpoint cuts a consumer knows and has not crossed yet (DESIGN 10).

A cut ``(k, n)`` (checkpoint ``k`` covers inputs 1..n) travels with the data:
every batch carries the newest cut its producer knows (``Batch.cut``). A
consumer learns of it before it can release any tuple derived from an input
beyond ``n`` (such a tuple was produced after its producer learned the cut,
and FIFO brings the stamp first; docs/design/checkpoints.md), and it *crosses* the
cut when its merge can release nothing derived from inputs up to ``n`` any
more: then a segment snapshots its operators, the egress has the sink commit.

A stamp may carry live moves of key groups ``(k, n, move_cuts)`` (DESIGN 13,
``exchange.group_map``), ``move_cuts`` being the ``(k_i, n_i, moves_i)`` its producer
learned after the cut it told that connection last (all of them on a connection never
told): the moves take effect at their own cut ``n_i``. A consumer may learn cut ``k``
without ever seeing an older cut (its producer sent it nothing in between): that skips
a checkpoint, never a move, since whoever knows cut ``k`` knows every move cut up to it
and tells each connection all it was not told (docs/design/rescaling.md).

A move cut is kept to tell it on, until every consumer it may be told to crossed it
(each says which it crossed last in its acks and credits, ``Producer.moves_forgettable``):
then ``forget`` drops it, so a job moving groups all its life keeps no growing list
(DESIGN 13). What was learned is remembered by number (``moves_seen``), so a cut told
again by a producer that has not forgotten it yet is not learned twice.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from exchange.group_map import GroupMove, moves_from_wire
from flux.sequence import SN, bound_key

Cut = Tuple[int, int]


def after_move_cut(move_cuts: Tuple[tuple, ...], upto: float) -> Tuple[tuple, ...]:
    """The move cuts ``(k, n, moves)`` numbered above ``upto``."""
    if move_cuts and move_cuts[0][0] <= upto:
        return tuple(m for m in move_cuts if m[0] > upto)
    return move_cuts


class Cuts:
    def __init__(self, moves: bool = True) -> None:
        self.latest: Optional[Cut] = None
        self.pending: Dict[int, int] = {}  # checkpoint -> its cut, not crossed yet
        #: moves are kept and crossed (False: an egress, which routes nothing)
        self.keeps_moves = moves
        #: checkpoint -> its cut and the key-group moves it carries, not crossed yet
        self.moves: Dict[int, Tuple[int, Tuple[GroupMove, ...]]] = {}
        #: every move cut learned and not forgotten, in order, as stamps carry them on
        self.move_cuts: Tuple[tuple, ...] = ()
        self.moves_seen = 0  # the newest move cut learned (forgotten or not)
        self.moves_crossed = 0  # the newest move cut crossed
        #: a joined replica's start: move cuts up to ``applied`` are in its maps, and
        #: checkpoint cuts up to ``skipped`` are not its to cross (``seen_up_to``)
        self.applied = self.skipped = 0

    def learn(self, cut: Optional[tuple]) -> None:
        """A batch said ``cut``; a newer one than any known is pending from now, and so
        are the moves of cuts newer than any move cut known."""
        if cut is None:
            return
        k, n = cut[0], cut[1]
        if self.latest is None or k > self.latest[0]:
            self.latest = (k, n)
            if k > self.skipped:
                self.pending[k] = n
        if len(cut) > 2 and self.keeps_moves:
            for k_i, n_i, moves in cut[2]:
                if k_i > self.moves_seen:
                    moves = moves_from_wire(moves)
                    if k_i > self.applied:
                        self.moves[k_i] = (n_i, moves)
                    self.move_cuts += ((k_i, n_i, moves),)
                    self.moves_seen = k_i

    def due(self, frontier: SN) -> Optional[Cut]:
        """The oldest pending cut the merge's ``frontier`` has passed, or None."""
        for k in sorted(self.pending):
            n = self.pending[k]
            if bound_key(frontier) >= bound_key((n,)):
                return (k, n)
            return None  # cuts are crossed in order
        return None

    def moves_due(self, frontier: SN) -> Optional[int]:
        """The oldest move cut the merge's ``frontier`` has passed, or None."""
        for k in sorted(self.moves):
            if bound_key(frontier) >= bound_key((self.moves[k][0],)):
                return k
            return None
        return None

    def seen_up_to(self, k: int, cut: tuple = ()) -> None:
        """A replica built with the maps after move cut ``k`` (a pair joined at a live
        rescale): move cuts up to it are in those maps, told on but not crossed again;
        and it crosses no checkpoint cut up to ``cut`` ``(k, n)``, chosen before it
        started (its snapshots there are not its own)."""
        self.applied = max(self.applied, k)
        self.moves_crossed = max(self.moves_crossed, k)
        if cut:
            self.skipped = max(self.skipped, cut[0])

    def crossed(self, k: int) -> None:
        del self.pending[k]

    def cross_moves(self, k: int) -> Tuple[GroupMove, ...]:
        """Move cut ``k`` is crossed: its moves take effect now."""
        self.moves_crossed = max(self.moves_crossed, k)
        return self.moves.pop(k)[1]

    def forget(self, upto: int) -> None:
        """Every consumer the move cuts up to ``upto`` may be told to crossed them: they
        are told no more (those not crossed here yet are kept)."""
        self.move_cuts = after_move_cut(self.move_cuts, min(upto, self.moves_crossed))

    def to_state(self) -> List:
        state = [list(self.latest) if self.latest else None,
                 [[k, n] for k, n in sorted(self.pending.items())],
                 [[k, n, [m.to_wire() for m in moves]] for k, (n, moves) in
                  sorted(self.moves.items())],
                 [[k, n, [m.to_wire() for m in moves]] for k, n, moves in self.move_cuts],
                 self.moves_seen, self.moves_crossed]
        if self.applied or self.skipped:  # a joined replica's start (``seen_up_to``)
            state += [self.applied, self.skipped]
        return state

    def install_state(self, state) -> None:
        latest, pending = state[0], state[1]
        self.latest = tuple(latest) if latest else None
        self.pending = {k: n for k, n in pending}
        self.moves = {k: (n, moves_from_wire(moves)) for k, n, moves in state[2]} \
            if len(state) > 2 else {}
        self.move_cuts = tuple((k, n, moves_from_wire(moves)) for k, n, moves in state[3]) \
            if len(state) > 3 else ()
        if len(state) > 7:
            self.applied, self.skipped = state[6], state[7]
        if len(state) > 5:
            self.moves_seen, self.moves_crossed = state[4], state[5]
        else:  # a state from before move cuts were forgotten: it kept all of them
            self.moves_seen = max((m[0] for m in self.move_cuts), default=0)
            self.moves_crossed = max((m[0] for m in self.move_cuts if m[0] not in self.moves),
                                     default=0)
