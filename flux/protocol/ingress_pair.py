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

Not yet: a lost replica rebuilt on a standby (catch-up), checkpoints (the cut would be
one more entry of the log) and the durable input log beside the twin.
"""
from __future__ import annotations

from collections import deque
from enum import Enum
from typing import Any, Deque, List, Set, Tuple

from flux.addresses import Addr, P, other
from flux.data_messages import IngressLog, LogAck, Reverse
from flux.effects import Send
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.protocol.epoch_ingress import EpochIngress
from flux.protocol.flux_producer import FluxProducer
from flux.protocol.ingress import Ingress

#: the "connection" to its twin among ``flushable()``'s: the log leaves with the flushes
TWIN = (-1, -1)

ITEM, EPOCH = "item", "epoch"


class IngressRole(Enum):
    LEADING = "leading"  # decides items and epochs, tells its twin before they leave
    FOLLOWING = "following"  # cuts what its twin decided, nothing of its own
    ALONE = "alone"  # its twin is dead: decides alone, once it cut all it heard


LEADING, FOLLOWING, ALONE = IngressRole.LEADING, IngressRole.FOLLOWING, IngressRole.ALONE


class PairedIngress:
    """One replica of a pair of ingresses; mixed in before ``Ingress`` or ``EpochIngress``."""

    def __init__(self, *args: Any, replica: int, **kwargs: Any):
        super().__init__(*args, replica=replica, **kwargs)
        self.dual = Addr(0, self.index, other(replica))
        self.role = LEADING if replica == P else FOLLOWING
        #: the leader's items and bound wait for its twin, as for an input log
        self.log_inputs = self.role is LEADING
        #: the leader's entries its twin has not acked: (number, entry, input position)
        self.decided: Deque[Tuple[int, Tuple[str, int], int]] = deque()
        self.seq = 0  # entries decided
        self.told = 0  # entries sent to the twin
        #: the follower's entries heard and not cut yet, and how many it heard in all
        self.to_follow: Deque[Tuple[str, int]] = deque()
        self.heard = 0

    def _producer(self, peers, capacity, batch_size, buffer_factory, absent, window,
                  pause_room):
        """A producer replica as a segment's (5.1): data to the same replica of each
        stage-1 pair, acks from the other; ``fprod`` takes the take-over's events."""
        self.fprod = FluxProducer(self.addr, peers, capacity, batch_size, frozenset(absent),
                                  buffer_factory, window, pause_room)
        return self.fprod.out

    def _follows(self) -> bool:
        """Does it cut what its twin decided (a follower, or alone with entries left)?"""
        return self.role is FOLLOWING or bool(self.to_follow)

    # -- the source side -------------------------------------------------------------
    def can_accept(self, record: Any = None) -> bool:
        if self._follows():
            return self._room_to_follow() > 0
        return super().can_accept(record)

    def accept(self, record: Any):
        if self._follows() and self._room_to_follow() <= 0:
            return None
        return super().accept(record)

    def accept_many(self, records: Any) -> int:
        if self._follows():
            room = self._room_to_follow()
            return super().accept_many(records[:room]) if room > 0 else 0
        return super().accept_many(records)

    def _room_to_follow(self) -> int:
        """Inputs it may still take before the next entry it follows: those of the item
        it heard of next (none before an epoch's start)."""
        if not self.to_follow:
            return 0
        kind, value = self.to_follow[0]
        return value - self.accepted if kind == ITEM else 0

    def can_cut(self) -> bool:
        if self._follows():
            return self._can_follow()
        return super().can_cut()

    def cut_item(self, force: bool = False) -> int:
        """The leader's item (told to its twin); a follower's are the ones it heard of."""
        if self._follows():
            return self._follow()
        x = super().cut_item(force)
        if x and self.role is LEADING:
            self._decide((ITEM, x), x)
        return x

    def can_advance(self) -> bool:
        return not self._follows() and super().can_advance()

    def advance_epoch(self, epoch: int) -> List:
        if self._follows():
            raise LocalProtocolError(f"{self.addr}: follows its twin's epochs")
        effects = super().advance_epoch(epoch)
        if self.role is LEADING:
            self._decide((EPOCH, epoch), self.floor)
        return effects

    def _decide(self, entry: Tuple[str, int], position: int) -> None:
        self.seq += 1
        self.decided.append((self.seq, entry, position))

    def _can_follow(self) -> bool:
        if not self.to_follow:
            return False
        kind, value = self.to_follow[0]
        if kind == EPOCH:
            return not self.pending
        return self.accepted == value and super().can_cut()

    def _follow(self) -> int:
        """Cut the items and start the epochs its twin decided, in order, as far as its
        inputs and buffers allow; returns the last item cut (0: none)."""
        last = 0
        while self._can_follow():
            kind, value = self.to_follow[0]
            if kind == EPOCH:
                super().advance_epoch(value)
            elif not self.pending:
                raise LocalProtocolError(f"{self.addr}: item {value} heard of twice")
            else:
                last = super().cut_item()
            self.to_follow.popleft()
        return last

    # -- the log to the twin, which leaves with the flushes -------------------------------
    def log_due(self) -> bool:
        return False  # its log is its twin (the durable input log beside it: not yet)

    def flushable(self):
        connections = super().flushable()
        if self.role is LEADING and self.told < self.seq:
            return list(connections) + [TWIN]
        return connections

    def flush(self, i: int, d: int) -> List:
        if (i, d) != TWIN:
            return super().flush(i, d)
        if self.role is not LEADING or self.told >= self.seq:
            return []
        entries = tuple(e for n, e, _ in self.decided if n > self.told)
        first, self.told = self.told + 1, self.seq
        return [Send(self.addr, self.dual, IngressLog(first, entries))]

    # -- messages and views ------------------------------------------------------------------
    def on_message(self, src: Addr, msg) -> List:
        if isinstance(msg, IngressLog):
            return self._on_log(src, msg)
        if isinstance(msg, LogAck):
            return self._on_log_ack(src, msg)
        if isinstance(msg, Reverse):
            return self.fprod.on_reverse(src, msg)
        return super().on_message(src, msg)

    def _on_log(self, src: Addr, msg: IngressLog) -> List:
        if src != self.dual or self.role is LEADING:
            raise RemoteProtocolError(f"{self.addr}: an ingress log from {src}")
        if msg.first != self.heard + 1:
            raise RemoteProtocolError(f"{self.addr}: log entries from {msg.first}, "
                                      f"{self.heard} heard")
        self.to_follow.extend(msg.entries)
        self.heard += len(msg.entries)
        return [Send(self.addr, self.dual, LogAck(self.heard))]

    def _on_log_ack(self, src: Addr, msg: LogAck) -> List:
        if src != self.dual:
            raise RemoteProtocolError(f"{self.addr}: a log ack from {src}")
        position = 0
        while self.decided and self.decided[0][0] <= msg.upto:
            position = self.decided.popleft()[2]
        if self.role is LEADING and position > self.logged:
            return self.inputs_logged(position)
        return []

    def on_fail(self, dead: Set[Addr]) -> List:
        """Dead stage-1 replicas as a producer's (5.2); a dead twin: it leads alone."""
        effects = self.fprod.on_fail(dead)
        if self.dual in dead and self.role is not ALONE:
            if self.role is LEADING and self.held:
                effects += self.inputs_logged(self.accepted)  # no twin to wait for
            self.role, self.log_inputs = ALONE, False
            self.decided.clear()
            self.told = self.seq  # nothing more for its twin
        return effects

    def on_avail(self, avail, peer_mover=None) -> List:
        self.fprod.on_avail(avail)
        return []

    def idle(self) -> bool:
        return super().idle() and not self.to_follow and self.told == self.seq

    # -- checkpoints: not yet for a pair -------------------------------------------------
    def choose_cut(self, number: int) -> List:
        raise LocalProtocolError("checkpoints with pairs of ingresses are not built yet")

    def cut_at_epoch(self, number: int, epoch: int) -> None:
        raise LocalProtocolError("checkpoints with pairs of ingresses are not built yet")


class IngressReplica(PairedIngress, Ingress):
    """A replica of the one ingress, numbering 1, 2, 3, ... (no epochs)."""


class EpochIngressReplica(PairedIngress, EpochIngress):
    """A replica of one of several ingresses, numbering in epochs."""
