"""The controller's side of failures: who is declared dead, and when.

Who is declared dead is the failure detector's policy (``controller.failure_detector``,
DESIGN 6), run on a simulated clock that ticks while anyone is unheard. A crash whose
connections drop is a ``detect`` step, declared at once (3.2.1); a silent one is found by
its silence alone. A process declared dead while it runs is a zombie: it gets no more
views, and its lease is no longer renewed.
"""
from __future__ import annotations

from typing import Dict, List

from controller.failure_detector import Declared, FailureDetector, Lease
from flux.addresses import P, Addr
from flux.errors import PairLost
from flux.sim.config import SIM_CATCHUP_DEADLINE, SIM_LEASE, SIM_TIMINGS


class Detection:
    """The failure detector, the leases and the clock of one incarnation of the job."""

    def __init__(self, world):
        self.world = world
        self.now = 0.0
        self.detector = FailureDetector(SIM_TIMINGS)
        self.leases: Dict[str, Lease] = {}
        for name in world.topology.workers:
            self.detector.watch(name, 0.0)
            self.leases[name] = Lease(SIM_LEASE, 0.0)
        self.detector.arm(0.0)
        #: crashes whose connections dropped, not yet declared (a ``detect`` step each)
        self.crashed_undetected: List[str] = []
        self.silent_crashes: set = set()  # crashed, no FIN: found by silence alone
        self.declared: set = set()

    def detect(self, name: str) -> None:
        """A crashed process's connection dropped: the failure detector declares it dead
        at once (3.2.1), in the next view."""
        self.crashed_undetected.remove(name)
        self._act(self.detector.connection_dropped(name))

    def _act(self, verdicts) -> None:
        for v in verdicts:
            if isinstance(v, Declared) and not self.world.stopped:
                self.declare(v.name)

    def declare(self, name: str) -> None:
        """The controller declares ``name`` dead: views to everyone else. If it still runs
        it is a zombie: it hears no more views and its lease is no longer renewed."""
        w = self.world
        if name in self.crashed_undetected:
            self.crashed_undetected.remove(name)
        self.silent_crashes.discard(name)
        try:
            views = w.recovery.node_failed(name)
        except PairLost as lost:
            if len(w.outcome.restarts) < w.config.restarts_on_pair_lost:
                w.restarts.due = True  # at the end of this step (DESIGN 10)
                return
            w.outcome.pair_lost = [Addr(lost.stage, lost.partition, P)]
            w.stopped = True
            return
        for other in [name] + sorted(w.recovery.dead - self.declared - {name}):
            self.declared.add(other)
            self.detector.forget(other)
            # failed with its replica set (4.2): a crash of its own no longer waits to be
            # found (its silence kept the clock running for ever)
            self.silent_crashes.discard(other)
            if other in self.crashed_undetected:
                self.crashed_undetected.remove(other)
            if w.alive[other]:
                w.faults.zombies.add(other)
                w.net.invalidate()  # its connections now reach it as a zombie
                w.outcome.zombies.append(other)
                w.steps.become_zombie(other)
                if other != name:
                    w.faults.told.add(other)  # failed with its replica set: told to stop (4.2)
        w.broadcast(views)
        if w.recovery.lost_set() is not None and \
                len(w.outcome.restarts) < w.config.restarts_on_pair_lost:
            w.restarts.set_lost()  # cluster pairs: rebuilt from a checkpoint (DESIGN 7)

    # -- the clock ------------------------------------------------------------------
    def clock_runs(self) -> bool:
        """Time matters while someone is unheard or a zombie runs."""
        faults = self.world.faults
        return bool(faults.starved or faults.cut or faults.zombies or self.silent_crashes)

    def tick(self) -> None:
        """One tick of the controller's clock: heal what is due, hear who can be heard,
        renew leases, let the failure detector judge, expire leases and deadlines."""
        w = self.world
        faults, alive = w.faults, w.alive
        now = self.now = self.now + 1
        faults.starved = {n: t for n, t in faults.starved.items() if t > now and alive[n]}
        faults.cut = {n: t for n, t in faults.cut.items() if t > now and alive[n]}
        for name in self.detector.live():
            if alive[name] and name not in faults.cut:
                self.leases[name].heard(now)  # the controller's beats reach it
            if faults.heard(name):
                self.detector.heard(name, now)
        for name in sorted(faults.zombies):
            if faults.heard(name):
                faults.told.add(name)  # it speaks again: told to stop (DESIGN 6)
        self._act(self.detector.tick(now, w.recovery.holds_last_replica))
        for name, lease in sorted(self.leases.items()):
            if alive[name] and lease.expired(now):  # it stops on its own
                if name in self.declared:
                    faults.halt(name)
                else:
                    faults.crash(name)  # it says so: the controller hears it stopped
        self._expire_attempts(now)

    def _expire_attempts(self, now: float) -> None:
        w = self.world
        for addr, version, _ in w.recovery.overdue(now, SIM_CATCHUP_DEADLINE):
            w.outcome.deadlines += 1
            w.broadcast(w.recovery.transfer_failed(addr.stage, addr.partition, version))
