"""How a Spark task becomes a member of the job: the controller's side of registration.

A task registers with the job's secret (anything else is refused) and is named
by ``name_for``, or held until the job names every task at once, knowing their
hosts (no pair on one host). A named task is welcomed, watched and announced
to everyone (where it listens, and its StateMover); one joining a running job
is welcomed with the view it starts from and becomes a standby (paper 3.3). A
task that keeps failing before its node starts, or whose operator raised on a
record, stops the job with that error (SPARK_NOTES: Spark would retry it
forever).

A part of ``flux.runtime.controller_service.ControllerService`` (its attributes
are the service's), as the segment is split along its seams.
"""
from __future__ import annotations

import logging
from typing import Tuple

from flux.control_messages import Failed, Members, OperatorFailed, Register, Stop, Welcome
from flux.errors import CheckpointCorrupt, OperatorError
from flux.runtime.mover_service import mover_peer

#: a task that fails this many times before its node loop runs fails the job (SPARK_NOTES)
START_FAILURES = 3
#: what ``name_for`` returns to hold a registration until the job names every task at
#: once, knowing their hosts (no pair on one host)
PENDING = "<pending>"

log = logging.getLogger("flux.runtime.controller_service")


class RegistrationSide:
    """Registrations, start failures and who listens where; mixed into
    ``ControllerService``."""

    def add_member(self, name: str, inc: int, address: str, mover_address: str = "") -> None:
        """Know process ``name`` (its incarnation and sockets) without a registration."""
        self.incarnations[name] = inc
        self.addresses[name] = address
        if mover_address:
            self.mover_addresses[name] = mover_address

    def pids(self, name: str) -> Tuple[int, int]:
        """The (Python worker, executor JVM) process ids a registered task reported."""
        _, _, pid, jvm = self.registered[name]
        return pid, jvm

    def on_register(self, msg: Register) -> None:
        """A Spark task joins with the job's secret; anything else is refused.
        Idempotent: a task that registers again (it heard nothing yet) is welcomed again."""
        if self.secret is not None and msg.secret != self.secret:
            log.warning("refused a registration with a wrong secret from %s", msg.address)
            return
        again = [n for n, r in self.registered.items() if r[:2] == (msg.task, msg.inc)]
        if again:
            self._send(again[0], self._welcome(again[0]), 0)
            return
        name = self.name_for(msg) if self.name_for else None
        if name == PENDING:
            self.pending[msg.task, msg.inc] = msg
            return
        if name is None:
            log.warning("refused task %s attempt %s: no role for it", msg.task, msg.inc)
            return
        self.admit(msg, name)

    def admit(self, msg: Register, name: str) -> None:
        """Task ``msg`` joins as process ``name``: welcomed, watched, announced."""
        self.pending.pop((msg.task, msg.inc), None)
        self.registered[name] = (msg.task, msg.inc, msg.pid, msg.executor_pid)
        self.hosts[name] = msg.host
        self.executors[name] = msg.executor
        self.boots[name] = msg.boot
        self.add_member(name, msg.inc, msg.address, msg.mover_address)
        if self.stopping is not None:  # a task retried as the job stops: it ends at once
            self._connect(name)
            self._send(name, Stop(self.stopping), 0)
            return
        self.detector.watch(name, self.clock())
        self._connect(name)
        self._send(name, self._welcome(name), 0)
        log.info("%s joined: task %d, attempt %d, on %s", name, msg.task, msg.inc,
                 msg.host or "an unnamed host")
        if self.started:  # a late standby (a retried task): tell everyone where it is
            self.announce()
            host = msg.host if self.recovery.host_of else None
            self._broadcast(self.recovery.add_standby(name, msg.inc, host))

    def _welcome(self, name: str) -> Welcome:
        """Before the start, just the name; for a process joining a running job, the
        current state it starts from."""
        if not self.started:
            return Welcome(name)
        rec = self.recovery
        return Welcome(name, rec.view, tuple(sorted(rec.placed().items())),
                       tuple(sorted(self.incarnations[n] for n in self.dead)),
                       tuple(sorted(rec.joined)), tuple(sorted(rec.left)))

    def on_start_failure(self, msg: Failed) -> None:
        """Spark retries a failed task forever (maxFailures is high, SPARK_NOTES): a task
        that fails before registering, again and again, has a deterministic error."""
        if self.secret is not None and msg.secret != self.secret:
            log.warning("ignored a start failure with a wrong secret (task %s)", msg.task)
            return
        reasons = self.start_failures.setdefault(msg.task, [])
        reasons.append(msg.reason)
        log.warning("task %s (attempt %s) failed to start: %s", msg.task, msg.inc, msg.reason)
        if msg.fatal and self.error is None:  # a node that registered: no retry can help
            self.error = (CheckpointCorrupt(*msg.corrupt) if len(msg.corrupt) == 2 else
                          RuntimeError(f"task {msg.task} could not start its node: "
                                       f"{msg.reason}"))
            return
        if len(reasons) >= START_FAILURES and self.error is None:
            self.error = RuntimeError(
                f"task {msg.task} failed {len(reasons)} times before its node started; "
                f"last error: {msg.reason}")

    def on_operator_failed(self, msg: OperatorFailed) -> None:
        """User code raised on a record: its other replica would raise too, so the job
        stops with that error (the first one reported) instead of failing over."""
        if self.secret is not None and msg.secret != self.secret:
            log.warning("ignored an operator failure with a wrong secret")
            return
        if self.error is None:
            self.error = OperatorError(msg.what, msg.stage, msg.partition, msg.sn, msg.error)

    def announce(self) -> None:
        """Where every process listens, and every StateMover (as ``name/mover``)."""
        entries = [(n, a, self.incarnations.get(n, 0)) for n, a in self.addresses.items()]
        entries += [(mover_peer(n), a, self.incarnations.get(n, 0))
                    for n, a in self.mover_addresses.items()]
        members = Members(tuple(sorted(entries)))
        for name in self._live():
            self._send(name, members, 0)
