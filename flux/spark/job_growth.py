"""``FluxJob.rescale`` to more pairs, live: dormant pairs started on standbys
(docs/design/rescaling.md, "Pairs started at a live rescale").

A job built with ``max_nodes`` above ``nodes`` has ``max_nodes`` partitions, of which the
first ``nodes`` run and own every key group; the others are *dormant*: no process, no
group, their links and merge feeds asleep everywhere. ``rescale(n)`` up to ``max_nodes``
asks the controller to start pairs ``running..n-1`` on free standbys (a view every
process applies: ``flux.runtime.controller_joins``), waits until every live process
(nodes, standbys, the ingress process, the egress) applied it, and only then spreads
the key groups over the ``n`` pairs with a live move (``spread_key_groups``): its cut
is chosen after the join everywhere, which is the design's safety rule. Modelled in the
simulator first (``--dormant``).

``rescale(n)`` below the pairs running spreads the key groups over the first ``n`` (the
pairs past them then own none), and once every replica of those pairs says it crossed the
cut that took their last groups and holds nothing, and no replica is missing, the
controller stops them (a view: ``ask_leave``); a node left holding nothing is a standby
again, for a later rescale to more. Until every process applied that view no other move
or rescale is taken (``_check_left``). Modelled first (``--dormant`` with a rescale to
fewer, rule 5 of docs/design/rescaling.md).

What is refused, naming why: dormant pairs beside what the simulator has not modelled
with them (a ``SplitSource``'s pairs of ingresses, writers on the executors, replication
other than ``flux``, the rebalancing policy), without ``checkpoint=`` (live moves ride
its cuts), with fewer than two standbys (a join needs two at least), and a rescale past
``max_nodes``.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, List, Optional, Tuple

from controller.autoscale import AutoscalePolicy
from flux.errors import RescaleRefused
from flux.rescale import check_rescalable
from flux.runtime.restore import dormant_start
from flux.spark.job_moves import move_live
from flux.spark.live_moves import SpreadAsked
from flux.spark.settings import check_settings

log = logging.getLogger(__name__)

#: seconds between looks at the controller while a join waits
POLL = 0.02


def check_dormant(options, splits: int) -> None:
    """Refuse, naming why, ``max_nodes`` in a job whose dormant pairs are not built (and
    ``autoscale`` in a job without them)."""
    rep = options.replication
    if rep.autoscale is not None:
        rep.autoscale.bounds(rep.nodes, rep.partitions)
    if rep.partitions == rep.nodes:
        return
    why = None
    if rep.mode != "flux":
        why = f"replication={rep.mode!r} (dormant pairs are pairs of Flux's chained placement)"
    elif splits:
        why = "a SplitSource (its pairs of ingresses are not modelled with dormant pairs yet)"
    elif options.tuning.egress_on_executors:
        why = "egress_on_executors=True (a sink's writer on the node of a pair that may " \
              "not run is not modelled with dormant pairs yet)"
    elif options.checkpoints.location is None:
        why = "no checkpoint= (the key groups move to the started pairs at a checkpoint's cut)"
    elif rep.rebalance is not None:
        why = "rebalance= (its moves are not modelled with dormant pairs yet)"
    elif rep.standbys < 2:
        why = f"standbys={rep.standbys} (the pairs start on two standbys at least)"
    if why is not None:
        raise ValueError(f"max_nodes={rep.max_nodes} above nodes={rep.nodes} starts pairs "
                         f"while the job runs, which this job cannot: {why}")


def check_growth(nodes: int, max_nodes: int) -> None:
    """A rescale of a job with dormant pairs: up to ``max_nodes``."""
    if nodes > max_nodes:
        raise RescaleRefused(f"rescale({nodes}): this job grows live up to max_nodes="
                             f"{max_nodes}; to run more pairs run the program again with a "
                             f"larger max_nodes (it restores its checkpoint at the new count)")


def applied_view(placed: Callable[[], Optional[int]], applied: Callable[[int], List[str]],
                 timeout: float, clock, sleep,
                 stopped: Callable[[], bool] = lambda: False) -> Tuple[Optional[int], bool]:
    """Wait until the controller placed a view (``placed()``: its number, or None yet)
    and every live process applied it; the view (or None) and whether they did.
    ``ValueError`` if ``stopped()`` (the job stopped or failed) first."""
    started = clock()
    view: Optional[int] = None
    while clock() - started < timeout:
        if stopped():
            raise ValueError("the job stopped or failed (job.errors) while pairs started "
                             "or left")
        view = placed()
        if view is not None and not applied(view):
            return view, True
        sleep(POLL)
    return view, False


def start_dormant(controller, applied: Callable[[int], List[str]], partitions: range,
                  timeout: float, clock=time.monotonic, sleep=time.sleep,
                  start: tuple = (), stopped: Callable[[], bool] = lambda: False) -> int:
    """Ask the controller to start dormant ``partitions`` and wait until every live
    process applied the view that did (``applied(view)``: the processes that have not);
    that view's number. ``start``: where their replicas start (``LiveMoves.join_start``).
    ``TimeoutError`` naming what it waits for."""
    controller.ask_join(partitions, start)
    view, everywhere = applied_view(lambda: controller.joined_view(partitions), applied,
                                    timeout, clock, sleep, stopped)
    if everywhere:
        return view
    if view is None:
        controller.withdraw_join(partitions)
        free, missing, catching_up = controller.join_waits()
        raise TimeoutError(
            f"pairs {partitions.start}..{partitions.stop - 1} did not start within {timeout}s: "
            f"they start on {max(2, len(partitions))} free standbys once no replica is "
            f"missing ({free} standbys free, {missing} replicas missing"
            f"{', a catch-up running' if catching_up else ''}); the ask is withdrawn: "
            f"rescale again once they are")
    raise TimeoutError(f"pairs {partitions.start}..{partitions.stop - 1} started in view "
                       f"{view}, and {', '.join(applied(view))} had not applied it within "
                       f"{timeout}s")


def wait_left(controller, applied: Callable[[int], List[str]], partitions: range,
              cut: tuple, timeout: float, clock=time.monotonic, sleep=time.sleep,
              stopped: Callable[[], bool] = lambda: False) -> int:
    """Wait until the controller stopped ``partitions`` (asked with ``ask_leave``: they
    own no key group since the move cut ``cut`` ``(k, n)``) and every live process
    applied the view that did; that view's number. ``TimeoutError`` naming what it waits
    for (the ask stays: they leave once they may)."""
    view, everywhere = applied_view(lambda: controller.left_view(partitions), applied,
                                    timeout, clock, sleep, stopped)
    if everywhere:
        return view
    pairs = f"pairs {partitions.start}..{partitions.stop - 1}"
    if view is None:
        waits = controller.leave_waits(partitions, cut)
        raise TimeoutError(
            f"{pairs} own no key group and did not leave within {timeout}s: they leave once "
            f"both replicas of each crossed move cut {cut[0]} and hold nothing, and no "
            f"replica is missing ({'; '.join(waits[:6]) or 'now they may'}); they leave "
            f"when they may, and no rescale or move is taken until then")
    raise TimeoutError(f"{pairs} left in view {view}, and {', '.join(applied(view))} had "
                       f"not applied it within {timeout}s")


class PairGrowth:
    """``rescale`` of a job with dormant pairs; mixed into ``FluxJob`` (its attributes
    are the job's)."""

    def _first_running(self) -> int:
        """The pairs the job's first attempt runs: ``nodes``, or with dormant pairs as
        many as the checkpoint it resumes from ran (``dormant_start``)."""
        c = self.config
        return dormant_start(self._resumed_from, c.partitions, c.running, c.key_groups,
                             c.stages)[1] or c.partitions

    def _check_left(self) -> None:
        """Refuse a move or rescale while pairs a rescale to fewer took out have not left
        everywhere (a join or a move meanwhile would race their leave)."""
        if self._leaving is None:
            return
        attempt, parts, cut = self._leaving
        view = attempt.controller.left_view(parts)
        if attempt is not self.attempt or view is not None and not attempt.lagging(view):
            self._leaving = None  # left (or a restart ran from a checkpoint at the count)
            return
        raise RescaleRefused(f"pairs {parts.start}..{parts.stop - 1} are leaving (a rescale "
                             f"to fewer) and have not left yet: " + "; ".join(
                                 attempt.controller.leave_waits(parts, cut)[:6] or
                                 ["not every process applied their leave yet"]))

    def _grow(self, nodes: int, timeout: float) -> None:
        """Run ``nodes`` pairs from now, live: the dormant ones up to ``nodes`` start on
        standbys, then every stage's key groups spread over the ``nodes`` pairs; or with
        fewer, the pairs past ``nodes`` leave (``_shrink``)."""
        check_growth(nodes, self.config.partitions)
        self._check_live()
        running = self.attempt.running
        if nodes < running:
            self._shrink(nodes, timeout)
            return
        if nodes == running:
            self._spread_again(nodes, timeout)
            return
        # a restart after the growth runs every pair owning keys: its tasks must fit
        check_settings(self.spark, nodes + self._parts.standbys,
                       wait=self.options.network.executor_wait)
        started = time.monotonic()
        attempt = self.attempt
        moves = self._checkpointing.moves
        try:
            view = start_dormant(attempt.controller, attempt.lagging, range(running, nodes),
                                 timeout, start=moves.join_start(), stopped=self._ended)
        finally:
            moves.join_applied()  # (on a timeout, the ask withdrawn: see start_dormant)
        self.metrics.events.append((time.monotonic(), "pairs started", (running, nodes, view)))
        self.spread_key_groups(nodes, max(1.0, timeout - (time.monotonic() - started)))

    def _shrink(self, nodes: int, timeout: float) -> None:
        """Run ``nodes`` pairs from now, live: every stage's key groups spread over the
        first ``nodes`` (a live move), and the pairs past them leave, asked as soon as a
        cut carried the moves (with a sink per partition, that cut's checkpoint completes
        only once they left: their sinks commit it then, ``Egress.on_leave``)."""
        started = time.monotonic()
        check_rescalable(self.dataflow, self._sample, self._checkpointing.key_groups)
        moves = self._checkpointing.moves

        def ask_leave() -> None:
            leaving, attempt = moves.leaving(), self.attempt
            if leaving is None or attempt is None or (
                    self._leaving is not None and self._leaving[0] is attempt):
                return
            parts = range(nodes, attempt.running)
            if parts:  # (none: a restart from the rescale's checkpoint runs ``nodes``)
                self._leaving = (attempt, parts, leaving[1])
                attempt.controller.ask_leave(parts, leaving[1])
        move_live(self._checkpointing, SpreadAsked(nodes, self._checkpointing.key_groups,
                                                   leave=True),
                  timeout, self._bulks_staged, stopped=self._ended,
                  on_poll=ask_leave)
        ask_leave()
        if self._leaving is None or self._leaving[0] is not self.attempt:
            return  # a restart from the rescale's checkpoint on runs ``nodes`` already
        attempt, parts, cut = self._leaving
        view = wait_left(attempt.controller, attempt.lagging, parts, cut,
                         max(1.0, timeout - (time.monotonic() - started)), stopped=self._ended)
        self._leaving = None
        self.metrics.events.append((time.monotonic(), "pairs stopped", (nodes, parts.stop,
                                                                     view)))

    def _start_autoscaling(self) -> Optional[threading.Thread]:
        settings = self.options.replication.autoscale
        if settings is None:
            return None
        low, high = settings.bounds(self.options.replication.nodes, self.config.partitions)
        thread = threading.Thread(target=self._autoscale,
                                  args=(AutoscalePolicy(settings, low, high),),
                                  daemon=True, name="flux-autoscale")
        thread.start()
        return thread

    def _autoscale(self, policy: AutoscalePolicy, poll: float = 1.0) -> None:
        """Until the job ends: the policy looks at the inputs taken, and each rescale it
        decides is asked and waited for (an event ``autoscaled``, ``(from, to, rate)``)."""
        while not self._stopping.wait(poll) and not self.finished():
            taken = sum(n for (stage, _), n in self._inputs_taken().items() if stage == 0)
            attempt = self.attempt
            if attempt is None:
                continue
            decision = policy.observe(time.monotonic(), taken, attempt.running)
            if decision is None:
                continue
            log.info("Autoscale: %d -> %d pairs (%.0f inputs/s)", decision.running,
                     decision.pairs, decision.rate)
            self.metrics.events.append((time.monotonic(), "autoscaled", (
                decision.running, decision.pairs, round(decision.rate, 1))))
            try:
                self.rescale(decision.pairs)
            except (TimeoutError, ValueError) as exc:  # no input to cut after; job ending
                log.warning("Autoscale: %s", exc)
            policy.restart_look()
