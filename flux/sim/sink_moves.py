"""Live moves of the last stage's key groups with a sink per partition, in the simulator
(docs/design/rescaling.md).

A move of the last stage's groups from partition A to B at cut C sends their keys'
outputs of inputs past C to B's sink. Sinks commit ahead of the cuts, so a restart from
before C would replay those outputs by the map before the move. What keeps the output
exactly once, each rule a protocol rule the runtime follows too:

- *hold*: A's and B's egresses send nothing numbered past C to their sinks until a
  complete checkpoint covers C (``Egress.holds``; told here at once when one completes,
  the earliest the controller could);
- *one at a time*: no checkpoint is cut while one whose cut moved the last stage is not
  complete (a replica told two cuts at once crosses only the newer: the older would
  never complete, and the newer needs A's and B's commits past C);
- *both write*: every replica of every pair writes its snapshot of that checkpoint
  (``Segment.both_replicas_write``; the first counts), so one lost replica never keeps
  it open (its rebuilt replica starts past the cut and cannot write it);
- *stuck*: if that checkpoint cannot complete all the same (a write failed, the store
  refused its manifest, a pair was lost), the job restarts from the newest complete one,
  before C (A and B committed nothing past it); stuck for any other reason is a
  violation (``restart_stuck``);
- *floor*: a move of the last stage is cut past every output any sink committed (after
  a restart the sinks hold outputs the replay makes again);
- *no way back*: once a complete checkpoint covers C, no restart goes to one before it.

The oracle follows the moves: each failure-free output's sink partition is the owner of
its last-stage key group in the map in force at its input (``last_stage_maps``).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from exchange.group_map import GroupMap, changes_owners_of
from exchange.partitioner import KEY_GROUPS
from flux.protocol.egress import Egress
from flux.sim.config import EGRESS_HOST
from flux.sim.oracle import Violation


class SinkMoves:
    """The cuts that moved the last stage's groups, and what they hold."""

    def __init__(self, world, moves):
        self.world, self.moves = world, moves
        #: the job's first partition count (a drained rescale changes it)
        self.first_count = world.partitions
        #: checkpoint -> its cut (None until cut): those whose moves changed the last
        #: stage's owners, in this incarnation's line (a restart drops those past its cut)
        self.cuts: Dict[int, Optional[int]] = {}
        #: the newest of those cuts a complete checkpoint covers: no restart goes before it
        self.covered = 0
        #: counted: cuts that moved the last stage's groups; restarts because the
        #: checkpoint of one could not complete (``stuck``)
        self.moved = self.stuck_restarts = 0
        #: each failure-free output's sink partition where those moves changed them
        #: (None: the reference run's; ``flux.sim.oracle.settled_parts``)
        self.parts: Optional[list] = None

    def _apart(self) -> bool:
        return not self.world.config.ordered_output

    # -- the rules ------------------------------------------------------------------------
    def blocked(self, position: Optional[int]) -> bool:
        """May no move of the last stage take effect at a cut at ``position`` (None: not
        known yet, the cut is floored instead: ``floor``)?"""
        return self._apart() and position is not None and self.floor() > position

    def floor(self) -> int:
        """The input past which a move of the last stage may be cut: the newest any sink
        partition committed an output of (0: none, or one ordered sink)."""
        if not self._apart() or self.world.config.move_last_without_floor:
            return 0
        sink = self.world.sink
        committed = [sink.last_committed(p) for p in sink.held]
        return max((sn[0] for sn in committed if sn is not None), default=0)

    def open_checkpoint(self) -> Optional[int]:
        """A checkpoint whose cut moved the last stage and that no complete one covers
        yet (None: none): no other is cut meanwhile."""
        covered = self.newest_complete()[1]
        for k, cut in sorted(self.cuts.items()):
            if cut is not None and cut > covered:
                return k
        return None

    def stuck(self) -> bool:
        """Nothing else can happen and such a checkpoint is not complete: the job restarts
        (``restart_stuck``)."""
        return self._apart() and self.open_checkpoint() is not None

    def restart_stuck(self) -> None:
        """The job restarts (``stuck``): a violation unless a fault beyond one failure at a
        time explains it (both replicas write the snapshots of that checkpoint, so a lost
        replica never keeps it open: a write failed, a file of the store was damaged, or a
        pair was lost)."""
        k = self.open_checkpoint()
        w = self.world
        if k not in w.store.write_failed and not w.outcome.damaged and not w.outcome.pair_lost:
            raise Violation(f"checkpoint {k}, whose cut {self.cuts[k]} moved the last "
                            f"stage's key groups, cannot complete with no write failed, "
                            f"no file damaged and no pair lost: it waits for "
                            f"{w.coordinator.missing(k)}")
        self.stuck_restarts += 1
        w.restarts.due = True

    # -- what happens -----------------------------------------------------------------------
    def chosen(self, number: int, moves) -> None:
        """Checkpoint ``number``'s cut carries ``moves``."""
        last = self.world.stages
        if self._apart() and changes_owners_of(moves, last):
            self.cuts[number] = None  # (its cut comes with ``cut_begun``)

    def cut_begun(self, number: int, cut: int) -> None:
        """Checkpoint ``number`` was cut at ``cut``: if it moved the last stage, the
        outputs past it go to other sink partitions."""
        if number in self.cuts:
            self.cuts[number] = cut
            self.moved += 1
            self.world.on_parts_changed()

    def checkpoint_complete(self, number: int, cut: int) -> None:
        """Checkpoint ``number`` (cut ``cut``) is complete: each egress of one partition
        releases what it held past the moves' cuts up to it."""
        w = self.world
        if not self._apart():
            return
        self.covered = max([self.covered] + [c for c in self.cuts.values()
                                             if c is not None and c <= cut])
        told = [(w.writers.host.get(p, EGRESS_HOST), egress) for p, egress in
                enumerate(w.egresses) if not w.writers.host or w.writers.host.get(p)]
        # a writer started again whose sink is still opening is told too (the controller
        # tells each egress where it runs now; its messages wait for the open)
        told += [(name, writer) for name, writer, _ in w.writers.opening.values()]
        for name, egress in told:
            host = w.hosts.get(name)
            if host is None or not w.alive.get(name) or name in w.faults.zombies or \
                    host.machines.get(egress.addr) is not egress:
                continue
            w.net.touched(name, egress.addr)
            w.effects(*host.run_local(egress.checkpoint_complete(number, cut)), host=host)

    def restarted(self, k: Optional[int]) -> None:
        """The job restarts from checkpoint ``k``: the cuts past it are undone, and the
        outputs past its cut go where they went before them."""
        kept = {n: c for n, c in self.cuts.items() if k is not None and n <= k}
        if kept != self.cuts:
            self.cuts = kept
            self.world.on_parts_changed()

    # -- what the egresses and the oracle read --------------------------------------------
    def newest_complete(self) -> Tuple[int, int]:
        """(number, cut) of the newest complete checkpoint ((0, 0): none): what an egress
        made now is told it covers (a restart's, a writer started again)."""
        manifests = self.world.store.manifests
        if not manifests:
            return 0, 0
        k = max(manifests)
        return k, manifests[k][0]

    def egresses(self, builder) -> list:
        """The driver's egresses of an incarnation, each told the newest complete
        checkpoint: a move at or below its cut holds nothing."""
        egresses = builder.egresses(self.world.config.egress_class or Egress)
        for egress in egresses:
            egress.checkpoint_complete(*self.newest_complete())
        return egresses

    def last_stage_maps(self) -> List[Tuple[int, List[int]]]:
        """The last stage's map in force from each cut on, ``(cut, owners)`` in cut order
        (the first at cut 0): where each output goes. A drained rescale's cut to another
        count starts contiguous ranges at that count (after the moves of that same cut, if
        any: the inputs past it are the new count's)."""
        last, moves = self.world.stages, self.moves
        changes = [(cut, 0, list(moves.after[k][last].owners))
                   for k, cut in self.cuts.items() if cut is not None]
        count = self.first_count
        for cut, new in self.world.outcome.drains:  # (one at the same count changes none)
            if new != count:
                changes.append((cut, 1, list(GroupMap.even(new, KEY_GROUPS).owners)))
            count = new
        first = moves.initial.get(last, GroupMap.even(self.first_count, KEY_GROUPS))
        return [(0, list(first.owners))] + [(cut, owners) for cut, _, owners in
                                            sorted(changes, key=lambda c: c[:2])]
