"""A segment's checkpoint snapshots (DESIGN 10, docs/design/checkpoints.md): the operators'
state after every input up to a cut and none beyond, whole or as the keyed stores'
changes since this replica's last snapshot (flux.snapshot_chain); and the packing of a
state for the store or a new replica, where a state that cannot be encoded is the
operator's error.

A part of ``flux.protocol.segment.Segment`` (its attributes are the segment's).
"""
from __future__ import annotations

from itertools import chain
from typing import Iterable, List, Optional

from exchange.group_map import changes_owners_of
from flux.digests import Digest, KeyedSums, bytes_digest, group_pairs
from flux.effects import Snapshot
from flux.errors import LocalProtocolError, OperatorError
from flux.keyed_state import KeyedState
from flux.keys import MISSING
from flux.operator import describe
from flux.protocol.segment_mode import DRAINING, PROCESSING, STREAMING, Event
from flux.snapshot_chain import delta_snapshot, full_snapshot
from flux.state_codec import pack_state, paused_gc


class CheckpointSide:
    """The checkpoint events of a segment; mixed into ``Segment``."""

    def snapshot_due(self) -> bool:
        """Has the merge passed a checkpoint's cut (nothing of inputs up to it can be
        released any more) that this replica has not snapshotted?"""
        cuts = self.cuts
        if not (cuts.pending or cuts.moves) or self.awaiting_range() or \
                self.mode not in (PROCESSING, STREAMING, DRAINING):
            return False  # (a range due: nothing past its cut, DESIGN 13)
        frontier = self.fcons.frontier()  # asked only with a cut ahead: on every item
        return (bool(cuts.pending) and cuts.due(frontier) is not None) or \
            (bool(cuts.moves) and cuts.moves_due(frontier) is not None)

    def both_replicas_write(self) -> bool:
        """Does the cut it crosses next move the key groups of ``both_write_stage`` (the
        last stage, with a sink per partition)? Then both replicas of every pair write
        their snapshot (the first counts): that checkpoint must complete through a single
        failure, since the egresses hold the moved keys' outputs until one covers its cut,
        and a replica rebuilt after the cut cannot write it (docs/design/rescaling.md)."""
        if self.both_write_stage is None or not (self.cuts.moves and self.cuts.pending):
            return False
        due = self.cuts.due(self.fcons.frontier())
        moved = self.cuts.moves.get(due[0]) if due is not None else None
        return moved is not None and changes_owners_of(moved[1], self.both_write_stage)

    def snapshot(self, keep: bool = True) -> List:
        """Local work: the operators' state after every input up to the cut, none beyond.
        ``keep`` False: cross the cut without packing it (its twin writes the checkpoint,
        DESIGN 10); ``data`` is then None. The state is whole, or the keyed stores' changes
        since this replica's last snapshot (``base``): whole the first time, once in
        ``full_every``, and after a crossing without packing or a lost write."""
        self._next(Event.PROCESS)
        frontier = self.fcons.frontier()
        due, moved_at = self.cuts.due(frontier), self.cuts.moves_due(frontier)
        if moved_at is not None and (due is None or moved_at < due[0]):
            # the moves of a cut this replica snapshotted (the step before), or whose
            # checkpoint it never learned: a step of their own, after the snapshot
            moves = self.cuts.cross_moves(moved_at)
            self.fcons.moves_crossed = self.cuts.moves_crossed  # told in its acks, credits
            return self.cross_moves(moved_at, moves)
        if due is None:
            raise LocalProtocolError(f"{self.addr}: snapshot with no cut crossed")
        k, n = due
        self.cuts.crossed(k)
        stores = self._stores()
        digest = self._digest(k, n, stores)
        keyed = [i for i, store in enumerate(stores) if store is not None]
        if not keep:
            self.snapshot_lost()
            self._digest_baseline(stores)
            return [Snapshot(k, n, self.addr, None, digest=digest)]
        base = self.chain_base
        incremental = (base is not None and keyed and self.deltas_since_full + 1 < self.full_every
                       and all(stores[i].records_changes for i in keyed))
        if incremental:
            data = self._packed(lambda: delta_snapshot(
                k, base, self.chain.get_state(skip=keyed), self._changes(stores, keyed)),
                f"checkpoint {k}", (n,))
        else:
            data = self._packed(lambda: full_snapshot(k, self.chain.get_state()),
                                f"checkpoint {k}", (n,))
        self.deltas_since_full = self.deltas_since_full + 1 if incremental else 0
        if keyed and self.full_every > 1:  # the baseline of the next delta
            for i in keyed:
                stores[i].start_changes()
            self.chain_base = k
        self._digest_baseline(stores)
        return [Snapshot(k, n, self.addr, data, base if incremental else None, digest)]

    def _digest(self, k: int, n: int, stores: list) -> Optional[Digest]:
        """The operators' states and the outputs since the last cut, digested (DESIGN 14):
        both replicas cross every cut both learn, so the controller can compare them. A
        ``KeyedState``'s digest is its last one plus its changed keys' (a whole pass the
        first time, after its state was installed from elsewhere, where half its keys or
        more changed, and at every ``digest_whole_every``-th checkpoint, in both replicas:
        a value damaged in memory that no record changes again is seen only by a whole
        pass)."""
        if self.outputs is None:
            return None
        outputs, since = self.outputs.crossed(n)
        self.digest_cut = (k, n, self.taken)
        states, groups = [], []
        for i, (op, store) in enumerate(zip(self.chain.operators, stores)):
            if not isinstance(store, KeyedState):
                states.append(bytes_digest(self._packed(op.get_state, f"checkpoint {k}", (n,))))
                groups.append(None)
                continue
            known = self.state_sums.get(i)
            try:
                changes = store.changed_pairs() if known is not None and \
                    store.records_changes and k % self.digest_whole_every else None
                # a changed key costs two pairs' digests, a whole pass one per key
                if changes is not None and 2 * len(changes) < len(store):
                    self.state_sums[i] = known.after(changes)
                else:
                    self.state_sums[i] = KeyedSums.of(store.pairs())
                    if changes is not None:  # most keys change between cuts: record none
                        self.untracked[i] = self.digest_hot_skip
            except Exception as exc:
                raise OperatorError(f"the state of operator {type(op).__name__} (taken for "
                                    f"checkpoint {k})", self.addr.stage, self.addr.partition,
                                    (n,), f"cannot be encoded: {describe(exc)}") from exc
            states.append(self.state_sums[i].total)
            groups.append(self.state_sums[i].groups())
        return Digest(k, n, tuple(states), outputs, since, tuple(groups))

    def probe_keys(self, number: int, cut: int, operator: int, groups: Iterable[int]):
        """``[key, pair digest]`` of operator ``operator``'s keyed store in ``groups`` as it
        was at the cut ``(number, cut)`` (the controller names the first key that differs
        from the twin's, DESIGN 14); None when it cannot say: another cut crossed since, or
        the store took inputs since and did not record its changes (its current state and
        the values its changed keys had at the cut give the state at the cut)."""
        stores = self._stores()
        if self.digest_cut is None or self.digest_cut[:2] != (number, cut) \
                or not 0 <= operator < len(stores):
            return None
        store = stores[operator]
        if not isinstance(store, KeyedState):
            return None
        if not store.records_changes:
            still = self.taken == self.digest_cut[2]  # nothing taken since the cut
            return group_pairs(store.pairs(), groups) if still else None
        changed = {key: was for key, was, _ in store.changed_pairs()}
        unchanged = ((key, value) for key, value in store.pairs() if key not in changed)
        was = ((key, value) for key, value in changed.items() if value is not MISSING)
        return group_pairs(chain(unchanged, was), groups)

    def _digest_baseline(self, stores: list) -> None:
        """This cut is the baseline of the next one's keyed digests: a store records its
        changes from here, unless most of its keys changed since the last cut (a whole
        pass is cheaper, and recording costs every write): then it records none for the
        next ``digest_hot_skip`` cuts, and tries again. A delta snapshot to come needs the
        changes: they are recorded then whatever the digests want."""
        if self.outputs is None:
            return
        delta_next = self.chain_base is not None and self.full_every > 1
        for i, store in enumerate(stores):
            if not isinstance(store, KeyedState):
                continue
            skip = self.untracked.get(i, 0)
            if skip and not delta_next:
                self.untracked[i] = skip - 1
                store.stop_changes()
            else:
                store.start_changes()

    def _changes(self, stores: list, keyed: List[int]) -> list:
        """A delta's part: each keyed store's net changes since the last snapshot."""
        return [[i, stores[i].changes()] for i in keyed]

    def snapshot_lost(self) -> None:
        """Local event: a snapshot of this replica may not be in the store (its write
        failed, or it crossed a cut without packing): the next one is whole."""
        self.chain_base = None
        if self.outputs is None:  # else the digests read the changes since the cut
            for store in self._stores():
                if store is not None:
                    store.stop_changes()


    def _packed(self, state_of, when: str, sn) -> bytes:
        """``state_of()`` packed for the store or a new replica. A state the user's
        operator made that cannot be encoded (or whose ``get_state`` raises) is the
        operator's error, named with its stage, partition and the SN where the state was
        taken: its twin would fail alike, so failing over would not help."""
        try:
            with paused_gc():
                return pack_state(state_of())
        except Exception as exc:
            culprit = "an operator's state"
            for op in getattr(self.chain, "operators", ()):
                try:
                    pack_state(op.get_state())
                except Exception as own:
                    culprit, exc = f"the state of operator {type(op).__name__}", own
                    break
            raise OperatorError(f"{culprit} (taken for {when})", self.addr.stage,
                                self.addr.partition, sn, f"cannot be encoded: "
                                f"{describe(exc)}") from exc
