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

What is refused, naming why: dormant pairs beside what the simulator has not modelled
with them (a ``SplitSource``'s pairs of ingresses, an egress per partition, replication
other than ``flux``, the rebalancing policy), without ``checkpoint=`` (live moves ride its cuts), with fewer than
two standbys (a join needs two at least), and a rescale of such a job to fewer pairs than
run (shrinking is not built) or past ``max_nodes``.
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional

from flux.errors import RescaleRefused
from flux.runtime.restore import dormant_start
from flux.spark.settings import check_settings

#: seconds between looks at the controller while a join waits
POLL = 0.02


def check_dormant(options, splits: int) -> None:
    """Refuse, naming why, ``max_nodes`` in a job whose dormant pairs are not built."""
    rep = options.replication
    if rep.partitions == rep.nodes:
        return
    why = None
    if rep.mode != "flux":
        why = f"replication={rep.mode!r} (dormant pairs are pairs of Flux's chained placement)"
    elif splits:
        why = "a SplitSource (its pairs of ingresses are not modelled with dormant pairs yet)"
    elif not options.tuning.ordered_output:
        why = "ordered_output=False (an egress per partition is not modelled with dormant " \
              "pairs yet)"
    elif options.checkpoints.location is None:
        why = "no checkpoint= (the key groups move to the started pairs at a checkpoint's cut)"
    elif rep.rebalance is not None:
        why = "rebalance= (its moves are not modelled with dormant pairs yet)"
    elif rep.standbys < 2:
        why = f"standbys={rep.standbys} (the pairs start on two standbys at least)"
    if why is not None:
        raise ValueError(f"max_nodes={rep.max_nodes} above nodes={rep.nodes} starts pairs "
                         f"while the job runs, which this job cannot: {why}")


def check_growth(running: int, nodes: int, max_nodes: int) -> None:
    """A rescale of a job with dormant pairs: up to ``max_nodes``, never below ``running``."""
    if nodes > max_nodes:
        raise RescaleRefused(f"rescale({nodes}): this job grows live up to max_nodes="
                             f"{max_nodes}; to run more pairs run the program again with a "
                             f"larger max_nodes (it restores its checkpoint at the new count)")
    if nodes < running:
        raise RescaleRefused(f"rescale({nodes}): {running} pairs run, and a job started with "
                             f"max_nodes does not shrink yet; spread_key_groups({nodes}) "
                             f"leaves the pairs past {nodes} owning no key (idle)")


def start_dormant(controller, applied: Callable[[int], List[str]], partitions: range,
                  timeout: float, clock=time.monotonic, sleep=time.sleep,
                  start: tuple = ()) -> int:
    """Ask the controller to start dormant ``partitions`` and wait until every live
    process applied the view that did (``applied(view)``: the processes that have not);
    that view's number. ``start``: where their replicas start (``LiveMoves.join_start``).
    ``TimeoutError`` naming what it waits for."""
    controller.ask_join(partitions, start)
    started = clock()
    view: Optional[int] = None
    while clock() - started < timeout:
        view = controller.joined_view(partitions)
        if view is not None and not applied(view):
            return view
        sleep(POLL)
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


class PairGrowth:
    """``rescale`` of a job with dormant pairs; mixed into ``FluxJob`` (its attributes
    are the job's)."""

    def _first_running(self) -> int:
        """The pairs the job's first attempt runs: ``nodes``, or with dormant pairs as
        many as the checkpoint it resumes from ran (``dormant_start``)."""
        c = self.config
        return dormant_start(self._resumed_from, c.partitions, c.running, c.key_groups,
                             c.stages)[1] or c.partitions

    def _grow(self, nodes: int, timeout: float) -> None:
        """Run ``nodes`` pairs from now, live: the dormant ones up to ``nodes`` start on
        standbys, then every stage's key groups spread over the ``nodes`` pairs."""
        running = self.attempt.running
        check_growth(running, nodes, self.config.partitions)
        if nodes == running:
            self._spread_again(nodes, timeout)
            return
        self._check_live()
        # a restart after the growth runs every pair owning keys: its tasks must fit
        check_settings(self.spark, nodes + self._parts.standbys,
                       wait=self.options.network.executor_wait)
        started = time.monotonic()
        attempt = self.attempt
        moves = self._checkpointing.moves
        try:
            view = start_dormant(attempt.controller, attempt.lagging, range(running, nodes),
                                 timeout, start=moves.join_start())
        finally:
            moves.join_applied()  # (on a timeout, the ask withdrawn: see start_dormant)
        self.metrics.events.append((time.monotonic(), "pairs started", (running, nodes, view)))
        self.spread_key_groups(nodes, max(1.0, timeout - (time.monotonic() - started)))
