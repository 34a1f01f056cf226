"""The log between the two replicas of a pair of ingresses (docs/design/parallel_io.md):
the leader's decisions (where items and epochs end), in the order it took them, sent
with its flushes; the twin's acks, which let the leader's items and bound go.

A part of ``flux.protocol.ingress_pair.PairedIngress`` (its attributes are the pair's).
"""
from __future__ import annotations

from enum import Enum
from typing import List, Sequence, Tuple

from exchange.group_map import GroupMove, moves_from_wire
from flux.addresses import Addr
from flux.data_messages import IngressLog, LogAck
from flux.effects import Send
from flux.errors import RemoteProtocolError

ITEM, EPOCH, CUT = "item", "epoch", "cut"
#: the "connection" to its twin among ``flushable()``'s: the log leaves with the flushes
TWIN = (-1, -1)


def cut_entry(number: int, epoch: int, moves: Sequence[GroupMove] = ()) -> Tuple:
    """A checkpoint's cut as an entry of the log: its live moves, if any, in wire form
    (the twin switches its router where the leader does, DESIGN 13)."""
    return (CUT, number, epoch) + ((tuple(m.to_wire() for m in moves),) if moves else ())


def cut_moves(entry: Sequence) -> Tuple[GroupMove, ...]:
    """The live moves a cut's entry carries (none: an entry of three fields)."""
    return moves_from_wire(entry[3]) if len(entry) > 3 else ()


class IngressRole(Enum):
    LEADING = "leading"  # decides items and epochs, tells its twin before they leave
    FOLLOWING = "following"  # cuts what its twin decided, nothing of its own
    ALONE = "alone"  # its twin is dead: decides alone, once it cut all it heard


LEADING, FOLLOWING, ALONE = IngressRole.LEADING, IngressRole.FOLLOWING, IngressRole.ALONE


class TwinLog:
    """The leader's side and the follower's of the log; mixed into ``PairedIngress``."""

    def _decide(self, entry: Tuple, position: int) -> None:
        """An entry of its own: told to its twin when it leads, written by itself when
        alone (``flux.protocol.ingress_journal``)."""
        self.seq += 1
        queue = self.decided if self.role is LEADING else self.journal
        queue.append((self.seq, entry, position))

    def flushable(self):
        if not self.running():
            return []
        connections = super().flushable()
        if (self.role is LEADING and self.told < self.seq) or self.unreported:
            return list(connections) + [TWIN]
        return connections

    def flush(self, i: int, d: int) -> List:
        """On the twin's pseudo-connection: the leader's new entries, and the cuts a
        replica passed following its twin (reported as the leader's are)."""
        if (i, d) != TWIN:
            return super().flush(i, d)
        effects, self.unreported = self.unreported, []
        if self.role is not LEADING or self.told >= self.seq:
            return effects
        entries = tuple(e for n, e, _ in self.decided if n > self.told)
        first, self.told = self.told + 1, self.seq
        return effects + [Send(self.addr, self.dual, IngressLog(first, entries))]

    def keeps_up(self, i: int, d: int) -> bool:
        """The twin's pseudo-connection takes no credits: its log waits ``flush_delay``
        to gather entries, as before."""
        return (i, d) != TWIN and super().keeps_up(i, d)

    def _on_log(self, src: Addr, msg: IngressLog) -> List:
        if src != self.dual or self.role is LEADING:
            raise RemoteProtocolError(f"{self.addr}: an ingress log from {src}")
        if msg.first != self.seq + 1:
            raise RemoteProtocolError(f"{self.addr}: log entries from {msg.first}, "
                                      f"{self.seq} heard")
        self.to_follow.extend(msg.entries)
        self._journal(msg.entries)  # acked once written (``journal_written``)
        return []

    def _on_log_ack(self, src: Addr, msg: LogAck) -> List:
        if src != self.dual:
            raise RemoteProtocolError(f"{self.addr}: a log ack from {src}")
        position = 0
        while self.decided and self.decided[0][0] <= msg.upto:
            position = max(position, self.decided.popleft()[2])
        if self.role is LEADING:
            self._logged_upto(position)
        self._release_reports(msg.upto)
        return []

    def _hold_reports(self, passed: List) -> List:
        """The leader's passes of checkpoints' cuts at the epoch start it just decided
        (``CutPassed``, its split's count there) wait until its twin holds that entry:
        should it die first, its twin ends that epoch elsewhere, at a count of its own,
        and a checkpoint recording the leader's would restart the split from inputs the
        twin numbered otherwise (the simulator found this). Alone, they go at once."""
        if not passed or self.role is not LEADING:
            return passed
        self.held_reports.append((self.seq, passed))
        return []

    def _release_reports(self, upto: float) -> None:
        """Reports whose epoch start the twin holds (``upto``: every entry, once alone)
        go on the flush path."""
        while self.held_reports and self.held_reports[0][0] <= upto:
            self.unreported += self.held_reports.popleft()[1]

    def _knows_cut(self, number: int) -> bool:
        """Has it stamped checkpoint ``number``'s cut, or heard it to follow?"""
        return self._stamped(number) or any(e[0] == CUT and e[1] >= number
                                            for e in self.to_follow)

    def _stamped(self, number: int) -> bool:
        cut = self.out.cut
        return cut is not None and cut[0] >= number

    def lead_again(self) -> None:
        """Its new twin holds its state: decisions from here on are told to it (numbered on
        in the split's log, which holds every entry of its own: its state went only
        then); the entries of a dead leader it still follows, its twin has too (they go
        without waiting). The twin's numbering stops before the inputs pending here:
        where their item ends, it has still to hear. The cuts it has still to pass are
        logged again first: one told while its state was on its way is not in it."""
        self.role, self.log_inputs = LEADING, True
        self.told = self.seq
        self.decided.clear()
        for number, epoch, moves in self.cut_epochs:  # cuts told while alone: its twin's too
            self._decide(cut_entry(number, epoch, moves), 0)
        self.logged = max([self.accepted - len(self.pending)]
                          + [self._position(e) for e in self.to_follow])

