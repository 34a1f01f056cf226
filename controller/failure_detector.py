"""The failure detector's policy: when the controller declares a process dead.

Pure (DESIGN 2, 6): the controller service feeds it what it heard and when,
the simulator feeds it simulated time, and both act on the verdicts it
returns. The rules, in the order they are checked:

- a dropped connection is a death at once: the kernel of a dead process
  closed its socket (paper 3.2.1's fast path);
- a gap in a connection's sequence numbers is the failure of its sender
  (messages vanished in transit, DESIGN 4.4);
- a process that beats but whose loop has not turned for ``stuck_after`` is
  *stuck*, reported, not dead; past ``stuck_timeout`` it serves no one and is
  declared dead;
- a process silent for ``timeout`` is dead, except that one holding the last
  live replica of some partition gets ``last_replica_timeout``: declaring it
  early stops the job anyway (its pair is lost), and a loaded machine can
  silence a live process for half a second;
- the controller's own stalls (a GC pause of the driver, a starved core) are
  nobody's silence: everyone gets the stalled time back.

Nothing is judged before ``arm``: until the job starts, processes are still
building their operators. A declared process is never watched again by this
machine; its incarnation is over (a zombie that speaks again is fenced by the
service, DESIGN 6).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Dict, List, Union


class Health(enum.Enum):
    ALIVE = "alive"  # heard within the timeout, its loop turns
    STUCK = "stuck"  # heard, but its loop has not turned for ``stuck_after``
    DEAD = "dead"  # declared; never judged again


@dataclass(frozen=True)
class Timings:
    """The detector's knobs, in seconds (docs/operations.md: failures a network hides)."""

    timeout: float = 0.5
    #: the grace of a node holding a last replica (no grace if not above ``timeout``)
    last_replica_timeout: float = 2.0
    stuck_after: float = 1.0
    stuck_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.timeout <= 0 or self.last_replica_timeout <= 0:
            raise ValueError(f"silence timeouts must be positive, got {self.timeout} and "
                             f"{self.last_replica_timeout}")
        if not 0 < self.stuck_after <= self.stuck_timeout:
            raise ValueError(f"need 0 < stuck_after ({self.stuck_after}) <= stuck_timeout "
                             f"({self.stuck_timeout})")


@dataclass
class Watched:
    """What the detector knows of one process."""

    seen: float  # when it was last heard (moved forward by the controller's stalls)
    health: Health = Health.ALIVE
    stuck_for: float = 0.0  # the longest loop lag it reported while stuck


# -- verdicts ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Declared:
    """Declare ``name`` dead, because ``why``."""

    name: str
    why: str


@dataclass(frozen=True)
class Stuck:
    name: str
    lag: float


@dataclass(frozen=True)
class Unstuck:
    name: str
    longest: float


@dataclass(frozen=True)
class Stalled:
    """The controller itself did not turn for ``seconds``; that silence was discounted."""

    seconds: float


Verdict = Union[Declared, Stuck, Unstuck, Stalled]


class FailureDetector:
    """Per-process records and the rules above; time comes in as an argument."""

    def __init__(self, timings: Timings = Timings()):
        self.timings = timings
        self.watched: Dict[str, Watched] = {}
        self.armed = False
        self._last_turn: Union[float, None] = None

    # -- membership ----------------------------------------------------------------------
    def watch(self, name: str, now: float) -> None:
        """Start watching ``name`` (it registered) as heard ``now``."""
        self.watched[name] = Watched(now)

    def forget(self, name: str) -> None:
        """``name`` is dead by another route (fenced with its replica set, it stopped on
        its own): never judged again."""
        self.watched.pop(name, None)

    def arm(self, now: float) -> None:
        """The job starts: from now on silence and stuck loops count. Every watched
        process starts its clock now (it was building its operators until now)."""
        self.armed = True
        for record in self.watched.values():
            record.seen = now

    def disarm(self) -> None:
        """The job stops: its processes fall silent and close on purpose; nothing more is
        judged."""
        self.armed = False

    def live(self) -> List[str]:
        return [n for n, r in self.watched.items() if r.health is not Health.DEAD]

    def stuck(self) -> Dict[str, float]:
        return {n: r.stuck_for for n, r in self.watched.items() if r.health is Health.STUCK}

    # -- events --------------------------------------------------------------------------
    def heard(self, name: str, now: float) -> None:
        """Any message from ``name`` proves it was alive at ``now``."""
        record = self.watched.get(name)
        if record is not None and record.health is not Health.DEAD:
            record.seen = max(record.seen, now)

    def heartbeat(self, name: str, lag: float, now: float) -> List[Verdict]:
        """``name`` beat from its liveness thread; its loop last turned ``lag`` ago."""
        record = self.watched.get(name)
        if record is None or record.health is Health.DEAD:
            return []
        self.heard(name, now)
        if not self.armed:
            return []  # before the start: building its operators is not being stuck
        t = self.timings
        if lag > t.stuck_timeout:
            return self._declare(name, f"its loop has not turned for {lag:.1f}s")
        if lag > t.stuck_after:
            first = record.health is not Health.STUCK
            record.health = Health.STUCK
            record.stuck_for = max(record.stuck_for, lag)
            return [Stuck(name, lag)] if first else []
        if record.health is Health.STUCK:
            record.health = Health.ALIVE
            longest, record.stuck_for = record.stuck_for, 0.0
            return [Unstuck(name, longest)]
        return []

    def connection_dropped(self, name: str) -> List[Verdict]:
        """The TCP connection to ``name`` dropped: its process is gone."""
        return self._declare(name, "its connection dropped")

    def connection_gap(self, name: str, expected: int, got: int) -> List[Verdict]:
        """Messages from ``name`` vanished in transit: its link, and so it, failed."""
        return self._declare(name, f"connection gap {expected}->{got}")

    def turned(self, now: float, waited: float) -> List[Verdict]:
        """The controller's loop turns at ``now`` after waiting up to ``waited`` for
        messages: time beyond that since the last turn was its own stall."""
        last, self._last_turn = self._last_turn, now
        if last is None:
            return []
        stalled = now - last - waited
        if stalled <= self.timings.timeout / 4:
            return []
        for record in self.watched.values():
            record.seen += stalled
        return [Stalled(stalled)]

    def tick(self, now: float, holds_last_replica: Callable[[str], bool]) -> List[Verdict]:
        """Judge silences at ``now``. ``holds_last_replica(name)``: would declaring
        ``name`` dead lose a pair (the recovery logic knows)?

        A silence past ``timeout`` but within ``last_replica_timeout`` is declared only
        if its process holds no last replica, and that depends on who else is dead: so
        at most one such declaration per tick. Two partners silenced together by a load
        spike: the first is declared, the caller acts on it, and at the next tick the
        second holds the last replica and gets its grace (declaring both at once would
        lose the pair to one stall)."""
        if not self.armed:
            return []
        t = self.timings
        verdicts: List[Verdict] = []
        judged_by_replicas = False
        for name, record in list(self.watched.items()):
            if record.health is Health.DEAD:
                continue
            silent = now - record.seen
            if silent <= t.timeout:
                continue
            if silent <= t.last_replica_timeout:
                if judged_by_replicas or holds_last_replica(name):
                    continue
                judged_by_replicas = True
            verdicts += self._declare(name, f"silent for {silent:.3f}s")
        return verdicts

    def _declare(self, name: str, why: str) -> List[Verdict]:
        record = self.watched.get(name)
        if not self.armed or record is None or record.health is Health.DEAD:
            return []  # before the start nothing is judged (the job fails to start instead)
        record.health = Health.DEAD
        return [Declared(name, why)]


class Lease:
    """The node's half (DESIGN 6): a node that has heard nothing from the controller for
    ``length`` stops on its own. The controller declares a silent node dead after its
    ``timeout`` (shorter), so a node cut off from the controller is already replaced when
    it stops, and one that comes back after being declared dead finds itself fenced."""

    def __init__(self, length: float, now: float):
        if length <= 0:
            raise ValueError(f"a lease must be positive, got {length}")
        self.length = length
        self.heard_at = now

    def heard(self, now: float) -> None:
        """A message from the controller arrived (polled) at ``now``."""
        self.heard_at = max(self.heard_at, now)

    def expired(self, now: float) -> bool:
        return now - self.heard_at > self.length

    def silent_for(self, now: float) -> float:
        return now - self.heard_at
