"""Failures as the controller declares them (paper 3.2.1; DESIGN 4.6 and 6).

The pure ``FailureDetector`` gives verdicts (dead, stuck, turning again, the
controller itself stalled); a process declared dead is disconnected and the
pure ``Recovery`` turns its failure into views, fencing any process that
failed with it (its replica set, 4.2). A process declared dead that speaks
again is told to stop; one that says it stops on its own is failed at once.
A catch-up whose transfer failed with both ends alive, or that is not folded
in by its deadline, is aborted and retried (3.4).

A part of ``flux.runtime.controller_service.ControllerService`` (its attributes
are the service's), as the segment is split along its seams.
"""
from __future__ import annotations

import logging
from typing import List

from controller.failure_detector import Declared, Stalled, Stuck, Unstuck, Verdict
from flux.control_messages import Heartbeat, Stop
from flux.errors import PairLost

log = logging.getLogger("flux.runtime.controller_service")


class FailureSide:
    """Verdicts, failures, fencing and aborted catch-ups; mixed into
    ``ControllerService``."""

    def _act(self, verdicts: List[Verdict]) -> None:
        """Carry out the failure detector's verdicts."""
        now = self.clock()
        for v in verdicts:
            if isinstance(v, Declared):
                self.fail(v.name, v.why)
            elif isinstance(v, Stuck):
                log.warning("%s is alive but its loop has not turned for %.2fs", v.name, v.lag)
                self.events.append((now, "stuck", f"{v.name} ({v.lag:.2f}s)"))
            elif isinstance(v, Unstuck):
                log.info("%s's loop turns again (it stopped for up to %.2fs)", v.name,
                         v.longest)
            elif isinstance(v, Stalled):
                log.warning("the controller did not turn for %.2fs: silence in that time "
                            "is not counted", v.seconds)
                self.events.append((now, "controller stalled", round(v.seconds, 3)))

    def _tell_fenced(self, name: str, now: float, said: object) -> None:
        """A process declared dead speaks again (its link was cut and healed, or it was
        only slow): nothing it says is acted on, and it is told to stop (at most once a
        second), so its task fails and Spark re-runs it as a fresh standby (DESIGN 6).
        A heartbeat's lag and lateness go in the log: a beat that left as late as the
        silence means its process was starved (CPU, or the interpreter's lock held by one
        long call); one on time, that the beats were held up on the way."""
        if now - self._told_fenced.get(name, float("-inf")) < 1.0:
            return
        self._told_fenced[name] = now
        loop = (f" (its loop last turned {said.lag:.3f}s before this heartbeat, which "
                f"left {said.late:.3f}s late)" if isinstance(said, Heartbeat) else "")
        log.warning("%s, declared dead (%s), is alive%s: told to stop", name,
                    self.why_dead.get(name, "?"), loop)
        self.events.append((now, "zombie told to stop", name))
        self._send(name, Stop(f"fenced: declared dead ({self.why_dead.get(name, '?')})"), 0)

    def on_stopping(self, name: str, reason: str) -> None:
        """A node says it ends on its own: its reason goes in the driver's log, and it is
        failed now rather than when its connection drops."""
        if name in self.dead or not self.started:
            log.info("%s stopped: %s", name, reason)
            return
        log.warning("%s stops on its own: %s", name, reason)
        self.fail(name, f"it stopped: {reason}")

    def abort_attempt(self, transfer: tuple, why: str) -> None:
        """A state transfer failed with both ends alive (e.g. a checksum mismatch), or its
        attempt ran out of time: abort it and retry (DESIGN 4.6)."""
        views = self.recovery.transfer_failed(*transfer)
        if views:
            stage, partition, version = transfer
            log.warning("catch-up of stage %d partition %d (attempt %d) aborted: %s",
                        stage, partition, version, why)
            self.events.append((self.clock(), "catch-up aborted", f"{stage}.{partition}: {why}"))
            self._broadcast(views)

    def _expire_attempts(self, now: float) -> None:
        for addr, version, age in self.recovery.overdue(now, self.catchup_timeout):
            self.abort_attempt((addr.stage, addr.partition, version),
                               f"not folded in after {age:.0f}s")

    def fail(self, name: str, why: str) -> None:
        if name in self.dead or self.error is not None:
            return
        log.warning("declaring %s dead: %s", name, why)
        self._mark_dead(name, why, "detected", f"{name} ({why})")
        self.transport.disconnect(name)
        try:
            views = self.recovery.node_failed(name)
            for other in sorted(self.recovery.dead - self.dead):  # failed with it (4.2)
                self._fence(other, f"its replica set failed with {name}")
            self._broadcast(views)
        except PairLost as exc:
            self.error = exc  # the job must stop: both replicas of a partition are gone
            log.error("%s", exc)

    def _fence(self, name: str, why: str) -> None:
        """A live process the views declare failed: it is told to stop (and, fenced by its
        incarnation, is ignored by everyone even if it does not)."""
        log.warning("fencing %s: %s", name, why)
        self._send(name, Stop(f"fenced: {why}"), 0)
        self._mark_dead(name, why, "fenced", name)

    def _mark_dead(self, name: str, why: str, event: str, detail: str) -> None:
        self.dead.add(name)
        self.why_dead[name] = why
        self.detector.forget(name)
        self.node_stats.pop(name, None)
        self.events.append((self.clock(), event, detail))
