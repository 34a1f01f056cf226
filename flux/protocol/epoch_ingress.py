"""One of several ingresses, each reading a source partition of its own and numbering its
inputs in epochs (DESIGN 12, docs/design/parallel_io.md).

Ingress ``i`` of ``k`` gives the inputs of its epoch ``e`` the numbers after
``epoch_first(e, i, k)`` (``flux.sequence``): above every input of an earlier epoch or of
a lower ingress in the same epoch, so stage 1's merges order all of them one way and no
central counter is needed. Ending an epoch (``advance_epoch``) is the ingress's promise
that it sends nothing more below the next epoch's numbers: its pending inputs leave as
an item first, then its progress bound moves there and the merges release the other
ingresses' items up to it.

With an input log the bound also waits for the log, epochs' starts included: a bound
lets merges release, and sinks commit, the other ingresses' items below it, so a
restart must not number a replayed input under it (the simulator found this rule).
A checkpoint's cut is an epoch's end, the same for every ingress (``cut_at_epoch``).
Live moves of key groups ride it (DESIGN 13): each ingress switches its router for stage
1 when it *ends* the cut's epoch, after the epoch's last item left, not when told (it
may still be numbering inputs below the cut then), so every input below the cut goes by
the old map and every one above by the new, whichever ingress read it.
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

from exchange.group_map import GroupMove, stage_moves
from exchange.routing import moved
from flux.effects import CutPassed
from flux.errors import LocalProtocolError
from flux.protocol.ingress import Ingress
from flux.sequence import EPOCH_INPUTS, NO_PROGRESS, SN, epoch_first


class EpochIngress(Ingress):
    """Ingress ``index`` of ``ingresses``, numbering in epochs."""

    def __init__(self, *args: Any, index: int, ingresses: int, **kwargs: Any):
        if ingresses < 2:
            raise ValueError(f"epochs are for several ingresses, got {ingresses}")
        super().__init__(*args, index=index, **kwargs)
        self.ingresses = ingresses
        #: the epoch it numbers in, and the number below its inputs of that epoch
        self.epoch = 0
        self.floor = self.accepted = epoch_first(0, index, ingresses)
        #: checkpoints whose cut ends an epoch it has not ended yet: (number, epoch, the
        #: live moves the cut carries), told with ``CutPassed`` and the moves taken into
        #: its router when it does
        self.cut_epochs: List[Tuple[int, int, Tuple[GroupMove, ...]]] = []

    # -- numbering ---------------------------------------------------------------
    def _room(self) -> int:
        """Numbers left in the current epoch."""
        return self.floor + EPOCH_INPUTS - 1 - self.accepted

    def frontier(self) -> SN:
        """Every item not sent yet gets an SN above this: the held items', or the last
        item's, or the epoch's start; with an input log, no more than the log holds."""
        last = self.held[0][0] - 1 if self.held else max(self.last_item, self.floor)
        if self.log_inputs:
            last = min(last, self.logged)
        return (last,) if last else NO_PROGRESS

    def can_accept(self, record: Any = None) -> bool:
        """A full epoch takes no more input until it ends."""
        return self._room() > 0 and super().can_accept(record)

    def accept(self, record: Any):
        if self._room() <= 0:
            return None
        return super().accept(record)

    def accept_many(self, records: Any) -> int:
        room = self._room()
        return super().accept_many(records[:room]) if room > 0 else 0

    # -- epochs ------------------------------------------------------------------
    def can_advance(self) -> bool:
        """May the epoch end now? Its pending inputs leave as an item first, which needs
        room in every buffer (never forced: that would let buffers grow past capacity)."""
        return not self.pending or self.can_cut()

    def advance_epoch(self, epoch: int) -> List:
        """End the current epoch and number from ``epoch`` on: the pending inputs leave
        as an item, then the bound moves below ``epoch``'s numbers (in that order: an
        item sent under a bound the merges trusted breaks the order). Returns a
        ``CutPassed`` for each checkpoint whose epoch this ends."""
        if epoch <= self.epoch:
            raise LocalProtocolError(f"{self.addr}: epoch {epoch} after epoch {self.epoch}")
        if self.pending and not self.cut_item():
            raise LocalProtocolError(f"{self.addr}: epoch {self.epoch} ends with inputs "
                                     "pending and no room for their item (can_advance)")
        self.epoch = epoch
        self.floor = self.accepted = epoch_first(epoch, self.index, self.ingresses)
        passed = [c for c in self.cut_epochs if c[1] < epoch]
        self.cut_epochs = [c for c in self.cut_epochs if c[1] >= epoch]
        for _, _, moves in passed:  # the inputs from here on lie above those cuts
            self.router = moved(self.router, stage_moves(moves, 1))
        return [CutPassed(k, self.epoch_cut(e), self.index, self.inputs) for k, e, _ in passed]

    def log_due(self) -> bool:
        """Are items, or the start of an epoch, waiting for the input log?"""
        return super().log_due() or (self.log_inputs and self.floor > self.logged)

    # -- checkpoints and restarts ---------------------------------------------------
    def epoch_cut(self, epoch: int) -> int:
        """The cut after every input of ``epoch`` and the epochs before, of every ingress."""
        return epoch_first(epoch + 1, 0, self.ingresses)

    def epoch_decided(self) -> int:
        """The lowest epoch a checkpoint's cut may end here (``cut_at_epoch``)."""
        return self.epoch

    def cut_at_epoch(self, number: int, epoch: int, moves: Sequence[GroupMove] = ()) -> None:
        """Checkpoint ``number`` covers every input of the epochs up to ``epoch`` of every
        ingress: one cut for all, at an epoch's end, so each ingress stamps it by itself
        and no input lies on both sides. It travels on every batch from here on, with the
        live ``moves`` of key groups that take effect at it (DESIGN 13);
        ``advance_epoch`` says when this ingress passed it, and switches its router then.
        ``epoch`` must not be one it ended already: it sent items above the cut without
        the stamp, routed by the old map."""
        if epoch < self.epoch:
            raise LocalProtocolError(f"{self.addr}: checkpoint {number} at the end of epoch "
                                     f"{epoch}, which it ended already (it is in {self.epoch})")
        if self.out.cut is not None and number <= self.out.cut[0]:
            raise LocalProtocolError(f"checkpoint {number} after checkpoint {self.out.cut[0]}")
        self.out.cut = (number, self.epoch_cut(epoch))
        moves = tuple(moves)
        if moves:
            self.out.move_cuts += ((number, self.epoch_cut(epoch), moves),)
        self.cut_epochs.append((number, epoch, moves))

    def choose_cut(self, number: int, moves: Sequence[GroupMove] = ()) -> List:
        raise LocalProtocolError("several ingresses cut at an epoch's end (cut_at_epoch)")

    def resume_after(self, n: int) -> None:
        """A restart from a checkpoint whose cut ``n`` ends an epoch: numbering goes on
        from the next epoch, whose start is logged before the bound tells it (should
        that checkpoint be found damaged later, a restart from an older one must still
        number no input under that bound)."""
        if self.inputs or self.pending or self.epoch:
            raise LocalProtocolError("resume of an ingress that accepted inputs")
        span = self.ingresses * EPOCH_INPUTS
        if n % span:
            raise LocalProtocolError(f"a restart of several ingresses after input {n}, "
                                     "which is no epoch's end")
        self.epoch = n // span
        self.floor = epoch_first(self.epoch, self.index, self.ingresses)
        self.accepted = self.last_item = self.floor
        self.logged = n
