"""The controller's side of a live move of key groups (DESIGN 13, docs/design/rescaling.md).

The replicas of a move's source partition each pack the range as they cross the move's
cut (``RangePacked``); the controller keeps the first pack and checks the other is the
same bytes (a difference is a divergence of the source's pair). It sends the pack to
each replica of the destination (``InstallRange``) until that replica, *in the process
that hosts it now*, says it holds it (``RangeInstalled``): a standby that replaces a
destination replica gets it again (its twin's state may predate the install, and an
install twice is acknowledged, not installed twice). Once both replicas of the
destination hold it, the pack is dropped.

A prepare's bulk (``move.prepare``) is relayed alike, and kept until its move is held
by both replicas of the destination: a replica rebuilt before it installed the move
needs the bulk again, and the move's pack may be only the changes since it. The two
replicas of a source pack the same form unless one was rebuilt after the prepare (it
packs the range whole): packs of one form are compared, the first of any is sent.

The same object serves the simulator and the runtime's controller service, which
decide when a send may happen (the simulator as a step, the service at once).
"""
from __future__ import annotations

from typing import Callable, Dict, Iterator, Optional, Set, Tuple

from exchange.group_map import GroupMove
from flux.addresses import P, S, Addr
from flux.control_messages import InstallRange, RangeInstalled, RangePacked

MoveKey = Tuple[int, GroupMove]
#: the process that hosts a segment now (None: none does)
ProcessOf = Callable[[Addr], Optional[str]]


class RangeRelay:
    """Ranges packed and not yet held by both replicas of their destination."""

    def __init__(self) -> None:
        #: per move (or prepare): the pack sent on, (the bulk it changes, data)
        self.packs: Dict[MoveKey, Tuple[Optional[int], bytes]] = {}
        #: per move: each form packed (the bulk's checkpoint or None) and its bytes
        self.forms: Dict[MoveKey, Dict[Optional[int], bytes]] = {}
        #: per move: (replica, process) it was sent to, and those that said they hold it
        self.sent: Dict[MoveKey, Set[Tuple[Addr, str]]] = {}
        self.confirmed: Dict[MoveKey, Set[Tuple[Addr, str]]] = {}
        #: moves whose range both replicas of the destination held (a late pack is old)
        self.done: Set[MoveKey] = set()

    def packed(self, e: RangePacked) -> Optional[str]:
        """A source replica's pack; what is wrong when it differs from its twin's."""
        key = (e.number, e.move)
        if key in self.done:
            return None
        if key not in self.packs:
            self.packs[key] = (e.over, e.data)
            self.forms[key] = {e.over: e.data}
            self.sent[key], self.confirmed[key] = set(), set()
            return None
        known = self.forms[key].setdefault(e.over, e.data)
        if known != e.data:
            return (f"the replicas of stage {e.move.stage} partition {e.move.source} packed "
                    f"different states of key groups {e.move.first}..{e.move.last} at "
                    f"checkpoint {e.number} ({len(known)} and {len(e.data)} bytes): the "
                    f"pair diverged")
        return None

    def installed(self, e: RangeInstalled, process: str, process_of: ProcessOf) -> bool:
        """``process`` says its replica ``e.addr`` holds the range; True once both
        replicas of the destination, where they are hosted now, do."""
        key = (e.number, e.move)
        if key not in self.packs:
            return False
        confirmed = self.confirmed[key]
        confirmed.add((e.addr, process))
        if e.move.prepare or \
                not all((a, process_of(a)) in confirmed for a in _replicas(e.move)):
            return False
        bulk = e.move.prepared()
        for old in [k for k in self.packs if k == key or (k[1] == bulk and k[0] < e.number)]:
            del self.packs[old], self.forms[old], self.confirmed[old], self.sent[old]
        self.done.add(key)
        return True

    def unsent(self, process_of: ProcessOf) -> Iterator[Tuple[MoveKey, Addr, str]]:
        """Every (move, destination replica, its process) the range was not sent to."""
        for key in self.packs:
            for addr in _replicas(key[1]):
                process = process_of(addr)
                if process is not None and (addr, process) not in self.sent[key] and \
                        (addr, process) not in self.confirmed[key]:  # (a source's copy)
                    yield key, addr, process

    def send(self, key: MoveKey, addr: Addr, process: str) -> InstallRange:
        """The range for ``addr`` in ``process``, counted as sent there."""
        self.sent[key].add((addr, process))
        over, data = self.packs[key]
        return InstallRange(key[0], key[1], data, over)

    def forget(self) -> None:
        """The job restarts from a checkpoint: ranges in flight are of cuts it forgets
        or in its state already."""
        self.packs.clear()
        self.forms.clear()
        self.sent.clear()
        self.confirmed.clear()

    def pending(self) -> int:
        """Packs (of moves and prepares) held to send."""
        return len(self.packs)

    def staged(self, number: int, move: GroupMove, process_of: ProcessOf) -> bool:
        """Do both replicas of the destination, where hosted now, hold the bulk of the
        prepare at checkpoint ``number`` (its move's cut can pause them least now)?"""
        confirmed = self.confirmed.get((number, move), ())
        return all((a, process_of(a)) in confirmed for a in _replicas(move))


def _replicas(move: GroupMove) -> Tuple[Addr, Addr]:
    return Addr(move.stage, move.dest, P), Addr(move.stage, move.dest, S)
