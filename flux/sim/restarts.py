"""Whole-job restarts (DESIGN 10), and the input log they read the source from again.

Everything stops at once (the driver died, or a pair was lost): the job starts again
from its last complete checkpoint that verifies, or from the beginning without one. The
sink keeps what it committed and drops what it had not.
"""
from __future__ import annotations

from collections import deque
from typing import Deque, Dict, Optional

from controller.key_groups import sources
from exchange.partitioner import KEY_GROUPS
from flux.rescale import rescaled_states
from flux.sim.oracle import Violation
from flux.snapshot_chain import install, rebuild


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

    def cut_taken(self, number: int) -> bool:
        """Checkpoint ``number`` was cut: the rebuild's, if one is wanted."""
        if not self.rebuild_cut:
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
        if self.rebuild_after is not None and self.cut_for == "set":
            outcome.sets_rebuilt += 1
        self.due = self.rebuild_cut = False
        self.rebuild_after = None
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
        logged = self.source_parts is not None or w.epochs is not None
        if logged and cut < store.log_from:
            raise Violation(f"the input log was truncated past checkpoint {k}'s cut: it covers "
                            f"the inputs after {store.log_from}, the restart reads from "
                            f"input {cut + 1} on")
        w.coordinator.restarted(k)
        outcome.restarts.append(k)
        counts = w.config.rescale_to
        if counts and rescale(w, counts[(len(outcome.restarts) - 1) % len(counts)]) and \
                restored is not None:
            outcome.rescales += 1  # from a checkpoint: its state split
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
    one ordered egress: the sink's last SN is the whole job's). Did the count change?"""
    if partitions == world.partitions:
        return False
    world.partitions = world.builder.partitions = partitions
    world.placement = world.config.placement_for(partitions)
    world.coordinator.rescaled(partitions)
    return True


def restore(world, chains: Dict, addr, segment) -> None:
    """``segment`` starts from its partition's state in a checkpoint's ``chains``, as the
    runtime's restore: its own chain at the same count, else the key groups it owns of the
    old partitions' (``flux.rescale``). A pair of ingresses holds no operator state: it
    follows its split's log past the cut instead (``World.build``)."""
    if addr.stage == 0:
        return
    old = 1 + max(p for _, p in chains)
    if old == world.partitions or not world.config.split_rescaled:
        if (addr.stage, addr.partition) in chains:  # (the broken variant: else empty)
            install(segment.chain, world.store.read(chains[addr.stage, addr.partition]))
        return
    stage = world.dataflow.stages[addr.stage - 1]
    keyed = [store is not None for store in segment.chain.keyed_stores()]
    states = {q: rebuild(world.store.read(chains[addr.stage, q]))
              for q in sources(addr.partition, world.partitions, old, KEY_GROUPS)}
    segment.chain.install_state(rescaled_states(stage, keyed, states, addr.partition,
                                                world.partitions, old, KEY_GROUPS))
