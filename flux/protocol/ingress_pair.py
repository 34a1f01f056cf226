"""A pair of ingresses: two replicas reading one source partition, so that the death of
either is masked like any producer replica's (docs/design/parallel_io.md, DESIGN 12).

Replica ``r`` of ingress ``i`` is a producer replica as a segment's F-Prod is (paper
5.1): it sends its items to replica ``r`` of every stage-1 partition and takes acks from
replica ``1 - r``; a stage-1 replica whose data source dies reverses to its twin (5.2).
That needs both replicas to cut the same items with the same SNs, and items and epochs
end where a clock says, not where the data does. So one replica **leads**: it decides
where items and epochs end and tells its twin (``IngressLog``) before any of it leaves:
its items and its progress bound wait for the twin's ``LogAck``, as they wait for the
durable input log (``Ingress.log_inputs``). The twin **follows**: it reads the same
source partition and cuts exactly the items and epochs it heard of, never one of its
own. Whatever a consumer holds from the leader, the twin heard of; what the twin never
heard of never left. When the leader dies, the twin first cuts what it heard, then
decides **alone**; when the follower dies, the leader stops waiting for it.

A checkpoint's cut is one more entry of the log: the coordinator tells the leader
(``cut_at_epoch``), which logs ``("cut", number, epoch)`` before any entry of a later
epoch, so the follower stamps the same cut on its batches before it passes that epoch,
whether or not it heard the coordinator. After a take-over the coordinator tells the
replica alone again (it may never have heard the entry). Both replicas report passing
the cut (``CutPassed``, on the flush path): either may be the one alive.

A lost replica is rebuilt on a standby (``flux.protocol.ingress_catchup``). Every entry
is also written to the split's durable log (by the follower, or by a replica alone)
before what it numbers leaves, so a restart numbers the split's inputs again as they
were (``flux.protocol.ingress_journal``).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Deque, List, Sequence, Set, Tuple

from exchange.group_map import GroupMove
from flux.addresses import Addr, P, other
from flux.data_messages import IngressLog, LogAck, Restore, Reverse, Stay
from flux.errors import LocalProtocolError
from flux.protocol.epoch_ingress import EpochIngress
from flux.protocol.flux_producer import FluxProducer
from flux.protocol.ingress_catchup import AWAITING_STATE, IngressCatchUp
from flux.protocol.ingress_journal import SplitJournal
from flux.protocol.ingress_twin_log import (  # noqa: F401 (the pair's vocabulary, from here)
    ALONE,
    CUT,
    EPOCH,
    FOLLOWING,
    ITEM,
    LEADING,
    TWIN,
    IngressRole,
    TwinLog,
    cut_entry,
    cut_moves,
)
from flux.protocol.segment_mode import CatchUp
from flux.sequence import epoch_first


#: the source marks a replica keeps (cuts are reported within a few loop turns)
MARKS_KEPT = 16


class PairedIngress(TwinLog, SplitJournal, IngressCatchUp):
    """One replica of a pair of ingresses; mixed in before ``EpochIngress``."""

    def __init__(self, *args: Any, replica: int, **kwargs: Any):
        super().__init__(*args, replica=replica, **kwargs)
        self.dual = Addr(0, self.index, other(replica))
        self.role = LEADING if replica == P else FOLLOWING
        #: items and bounds wait for the log: the leader's for its twin's ack, a
        #: follower's and one alone's for their own writes (``SplitJournal``)
        self.log_inputs = True
        #: the leader's entries its twin has not acked: (index, entry, input position)
        self.decided: Deque[Tuple[int, Tuple, int]] = deque()
        #: entries it has to write to the split's log: (index, entry, input position)
        self.journal: Deque[Tuple[int, Tuple, int]] = deque()
        self.seq = 0  # the index of the last entry decided or heard (the file's)
        self.told = 0  # the leader's: entries sent to the twin
        #: the follower's entries heard and not cut yet
        self.to_follow: Deque[Tuple] = deque()
        #: checkpoints' cuts it passed following its twin, not reported yet (flush path)
        self.unreported: List = []
        #: the leader's passes of cuts, waiting for its twin to hold the entry of the
        #: epoch start that passed them: (that entry's index, the ``CutPassed``s)
        self.held_reports: Deque[Tuple[int, List]] = deque()
        #: where its split's source stood at recent counts, (count, position), opaque here:
        #: a twin rebuilt from its state seeks there (``flux.connector_api.SeekableSplits``)
        self.source_marks: Deque[Tuple[int, Any]] = deque(maxlen=MARKS_KEPT)

    def _producer(self, peers, capacity, batch_size, buffer_factory, absent, window,
                  pause_room):
        """A producer replica as a segment's (5.1): data to the same replica of each
        stage-1 pair, acks from the other; ``fprod`` takes the take-over's events."""
        self.fprod = FluxProducer(self.addr, peers, capacity, batch_size, frozenset(absent),
                                  buffer_factory, window, pause_room)
        return self.fprod.out

    def await_state(self) -> None:
        super().await_state()
        self.role = FOLLOWING

    def install_numbering(self, epoch: int, accepted: int, last_item: int,
                          inputs: int) -> None:
        """Number on from where its twin was when it sent its state."""
        self.epoch, self.floor = epoch, epoch_first(epoch, self.index, self.ingresses)
        self.accepted = self.logged = accepted
        self.last_item, self.inputs = last_item, inputs

    def decides(self) -> bool:
        """Does it end its own epochs (it leads, or is alone with nothing left to
        follow)? A follower's end where its twin said."""
        return self.running() and not self._follows()

    def _follows(self) -> bool:
        """Does it cut what its twin decided (a follower, or alone with entries left)?"""
        return self.role is FOLLOWING or bool(self.to_follow)

    # -- the source side -------------------------------------------------------------
    def can_accept(self, record: Any = None) -> bool:
        if not self._may_take():
            return False
        if self._follows():
            return self._room_to_follow() > 0
        return super().can_accept(record)

    def accept(self, record: Any):
        if not self._may_take() or (self._follows() and self._room_to_follow() <= 0):
            return None
        return super().accept(record)

    def accept_many(self, records: Any) -> int:
        if not self._may_take():
            return 0
        if self._follows():
            room = self._room_to_follow()
            return super().accept_many(records[:room]) if room > 0 else 0
        return super().accept_many(records)

    def _room_to_follow(self) -> int:
        """Inputs it may still take before the next entry it follows: those of the item
        it heard of next (none before an epoch's start; a cut takes no input)."""
        entry = next((e for e in self.to_follow if e[0] != CUT), None)
        return entry[1] - self.accepted if entry is not None and entry[0] == ITEM else 0

    def can_cut(self) -> bool:
        if not self._may_take():
            return False
        if self._follows():
            return self._can_follow()
        return super().can_cut()

    def cut_item(self, force: bool = False) -> int:
        """The leader's item (told to its twin); a follower's are the ones it heard of."""
        if self._follows():
            return self._follow()
        x = super().cut_item(force)
        if x:
            self._decide((ITEM, x), x)
        return x

    def can_advance(self) -> bool:
        return self._may_take() and not self._follows() and super().can_advance()

    def advance_epoch(self, epoch: int) -> List:
        if self._follows():
            raise LocalProtocolError(f"{self.addr}: follows its twin's epochs")
        passed = super().advance_epoch(epoch)
        self._decide((EPOCH, epoch), self.floor)
        return self._hold_reports(passed)

    def _can_follow(self) -> bool:
        if not self.to_follow:
            return False
        entry = self.to_follow[0]
        if entry[0] == CUT:
            return True
        if entry[0] == EPOCH:
            return not self.pending
        return self.accepted == entry[1] and super().can_cut()

    def _follow(self) -> int:
        """Cut the items, start the epochs and stamp the cuts its twin decided, in order,
        as far as its inputs and buffers allow; returns the last item cut (0: none)."""
        last = 0
        while self._can_follow():
            entry = self.to_follow[0]
            if entry[0] == CUT:
                if not self._stamped(entry[1]):  # (a take-over may have told it already)
                    EpochIngress.cut_at_epoch(self, entry[1], entry[2], cut_moves(entry))
            elif entry[0] == EPOCH:
                if entry[1] != self.epoch or self.accepted != self.floor:
                    self.unreported += super().advance_epoch(entry[1])
                # (else the epoch a restart numbers from, which it is in: logged again)
            elif not self.pending:
                raise LocalProtocolError(f"{self.addr}: item {entry[1]} heard of twice")
            else:
                last = super().cut_item()
            self.to_follow.popleft()
        return last

    # -- messages and views ------------------------------------------------------------------
    def ready_for(self, src: Addr, msg) -> bool:
        """A replica moving its state or waiting for one takes no message."""
        return self.running() and super().ready_for(src, msg)

    def on_message(self, src: Addr, msg) -> List:
        if isinstance(msg, IngressLog):
            return self._on_log(src, msg)
        if isinstance(msg, LogAck):
            return self._on_log_ack(src, msg)
        if isinstance(msg, Reverse):
            return self.fprod.on_reverse(src, msg) + self._maybe_start()
        if isinstance(msg, Restore):
            return self.fprod.on_restore(src, msg)
        if isinstance(msg, Stay):
            return self.fprod.on_stay(src, msg) + self._maybe_start()
        return super().on_message(src, msg)

    def on_fail(self, dead: Set[Addr]) -> List:
        """Dead stage-1 replicas as a producer's (5.2); a dead twin: it leads alone (and a
        catch-up of the twin is over)."""
        if self.mode is AWAITING_STATE:
            self.missed.append(("fail", set(dead)))
            return []
        effects = self.fprod.on_fail(dead)
        if self.dual in dead and self.catchup is not None:
            effects += self.abort_catchup()
        if self.dual in dead and self.role is not ALONE:
            # the entries its twin had not acked: it writes them itself (its twin may have,
            # the same at the same places)
            self.journal.extend(self.decided)
            self.decided.clear()
            self.role = ALONE
            self.told = self.seq  # nothing more for its twin
            self._release_reports(float("inf"))  # its own count is the split's now
        return effects + self._maybe_start()

    def on_avail(self, avail, peer_mover=None) -> List:
        """A standby for a stage-1 replica (5.3), or for its own twin: rebuild it."""
        if self.mode is AWAITING_STATE:
            self.missed.append(("avail", avail))
            return []
        self.fprod.on_avail(avail)
        if avail.addr == self.dual:
            self.catchup = CatchUp(avail.version, peer_mover)
        return self._maybe_start()

    def idle(self) -> bool:
        return (super().idle() and not self.to_follow and not self.journal
                and (self.role is not LEADING or self.told == self.seq)
                and not self.unreported and not self.held_reports and self.running())

    # -- checkpoints: the cut is an entry of the log -------------------------------------
    def cut_at_epoch(self, number: int, epoch: int, moves: Sequence[GroupMove] = ()) -> None:
        """The coordinator's cut at the end of ``epoch``, with the live ``moves`` it
        carries. The leader stamps it and logs it (moves and all) before any later
        epoch's start, so its twin stamps it, and switches its router, in the same place;
        one alone stamps it (told again after a take-over: it may never have heard the
        entry). A follower takes it from its leader's log only: told directly, it
        ignores it (its leader was told too, or a take-over tells it again). A cut it
        knows already, stamped or still to follow, is not taken twice. One that still
        follows a dead leader's entries takes it after them: a cut among them, stamped
        later, would otherwise look told already, and its moves be lost."""
        if self.role is FOLLOWING or self._knows_cut(number):
            return
        if epoch < self.epoch_decided():
            raise LocalProtocolError(f"{self.addr}: checkpoint {number} at the end of epoch "
                                     f"{epoch}; it follows its twin to {self.epoch_decided()}")
        entry = cut_entry(number, epoch, moves)
        if self.to_follow:
            self.to_follow.append(entry)
        else:
            super().cut_at_epoch(number, epoch, moves)
        if self.role is LEADING:  # (alone: no twin to tell; a restart ignores cuts logged)
            self._decide(entry, 0)

    def takes_cut(self, number: int, epoch: int) -> bool:
        """Would ``cut_at_epoch`` stamp this cut now? Not a follower (its leader's log
        tells it), not a cut it knows, not one at an epoch it is bound past (refused:
        that checkpoint never completes)."""
        return (self.role is not FOLLOWING and not self._knows_cut(number)
                and epoch >= self.epoch_decided())

    def epoch_decided(self) -> int:
        """The epoch it is bound to reach: its own, or the last its twin decided that it
        has still to follow (a cut must end no epoch before it: a twin that follows this
        one would hear the cut after that epoch's end)."""
        return max([self.epoch] + [e[1] for e in self.to_follow if e[0] == EPOCH])


class EpochIngressReplica(PairedIngress, EpochIngress):
    """A replica of one of several ingresses, numbering in epochs."""
