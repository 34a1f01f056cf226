"""Pairs started and stopped at live rescales, in the simulator (``--dormant``).

The controller's side of docs/design/rescaling.md's dormant pairs: the pairs past the
first count have no process; before a live rescale to more, the controller starts them
on standbys (a view, ``Recovery.join``) once no replica is missing, and no cut moves
groups until every live process applied that view. A live rescale to fewer takes every
group of the pairs past the new count at its cut; once both replicas of each crossed it
and hold nothing (every consumer acked all they sent) and no replica is missing, they
leave (a view, ``Recovery.leave``), and a node left holding nothing is a standby again.

Checkpoints: the pairs that hold nothing at a cut (dormant at the start, or left at an
earlier cut, and given no group since) are taken as written and empty (``empty_at``);
each checkpoint records how many pairs ran at its cut, which a restart from it starts.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from exchange.group_map import GroupMap, maps_to_config
from flux.addresses import P, S, Addr
from flux.sim.config import CONTROLLER


class SimPairs:
    """Which pairs run, which join or leave next, and what a restart starts."""

    def __init__(self, world, moves):
        self.world, self.moves = world, moves
        counts = world.config.live_rescales
        self.dormant = world.config.dormant and bool(counts)
        #: the pairs running: those from ``live`` on are dormant
        self.live = counts[0] if self.dormant else world.partitions
        #: partitions joined in this incarnation, and the last join's view (no cut moves
        #: groups until every live process applied it)
        self.joined: set = set()
        self.join_view: Optional[int] = None
        #: partitions that owned a group before some cut of this incarnation since they
        #: last started; and the partitions dormant at the start or taken out since: those
        #: of them not owning are empty at every cut (``empty_at``)
        self.owned: set = set()
        self.sleepers: set = set()
        #: checkpoint -> how many pairs ran at its cut (a restart from it runs as many
        #: at least: an idle one keeps what is not a key's)
        self.live_at: Dict[int, int] = {}
        #: the partitions a live rescale to fewer took every group from, until they
        #: leave (a view), the checkpoint whose cut took them, and the last leave's view
        #: (a join waits until every live process applied it)
        self.leaving: Tuple[int, ...] = ()
        self.leave_cut = 0
        self.leave_view: Optional[int] = None
        #: counters: joins, leaves, joins of pairs that had left, live rescales that gave
        #: groups to joined pairs; and the partitions that left so far
        self.joins = self.leaves = self.rejoins = self.onto_joined = 0
        self.gone: set = set()
        if self.dormant:
            world.builder.dormant = frozenset(range(self.live, world.partitions))
            self.sleepers = set(world.builder.dormant)

    # -- checkpoints ---------------------------------------------------------------------
    def empty_at(self, number: int, before: Dict[int, GroupMap]) -> frozenset:
        """Checkpoint ``number`` is begun (``before``: the maps before its cut's moves):
        the partitions whose snapshots the coordinator takes as written and empty. The
        driver knows the maps at each cut, not when each process applied a join, so a
        partition owning no group since it last started counts (joined or not); the pairs
        a cut's moves take out count from the next cut on (they write this one)."""
        for groups in before.values():
            self.owned.update(groups.owning())
        empty = frozenset(self.sleepers - self.owned)
        self.live_at[number] = self.live
        if number == self.leave_cut:
            self.owned.difference_update(self.leaving)
            self.sleepers.update(self.leaving)
        return empty

    # -- live rescales -------------------------------------------------------------------
    def running(self, count: int) -> bool:
        """May a cut give groups to the first ``count`` pairs (0: move any)? Dormant ones
        must have joined, and every live process applied the join (the cut is chosen
        after it, docs/design/rescaling.md)."""
        if count > self.live:
            return False
        return not self.world.config.join_waits_for_views or self._applied(self.join_view)

    def rescaling_to(self, count: int) -> None:
        """A live rescale to ``count`` pairs is chosen (its moves maybe in two phases)."""
        self.onto_joined += bool(self.joined) and count > min(self.joined)

    def rescaled_to(self, count: int, number: int) -> None:
        """A live rescale to ``count`` pairs moved its groups at checkpoint ``number``'s
        cut: with fewer than run, the pairs past ``count`` leave once both replicas of
        each crossed it and all they sent is acked, and count out of the pairs running at
        a restart from this cut on (docs/design/rescaling.md)."""
        if self.dormant and count < self.live:
            self.leaving, self.leave_cut = tuple(range(count, self.live)), number
            self.live = count

    def _applied(self, view: Optional[int]) -> bool:
        """Has every live process applied ``view`` (None: no view to wait for)?"""
        w = self.world
        return view is None or all(w.hosts[n].view >= view for n in w.hosts if w.alive[n])

    # -- the controller's steps ----------------------------------------------------------
    def steps(self, steps: list, hosts: list) -> None:
        if self._join_due():
            steps.append(("join",))
            hosts.append(CONTROLLER)
        if self._leave_due():
            steps.append(("leave",))
            hosts.append(CONTROLLER)

    def apply(self, step: tuple) -> None:
        self._join() if step[0] == "join" else self._leave()

    def _join_due(self) -> bool:
        """A live rescale needs dormant pairs, no rescale is under way, and the controller
        may start them now (no replica missing, standbys enough, the last leave applied
        everywhere)."""
        counts = self.moves.counts
        if not (self.dormant and counts and counts[0] > self.live) or \
                self.leaving or self.moves.prepared_count is not None:
            return False
        rec = self.world.recovery
        return not rec.missing and not rec.attempts and \
            len(rec.free) >= max(2, counts[0] - self.live) and self._applied(self.leave_view)

    def _join(self) -> None:
        """The next live rescale's dormant pairs start on standbys (a view), routing by
        the maps after the last cut that moved groups (their producers may have forgotten
        telling its moves), and crossing no cut chosen before."""
        w = self.world
        parts = range(self.live, self.moves.counts[0])
        cuts = w.outcome.cuts
        maps, seen = (maps_to_config(self.moves.current), self.moves.moves_cut) \
            if w.config.join_with_maps else ((), 0)
        views = w.recovery.join(parts, maps, seen, tuple(cuts[-1]) if cuts else ())
        self.joined.update(parts)
        self.live = self.moves.counts[0]
        self.join_view = views[-1].number
        self.joins += 1
        self.rejoins += bool(self.gone.intersection(parts))
        w.broadcast(views)

    def _leave_due(self) -> bool:
        """Pairs leave once every replica of theirs crossed the cut that took their groups
        and holds nothing (every consumer acked all it sent), and no replica is missing
        (a catch-up expects every neighbour it had). What each replica would report: the
        controller reads it off the replica, live or crashed and not declared dead yet."""
        rec = self.world.recovery
        if not self.leaving or rec.missing or rec.attempts:
            return False
        return all(self._left_behind(Addr(s, q, r)) for q in self.leaving
                   for s in range(1, self.world.stages + 1) for r in (P, S))

    def _left_behind(self, addr: Addr) -> bool:
        """What the replica's report says (``SegmentStats``, as the runtime's nodes send
        it): it crossed the cut and holds nothing."""
        w = self.world
        host = w.hosts.get(w.host_of.get(addr))
        seg = host.machines.get(addr) if host is not None else None
        if seg is None:
            return False
        said = seg.stats()
        return said.moves_crossed >= self.leave_cut and (
            said.idle or not w.config.leave_waits_for_acks)

    def _leave(self) -> None:
        """The leaving pairs stop (a view): their replicas go, their nodes holding nothing
        more are standbys again."""
        cut = [c for c in self.world.outcome.cuts if c[0] == self.leave_cut][-1:]
        told = tuple(cut[0]) if cut and self.world.config.leave_tells_cut else ()
        views = self.world.recovery.leave(self.leaving, told)
        self.gone.update(self.leaving)
        self.leaving, self.leave_view = (), views[-1].number
        self.leaves += 1
        self.world.broadcast(views)

    def leave_stalled(self) -> Optional[str]:
        """At quiescence: pairs that should have left and did not, or None."""
        if self.leaving and not self.world.recovery.missing:
            return f"pairs {list(self.leaving)} never left after checkpoint {self.leave_cut}"
        return None

    # -- a restart -----------------------------------------------------------------------
    def restarted(self, k: Optional[int], current: Dict[int, GroupMap]) -> None:
        """The job starts again from checkpoint ``k`` (None: the beginning) with the maps
        ``current``: the pairs that ran at its cut or own groups run, the others are
        dormant; a leave not applied yet is the restart's doing."""
        w = self.world
        owners = [int(m.owners.max()) for m in current.values()]
        self.live = max([self.live_at.get(k, w.config.live_rescales[0])] +
                        [o + 1 for o in owners])
        w.builder.dormant = frozenset(range(self.live, w.partitions))
        self.sleepers = set(w.builder.dormant)
        w.placement = w.config.placement_for(self.live)
        self.joined, self.join_view, self.owned = set(), None, set()
        self.leaving, self.leave_view = (), None
