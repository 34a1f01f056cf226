"""The durable epoch log of a split, beside the twin (docs/design/parallel_io.md, step 4
of checkpoints with pairs).

Epochs and items end where a clock says, so a restart would number a split's inputs
otherwise, while sinks may hold outputs of them already (they commit ahead of the
checkpoints). So every entry of the pair's log (an item's end, an epoch's start, a cut)
is written to a file of the split's own before anything it numbers leaves; a restart
follows the entries past its checkpoint's cut, as a follower does its leader's.

**Who writes.** Not the leader: an entry it wrote and its twin never heard may outlive
it, and the twin, alone, decides those inputs otherwise. The **follower** writes what it
heard, in order, and acks its leader only once written: the leader's items wait for
that ack as before, so a written entry is one both replicas hold, and the file needs
no truncation at a take-over. A replica **alone** writes its own decisions (and, if it
led, those its dead twin had not acked: the twin may have written them, the same
entries at the same places). Every replica's items also wait for its own writes: a
follower's items leave once the entries that end them are written.

**One index.** An entry's number in the pair's log is its place in the file: the
follower's count of what it heard, the leader's of what it decided, carried by the
catch-up state, so a new twin writes on where the survivor stopped (whose state goes
only once its own entries are all written) and a restarted pair both start past the
file's last entry.

A part of ``flux.protocol.ingress_pair.PairedIngress`` (its attributes are the pair's).
"""
from __future__ import annotations

from typing import Iterable, List, Tuple

from flux.addresses import Addr
from flux.data_messages import LogAck
from flux.effects import Send
from flux.errors import LocalProtocolError
from flux.protocol.ingress_twin_log import CUT, EPOCH, FOLLOWING, ITEM, LEADING
from flux.sequence import epoch_ended_by, epoch_first


def entries_past(entries: List[Tuple], cut: int, ingresses: int) -> List[Tuple]:
    """The entries of a split's log a restart from the checkpoint whose cut is ``cut``
    follows: from the first start of an epoch after the one the cut ends (all of them
    from the start, ``cut`` 0). Earlier ones number inputs the checkpoint covers."""
    if not cut:
        return list(entries)
    ended = epoch_ended_by(cut, ingresses)
    first = next((n for n, e in enumerate(entries) if e[0] == EPOCH and e[1] > ended),
                 len(entries))
    return list(entries[first:])


class SplitJournal:
    """The entries a replica has to write to its split's log; mixed into ``PairedIngress``."""

    addr: Addr
    dual: Addr

    def log_due(self) -> bool:
        """Has it entries to write (heard, or decided alone)?"""
        return bool(self.journal)

    def unwritten(self) -> List[Tuple[int, Tuple]]:
        """The entries it has to write, in order: (index in the file, entry)."""
        return [(n, entry) for n, entry, _ in self.journal]

    def journal_written(self, upto: int) -> List:
        """Its entries up to index ``upto`` are in the file: the items they end may leave,
        and a follower acks its leader up to there."""
        if not self.journal or upto < self.journal[0][0]:
            raise LocalProtocolError(f"{self.addr}: log written up to {upto}, nothing of it "
                                     "was due")
        position = 0
        while self.journal and self.journal[0][0] <= upto:
            position = max(position, self.journal.popleft()[2])
        self._logged_upto(position)
        if self.role is FOLLOWING:
            return [Send(self.addr, self.dual, LogAck(upto))]
        return self._maybe_start()  # a survivor's state waits for its entries' writes

    def _logged_upto(self, position: int) -> None:
        """Everything it numbered up to ``position`` is in the file (a follower's may lie
        past what it read: it writes what it heard)."""
        if position > self.logged:
            self._release_logged(position)

    def _position(self, entry: Tuple) -> int:
        """How far an entry fixes the numbering: an item's last input, an epoch's start."""
        if entry[0] == ITEM:
            return entry[1]
        if entry[0] == EPOCH:
            return epoch_first(entry[1], self.index, self.ingresses)
        return 0

    def _journal(self, entries: Iterable[Tuple]) -> None:
        for entry in entries:
            self.seq += 1
            self.journal.append((self.seq, entry, self._position(entry)))

    def resume_from_log(self, cut: int, position: int, entries: List[Tuple],
                        index: int) -> None:
        """A restart from the checkpoint whose cut is ``cut`` (0: from the start), where
        the split was read up to input ``position`` (a rebuilt twin reads on from its
        state's count, so the count stays the split's): the split's log holds ``index``
        entries, of which ``entries`` lie past the cut. Both replicas
        follow those first (they are written: their items go at once); new entries go
        after the file's last. Cuts of other checkpoints in it are no longer asked for.
        The first epoch after a cut is logged before a bound tells it: if the file has
        no later start, the leader logs it (its twin, in that epoch already, passes over
        it)."""
        if cut:
            self.resume_after(cut)
        self.inputs = position
        replay = [tuple(e) for e in entries if e[0] != CUT]
        if any(e[0] == EPOCH and e[1] < self.epoch for e in replay):
            raise LocalProtocolError(f"{self.addr}: the log past cut {cut} starts an epoch "
                                     f"before {self.epoch}")
        self.seq = self.told = index
        self.logged = max([self.logged] + [self._position(e) for e in replay])
        self.to_follow.extend(e for e in replay if not (e[0] == EPOCH and e[1] == self.epoch))
        if cut and self.role is LEADING and not any(e[0] == EPOCH for e in replay):
            self._decide((EPOCH, self.epoch), self.floor)
