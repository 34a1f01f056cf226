"""Whole-job restarts (DESIGN 10), and the input log they read the source from again.

Everything stops at once (the driver died, or a pair was lost): the job starts again
from its last complete checkpoint that verifies, or from the beginning without one. The
sink keeps what it committed and drops what it had not.
"""
from __future__ import annotations

from collections import deque
from typing import Deque, Dict, Optional

from controller.key_groups import map_sources
from exchange.group_map import GroupMap
from exchange.partitioner import KEY_GROUPS
from flux.rescale import rescaled_states
from flux.sim.moves import restore_split
from flux.sim.oracle import Violation, settled_oracles
from flux.snapshot_chain import install, rebuild


#: a stuck drained rescale cuts again this many times before it is given up
RECUTS = 3


class Restarts:
    """The input log, and restarting the world from the checkpoint store."""

    def __init__(self, world):
        self.world = world
        #: the input log: how many inputs' SNs are durable (kept across restarts)
        self.logged_inputs = 0
        #: the source's own partitions, each input's by position (None: one partition)
        config = world.config
        self.source_parts = list(config.source_parts) if config.source_parts else None
        #: a pair was lost in this step: the job restarts at its end
        self.due = False
        #: a replica set was lost (cluster pairs, 4.2), or a rescale was asked for
        #: (``job.rescale``, DESIGN 13): a checkpoint is to be cut, and the job restarts
        #: from it once it completes (its number; None: none cut yet); which of the two
        self.rebuild_cut = False
        self.rebuild_after: Optional[int] = None
        self.cut_for = ""
        #: checkpoints cut again at a stuck drain's cut (``drain_stuck``)
        self.recuts = 0

    def set_lost(self) -> None:
        """A view failed a whole replica set: the job is rebuilt from a consistent
        snapshot of the surviving set, cut after the loss."""
        self._cut_now("set")

    def rescale_asked(self) -> None:
        """``job.rescale(m)``: a checkpoint is cut now, and the job restarts from it at
        the next count (``rescale_to``)."""
        self._cut_now("rescale")

    def _cut_now(self, why: str) -> None:
        if self.rebuild_after is None and not self.rebuild_cut:
            self.rebuild_cut, self.cut_for = True, why

    def draining(self) -> bool:
        """A rescale of a job with a sink per partition cut its checkpoint: the source
        gives no input past the cut, so every sink commits up to it and no further, and the
        job at the new count writes only outputs above every old sink's (docs/design/
        rescaling.md: a drained rescale, Flink's stop-with-savepoint)."""
        return self._rescale_drains() and self.rebuild_after is not None

    def _rescale_drains(self) -> bool:
        """The rebuild wanted is a rescale of a job with a sink per partition."""
        return self.cut_for == "rescale" and not self.world.config.ordered_output

    def gives_inputs(self) -> bool:
        """May the source give its next input? Not while draining (the broken variant:
        it does)."""
        return not self.draining() or not self.world.config.drain_stops_inputs

    def may_cut(self, accepted: int) -> bool:
        """May the ingress cut a checkpoint after input ``accepted``: one of the schedule's
        or the wanted rebuild's (where it may fall), after an input past the last cut."""
        w = self.world
        return (w.checkpoints_left > 0 or self.rebuild_cut and self.cut_ready(accepted)) \
            and accepted > w.last_cut

    def drain_stuck(self) -> bool:
        """Draining, and no checkpoint since the drain's cut completed (a manifest, as the
        store holds it): asked when everything else is idle, so none will (a replica died
        before its snapshot, and no input is left to carry a later cut). The job cuts
        another at the same place, as the runtime asks again when a checkpoint is
        abandoned; after ``RECUTS`` of them it gives the rescale up (``job.rescale`` fails
        and the job goes on at its count: a checkpoint cannot complete while a replica
        that writes snapshots is lost and not rebuilt)."""
        return self.draining() and not any(
            k >= self.rebuild_after for k in self.world.store.manifests)

    def stuck(self) -> Optional[tuple]:
        """With nothing else to do: a live move's checkpoint of the last stage that will
        not complete (``SinkMoves.stuck``), or a drain's (``drain_stuck``). The move's
        first: while it is open no checkpoint is cut, a drain's cut again neither (the
        runtime's ``DriverCheckpoints.maybe_cut``)."""
        if self.world.moves.sinks.stuck():
            return ("move-stuck",)
        return ("drain-stuck",) if self.drain_stuck() else None

    def recut(self) -> bool:
        """The drain is stuck: cut again (True), or give the rescale up (False)."""
        self.recuts += 1
        if self.recuts <= RECUTS:
            return True
        self.rebuild_after, self.cut_for, self.recuts = None, "", 0
        self.world.outcome.rescales_given_up += 1
        return False

    def cut_ready(self, cut: int) -> bool:
        """May the wanted rebuild's cut be ``cut`` (an SN: with one ingress, the inputs
        before it)? A drained rescale's only past every output a sink committed
        (``cut_floor``)."""
        return cut >= self.cut_floor()

    def drain_cut(self) -> bool:
        """Is the cut chosen now a drained rescale's (its first, or one again)? It carries
        no move of the last stage (the runtime's ``DriverCheckpoints.moves_cut``)."""
        return self._rescale_drains() and (self.rebuild_cut or self.rebuild_after is not None)

    def cut_floor(self) -> int:
        """The SN the wanted rebuild's cut must reach (0: any): a drained rescale's cut
        falls past every output a sink committed. After a restart from an older
        checkpoint the sinks hold outputs the replay makes again, and the new count would
        write them to other sink partitions, where no committed SN drops them."""
        if not (self.rebuild_cut and self._rescale_drains()) \
                or not self.world.config.drain_past_sinks:  # (the broken variant)
            return 0
        sink = self.world.sink
        committed = [sink.last_committed(p) for p in sink.held]
        return max((sn[0] for sn in committed if sn is not None), default=0)

    def drain_epoch(self) -> Optional[int]:
        """Several ingresses: the epoch whose end a drain's cut is, past which no ingress
        accepts an input (None: not draining, or the broken variant's drain)."""
        if not self.draining() or self.gives_inputs():
            return None
        cut = self.world.epochs.cuts.get(self.rebuild_after)
        return None if cut is None else cut[0]

    def cut_at_epoch(self) -> None:
        """Several ingresses: a checkpoint cut at an epoch's end, every ingress stamping
        it; the rebuild's at or past ``cut_floor``."""
        w = self.world
        number = len(w.outcome.cuts) + 1
        # a move of the last stage: past what sinks hold (its cut moves there), so none at
        # a drain's cut: past the drain's epoch no input comes until the restart
        moves = w.moves.choose(number, last_blocked=self.drain_cut())
        floor = max(self.cut_floor(), w.moves.sinks.floor() if number in w.moves.sinks.cuts
                    else 0)
        cut = w.epochs.choose_cut(w.ingresses, number, w.last_cut, w.rng, floor, moves)
        if self.take_cut(cut) != number:
            raise AssertionError(f"checkpoint {number} numbered otherwise by the restarts")
        w.begin_checkpoint(number, cut)

    def take_cut(self, cut: int) -> int:
        """The ingresses cut a checkpoint at ``cut`` (an SN): its number. The rebuild's,
        if one is wanted and may fall there; else one of the schedule's (a drain's cut
        again is neither)."""
        w = self.world
        number = len(w.outcome.cuts) + 1
        if not self.cut_taken(number, cut) and not self.draining():
            w.checkpoints_left -= 1
        return number

    def cut_taken(self, number: int, cut: int) -> bool:
        """Checkpoint ``number`` was cut at ``cut``: the rebuild's, if one is wanted and
        may fall there."""
        if not self.rebuild_cut or not self.cut_ready(cut):
            return False
        self.rebuild_cut, self.rebuild_after = False, number
        return True

    def completed(self, k: int) -> None:
        """Checkpoint ``k`` is complete: the rebuild restarts from it (or a newer one)."""
        if self.rebuild_after is not None and k >= self.rebuild_after:
            self.due = True

    def restart(self, driver_lives: bool = False) -> None:
        """Restart the job. When a pair was lost the driver lives on and first commits
        what the sink was handed, as the runtime's supervisor does (it is the failure-free
        prefix: its inputs' SNs are in the input log).

        The checkpoint restored is the newest complete one whose files all verify: one
        that does not is skipped for good (a fallback); if none does, the job stops
        (``checkpoint_corrupt``). The input log must still cover its cut."""
        w = self.world
        outcome, store = w.outcome, w.store
        if driver_lives:
            w.sink.commit()
        w.sink.drop_uncommitted()
        drained = self.rebuild_after if self.draining() else None
        if self.rebuild_after is not None and self.cut_for == "set":
            outcome.sets_rebuilt += 1
        self.due = self.rebuild_cut = False
        self.rebuild_after = None
        self.recuts = 0
        skipped = len(outcome.fallbacks)
        k = store.restorable()
        if k is None and len(outcome.fallbacks) > skipped:
            outcome.checkpoint_corrupt = (
                "no complete checkpoint verifies: skipped "
                + ", ".join(map(str, outcome.fallbacks[skipped:])))
            w.stopped = True  # the runtime's CheckpointCorrupt
            return
        restored = None if k is None else (k, store.manifests[k][0])
        cut = 0 if restored is None else restored[1]
        if outcome.drains and cut < outcome.drains[-1][0]:
            # the outputs up to a drained rescale's cut are in the old count's sink
            # partitions: a replay from before it would write them to the new count's
            outcome.checkpoint_corrupt = (
                f"no checkpoint since the rescale at cut {outcome.drains[-1][0]} verifies "
                f"(checkpoint {k} is from before it)")
            w.stopped = True
            return
        if cut < w.moves.sinks.covered:
            # a complete checkpoint covers a move of the last stage's groups: the sinks
            # may hold those keys' outputs past its cut in the partitions it moved them to
            outcome.checkpoint_corrupt = (
                f"no checkpoint since the move of the last stage's key groups at cut "
                f"{w.moves.sinks.covered} verifies (checkpoint {k} is from before it)")
            w.stopped = True
            return
        logged = self.source_parts is not None or w.epochs is not None
        if logged and cut < store.log_from:
            raise Violation(f"the input log was truncated past checkpoint {k}'s cut: it covers "
                            f"the inputs after {store.log_from}, the restart reads from "
                            f"input {cut + 1} on")
        w.coordinator.restarted(k)
        w.moves.restarted(k)  # routing by the map of the restored cut
        outcome.restarts.append(k)
        counts = w.config.rescale_to
        if counts and w.config.ordered_output:  # every restart at the next count
            count = counts[(len(outcome.restarts) - 1) % len(counts)]
        elif counts and drained is not None and k is not None and k >= drained:
            count = counts[len(outcome.drains) % len(counts)]  # the drained cut's restart
            w.judge_drain(cut)  # no sink committed past it
            outcome.drains.append((cut, count))
        else:  # a sink per partition, each up to its own SN: only a drained cut rescales
            count = w.partitions
        if counts and rescale(w, count) and restored is not None:
            outcome.rescales += 1  # from a checkpoint: its state split
            if not w.config.ordered_output:
                w.on_parts_changed()
        if restored is not None and count_of(store.manifests[k][1]) != w.partitions:
            w.moves.at_new_count()  # contiguous ranges at the new count (``restore_maps``)
        if w.config.cuts_follow_restore:
            w.last_cut = cut
        store.chains = {}  # every replica starts anew: its first snapshot is whole
        if self.source_parts is not None:
            self._interleave_anew(self.logged_inputs)
        elif w.epochs is not None and w.epochs.plan.redraw(cut, *w.epochs.logged_for(cut)):
            w.inputs[:] = w.epochs.plan.inputs  # inputs the log did not cover: other epochs
            w.on_reorder(w.inputs, w.epochs.plan.numbers)
        if restored is None:
            w.next_input = 0
        w.build(restored)

    def _interleave_anew(self, logged: int) -> None:
        """A source of several partitions read again from a checkpoint's position: the
        log fixes the order of the first ``logged`` inputs, the rest may come in any
        interleaving that keeps each partition's own order."""
        w = self.world
        rest = list(zip(w.inputs[logged:], self.source_parts[logged:]))
        queues: Dict[int, Deque] = {}
        for item in rest:
            queues.setdefault(item[1], deque()).append(item)
        merged = []
        while queues:
            part = w.rng.choice(sorted(queues))
            merged.append(queues[part].popleft())
            if not queues[part]:
                del queues[part]
        if merged != rest:
            w.inputs[logged:] = [record for record, _ in merged]
            self.source_parts[logged:] = [part for _, part in merged]
            w.on_reorder(w.inputs)


def rescale(world, partitions: int) -> bool:
    """The job runs again at ``partitions``: its machines, placement and checkpoints at
    the new count, its state split by key group from the checkpoint restored (DESIGN 13;
    one ordered egress: the sink's last SN is the whole job's; a sink per partition: a
    drained cut, a sink partition per new partition). Did the count change?"""
    if partitions == world.partitions:
        return False
    world.partitions = world.builder.partitions = partitions
    world.placement = world.config.placement_for(partitions)
    world.coordinator.rescaled(partitions)
    if not world.config.ordered_output:  # a sink partition and its oracle per partition
        world.sink_partitions = partitions
        world.settled_oracles = settled_oracles(world)
    return True


def restore(world, chains: Dict, addr, segment) -> None:
    """``segment`` starts from its partition's state in a checkpoint's ``chains``, as the
    runtime's restore: its own chain at the same count, else the key groups it owns of the
    old partitions' (``flux.rescale``). A pair of ingresses holds no operator state: it
    follows its split's log past the cut instead (``World.build``)."""
    if addr.stage == 0:
        return
    old = count_of(chains)
    if old != world.partitions and world.config.split_rescaled:
        # the groups each old partition's snapshot holds (the map before the cut's moves,
        # as the manifest names it), split into contiguous ranges at the new count
        held = world.moves.held(world.restored, addr.stage, old)
        world.moves.restores_rescaled += held != GroupMap.even(old, KEY_GROUPS)
        new = GroupMap.even(world.partitions, KEY_GROUPS)
        stage = world.dataflow.stages[addr.stage - 1]
        keyed = [store is not None for store in segment.chain.keyed_stores()]
        states = {q: rebuild(world.store.read(chains[addr.stage, q]))
                  for q in map_sources(addr.partition, held, new)}
        segment.chain.install_state(rescaled_states(stage, keyed, states, addr.partition,
                                                    held, new))
        return
    maps = world.moves.split(world.restored, addr.stage)
    if maps is not None:  # the checkpoint's cut carried live moves of this stage
        restore_split(world, chains, addr, segment, maps)
        world.moves.restores_split += 1
        return
    chain = chains.get((addr.stage, addr.partition))
    if chain:  # (none: the broken variant's; empty: a dormant partition's, which starts empty)
        install(segment.chain, world.store.read(chain))


def count_of(chains: Dict) -> int:
    """The partition count of a checkpoint's chains ((stage, partition) -> chain)."""
    return 1 + max(p for _, p in chains)
