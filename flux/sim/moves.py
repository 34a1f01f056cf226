"""Live moves of key-group ranges between running partitions, in the simulator (DESIGN 13).

The controller's side of ``flux.protocol.segment_moves``: at a checkpoint the ingress
cuts, it may attach a move of a range of groups of one stage from the partition that
owns them to another (``choose``); it keeps the range the source's replicas pack as
they cross the cut (``packed``) and sends it to each replica of the destination until
that replica, in its current process, says it holds it (an ``install-range`` step per
replica and process, early or late: a replica that has not crossed the cut keeps it).
Half the moves come in two phases: a cut carries their prepares (the bulk sent, the
ranges kept) and a later one the moves, with only the changes since; a restart may fall
between (the source's replicas then know no bulk and send the range whole). The map
after each checkpoint's moves is its manifest's: a restart from it routes by it, and
each partition restores the groups it owns in it from the snapshots, which hold the
groups of the map before (``restore_split``).

The oracle is unchanged: the output equals the failure-free run's (the regrouping
dataflow's output does not depend on which partition holds a key), and every snapshot
equals the failure-free state of exactly the groups its partition owned at its cut
(``expected_state``).
"""
from __future__ import annotations

import random
from typing import Dict, List, Optional, Tuple

from exchange.group_map import GroupMap, GroupMove
from exchange.partitioner import KEY_GROUPS
from controller.range_relay import RangeRelay
from flux.addresses import Addr
from flux.control_messages import InstallRange, RangePacked
from flux.effects import PackRange
from flux.operator import wire_form
from flux.rescale import regrouped_states
from flux.sim.config import CONTROLLER
from flux.sim.pairs import SimPairs
from flux.sim.sink_moves import SinkMoves
from flux.sim.violation import Violation
from flux.snapshot_chain import rebuild
from flux.state_codec import pack_state

#: a checkpoint's cut carries a move with this chance, while moves are left
MOVE_CHANCE = 0.5


class SimMoves:
    """The moves asked, the maps they make, the ranges held for the destinations."""

    def __init__(self, world, count: int, rng: random.Random):
        self.world = world
        self.left = count
        self.rng = rng
        counts = world.config.live_rescales
        #: each stage's map at the start: the first count's ranges over the pairs (absent:
        #: contiguous ranges over all), and the counts live rescales are still to reach
        self.initial: Dict[int, GroupMap] = {
            s: GroupMap.even(counts[0], KEY_GROUPS, world.partitions)
            for s in range(1, world.stages + 1)} if counts else {}
        self.counts = list(counts[1:])
        self.rescaled = 0
        #: stage -> the map of the inputs accepted from now (absent: contiguous ranges)
        self.current: Dict[int, GroupMap] = dict(self.initial)
        world.builder.groups = dict(self.initial)
        #: checkpoint -> the maps before and after the moves its cut carries
        self.before: Dict[int, Dict[int, GroupMap]] = {}
        self.after: Dict[int, Dict[int, GroupMap]] = {}
        #: the ranges packed and not yet held by both replicas of their destination
        self.relay = RangeRelay()
        #: segments that restored the groups of a checkpoint's map after its cut's moves;
        #: at another count, from snapshots holding groups moves had left them
        self.restores_split = self.restores_rescaled = 0
        #: moves a cut prepared (its checkpoint), not carried by a cut yet
        self.prepared: Tuple[GroupMove, ...] = ()
        self.prepared_at = 0
        #: moves packed as their changes since a prepare's bulk (a replica's pack)
        self.by_changes = 0
        #: the last stage's moves with a sink per partition: their cuts and what they hold
        self.sinks = SinkMoves(world, self)
        #: the last cut that carried moves (a joined replica starts with the maps after it)
        self.moves_cut = 0
        #: the count a live rescale's prepared moves (phase 1) make once they move
        self.prepared_count: Optional[int] = None
        #: the pairs started and stopped at live rescales (``--dormant``)
        self.pairs = SimPairs(world, self)

    def cut_begun(self, number: int, cut: int) -> None:
        """Checkpoint ``number`` is begun: the coordinator takes the snapshots of the pairs
        that hold nothing at its cut as written (``SimPairs.empty_at``)."""
        w = self.world
        dormant = self.pairs.empty_at(number, self.before.get(number, {}))
        w.coordinator.begin(number, cut, dormant=dormant)
        w.store.dormant_at(number, dormant)
        self.sinks.cut_begun(number, cut)

    def map_of(self, stage: int) -> GroupMap:
        return self.current.get(stage) or GroupMap.even(self.world.partitions, KEY_GROUPS)

    # -- the ingress cuts a checkpoint --------------------------------------------------
    def choose(self, number: int, position: Optional[int] = None,
               last_blocked: bool = False) -> Tuple[GroupMove, ...]:
        """The moves checkpoint ``number``'s cut carries (maybe none); ``position``: its
        cut where known (one ingress), to keep the last stage's moves above ``floor``;
        ``last_blocked``: none of the last stage in any case."""
        moves = self._choose(number, last_blocked or self.sinks.blocked(position))
        self.sinks.chosen(number, moves)
        if moves:
            self.moves_cut = number
        return moves

    def _choose(self, number: int, last_blocked: bool) -> Tuple[GroupMove, ...]:
        self.before[number] = dict(self.current)
        moves: Tuple[GroupMove, ...] = ()
        if not self.pairs.running(0):  # no cut moves groups while a join is applied: the
            self.after[number] = dict(self.current)  # joined replicas start from the
            return moves  # maps before it, and learn every later move cut in band
        last = self.world.stages
        if self.prepared and last_blocked and any(m.stage == last for m in self.prepared):
            self.after[number] = dict(self.current)  # their second phase waits for the floor
            return moves
        if self.prepared:  # their second phase, at this cut or a later one
            if self.rng.random() < MOVE_CHANCE:
                moves, self.prepared = self.prepared, ()
                for s in {m.stage for m in moves}:
                    self.current[s] = self.map_of(s).moved([m for m in moves if m.stage == s])
                if self.prepared_count is not None:
                    self.pairs.rescaled_to(self.prepared_count, number)
                    self.prepared_count = None
            self.after[number] = dict(self.current)
            return moves
        count = None
        if self.counts and not last_blocked and self.rng.random() < MOVE_CHANCE and \
                self.pairs.running(self.counts[0]):  # every stage
            count = self.counts.pop(0)
            self.pairs.rescaling_to(count)
            target = GroupMap.even(count, KEY_GROUPS, self.world.partitions)
            for s in range(1, self.world.stages + 1):
                moves += tuple(self.map_of(s).moves_to(target, s))
                self.current[s] = target
            self.rescaled += 1
        elif self.left and self.world.stages > last_blocked and self.rng.random() < MOVE_CHANCE:
            move = self._draw(last_blocked)
            self.current[move.stage] = self.map_of(move.stage).moved([move])
            self.left -= 1
            moves = (move,)
        if moves and self.rng.random() < 0.5:  # two phases: this cut prepares them
            for s in {m.stage for m in moves}:
                self.current[s] = self.before[number].get(s)
                if self.current[s] is None:
                    del self.current[s]
            self.prepared, self.prepared_at = moves, number
            self.prepared_count = count
            moves = tuple(m.prepared() for m in moves)
        elif count is not None:
            self.pairs.rescaled_to(count, number)
        self.after[number] = dict(self.current)
        return moves

    def _draw(self, last_blocked: bool) -> GroupMove:
        """A range inside one run of groups of one owner (half the time all of it: a
        schedule's few keys fall in few groups), to another partition; of a stage before
        the last where the last may not move at this cut (``last_stage_blocked``)."""
        rng = self.rng
        w = self.world
        stage = rng.randint(1, w.stages - last_blocked)
        first, last, source = rng.choice(self.map_of(stage).ranges())
        lo, hi = first, last
        if rng.random() < 0.5:
            lo = rng.randint(first, last)
            hi = rng.randint(lo, min(last, lo + rng.choice((0, 3, 40, 255))))
        dest = rng.choice([p for p in range(self.world.partitions) if p != source])
        return GroupMove(stage, lo, hi, source, dest)

    @property
    def done(self):
        """Moves whose range both replicas of the destination held."""
        return self.relay.done

    # -- what the replicas report ---------------------------------------------------------
    def report(self, e, host_name: str) -> None:
        if isinstance(e, PackRange):  # (the runtime packs it later, off its loop)
            e = RangePacked(e.number, e.move, e.addr, pack_state(e.parts))
        if isinstance(e, RangePacked):
            self.by_changes += e.over is not None
            wrong = self.relay.packed(e)
            if wrong is not None:
                raise Violation(wrong)
        else:
            self.relay.installed(e, host_name, self.world.host_of.get)

    # -- the controller sends a range ------------------------------------------------------
    def steps(self, steps: List[tuple], hosts: List[str]) -> None:
        """An ``install-range`` step per replica of a destination that may take it."""
        w = self.world
        self.pairs.steps(steps, hosts)
        keys = list(self.relay.packs)
        for key, addr, name in self.relay.unsent(w.host_of.get):
            if not w.alive.get(name) or name in w.faults.zombies:
                continue
            seg = w.hosts[name].machines.get(addr)
            if seg is None or not seg.ready_for(None, InstallRange(key[0], key[1], b"")):
                continue
            steps.append(("install-range", keys.index(key), addr.replica))
            hosts.append(CONTROLLER)

    def apply(self, step: tuple) -> List[Addr]:
        """Send a range to one replica of its destination (returns that replica), or
        restart the job: the checkpoint of a move of the last stage will not complete."""
        w = self.world
        if step[0] == "move-stuck":
            self.sinks.restart_stuck()
            return []
        if step[0] in ("join", "leave"):
            self.pairs.apply(step)
            return []
        key = list(self.relay.packs)[step[1]]
        addr = Addr(key[1].stage, key[1].dest, step[2])
        host = w.hosts[w.host_of[addr]]
        msg = self.relay.send(key, addr, host.name)
        w.net.touched(host.name, addr)
        w.effects(*host.run_local(host.machines[addr].on_message(None, msg)), host=host)
        return [addr]

    # -- a restart --------------------------------------------------------------------
    def restarted(self, k: Optional[int]) -> None:
        """The job starts again from checkpoint ``k`` (None: the beginning): its map is the
        manifest's; ranges in flight are of cuts the restart forgets, or in its state."""
        self.current = dict(self.after[k] if k in self.after else self.initial)
        self.world.builder.groups = dict(self.current)
        if self.pairs.dormant:  # the pairs owning groups run again, the others dormant
            self.prepared_count = None
            self.pairs.restarted(k, self.current)
            if any(m.dest >= self.pairs.live for m in self.prepared):  # onto pairs dormant
                self.prepared = ()  # again: the rescale would be asked anew (dropped here)
        self.relay.forget()
        self.sinks.restarted(k)
        if k is None or k < self.prepared_at:  # prepared at a cut the restart undoes
            self.prepared, self.prepared_count = (), None

    def at_new_count(self) -> None:
        """The job runs at another count than the checkpoint it restored: every stage's
        partitions own contiguous ranges again (the runtime's ``restore_maps``); a move
        prepared at the old count is dropped."""
        self.current = {}
        self.world.builder.groups = {}
        self.prepared, self.prepared_count = (), None

    def held(self, k: Optional[int], stage: int, count: int) -> GroupMap:
        """The groups each partition's snapshot of checkpoint ``k`` (of ``count``
        partitions) holds of ``stage``: the map before its cut's moves."""
        held = self.before.get(k, {}).get(stage)
        return held if held is not None else GroupMap.even(count, KEY_GROUPS)

    def split(self, k: int, stage: int) -> Optional[Tuple[GroupMap, GroupMap]]:
        """The maps before and after checkpoint ``k``'s moves of ``stage``, where it
        carried some (its snapshots then hold the groups of the map before)."""
        before = self.before.get(k, {}).get(stage)
        after = self.after.get(k, {}).get(stage)
        if before == after:
            return None
        even = GroupMap.even(self.world.partitions, KEY_GROUPS)
        return before or even, after or even


def restore_split(world, chains, addr, segment, maps: Tuple[GroupMap, GroupMap]) -> None:
    """``segment`` restores the groups it owns after a checkpoint's moves from the
    snapshots of its stage's partitions, which hold the groups of the map before."""
    before, after = maps
    stage = world.dataflow.stages[addr.stage - 1]
    keyed = [store is not None for store in segment.chain.keyed_stores()]
    sources = sorted({int(before.owner(g)) for g in after.groups_of(addr.partition)}
                     | {addr.partition})
    fresh = segment.chain.get_state()  # a dormant partition's chain reads nothing
    states = {q: rebuild(world.store.read(chains[addr.stage, q])) if chains[addr.stage, q]
              else fresh for q in sources}
    segment.chain.install_state(regrouped_states(stage, keyed, states, addr.partition,
                                                 before, after))


def expected_state(states_after, moves: SimMoves, position, snap) -> list:
    """The failure-free state of ``snap``'s partition after the inputs up to its cut, of
    the groups it owned there (the map before the cut's own moves)."""
    count = moves.world.partitions
    parts = states_after[count][position(snap.cut)][snap.addr.stage - 1]
    groups = moves.before.get(snap.number, {}).get(snap.addr.stage)
    if groups is None:
        return parts[snap.addr.partition]
    stage = moves.world.dataflow.stages[snap.addr.stage - 1]
    keyed = [True] * len(stage.operators)
    even = GroupMap.even(count, KEY_GROUPS)
    return wire_form(regrouped_states(stage, keyed, dict(enumerate(parts)),
                                      snap.addr.partition, even, groups))


def final_states(states: list, moves: SimMoves) -> list:
    """The failure-free run's states per stage and partition (at contiguous ranges), each
    partition's being those of the groups the moves left it."""
    count = moves.world.partitions
    even = GroupMap.even(count, KEY_GROUPS)
    out = []
    for s, parts in enumerate(states, 1):
        groups = moves.current.get(s)
        if groups is None:
            out.append(parts)
            continue
        stage = moves.world.dataflow.stages[s - 1]
        keyed = [True] * len(stage.operators)
        out.append([regrouped_states(stage, keyed, dict(enumerate(parts)), p, even, groups)
                    for p in range(count)])
    return out
