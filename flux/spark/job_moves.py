"""``FluxJob.move_key_groups`` and ``FluxJob.spread_key_groups``: live moves of key groups
between the running pairs, without a restart (DESIGN 13, docs/design/rescaling.md).

A move is asked (``flux.spark.live_moves.LiveMoves``), a checkpoint cut at once carries
it, and the call returns once a complete checkpoint covers it: a restart from then on
keeps it. What the job cannot move is refused first, naming why. With
``rebalance=flux.Rebalance(...)`` a thread of the driver asks the moves the policy
(``controller.rebalance``) decides from the nodes' counters, one at a time.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Dict, List, Optional, Tuple

from controller.rebalance import RebalancePolicy, routed_loads
from exchange.group_map import GroupMap
from flux.errors import RescaleRefused
from flux.rescale import check_rescalable
from flux.spark.live_moves import MoveAsked, SpreadAsked

log = logging.getLogger(__name__)

def check_live(running: bool, config, checkpoints) -> None:
    """Refuse, naming why, live moves in a job that cannot make them."""
    if not running:
        raise ValueError("live moves of key groups need a running job: start() it first, "
                         "and not once it finished or stopped")
    if checkpoints is None:
        raise ValueError("live moves of key groups ride a checkpoint's cut: give the job "
                         "checkpoint=")
    if checkpoints.moves is None:
        raise RescaleRefused("this job restored a checkpoint written before key groups "
                             "(its keys routed by hash % partitions): its keys cannot move")


def check_move(asked: MoveAsked, stages: int, key_groups: int, partitions: int) -> None:
    if not 1 <= asked.stage <= stages:
        raise ValueError(f"stage must be from 1 to {stages}, got {asked.stage!r}")
    if not 0 <= asked.first <= asked.last < key_groups:
        raise ValueError(f"key groups must be first..last within 0..{key_groups - 1}, got "
                         f"{asked.first!r}..{asked.last!r}")
    if not 0 <= asked.dest < partitions:
        raise ValueError(f"to must be a running partition from 0 to {partitions - 1}, got "
                         f"{asked.dest!r}")


def move_live(checkpoints, asked, timeout: float, staged=lambda number, moves: False,
              clock=time.monotonic, sleep=time.sleep,
              stopped=lambda: False, on_poll=lambda: None) -> Optional[int]:
    """Ask the move, cut a checkpoint to carry its prepares, cut the next one to carry
    the moves once ``staged(number, moves)`` (the controller: both replicas of every
    destination hold the bulks prepared at checkpoint ``number``) or ``PREPARE_WAIT``
    seconds passed (``LiveMoves``), and wait until a complete checkpoint covers it; that checkpoint's
    number. A restart to an older checkpoint meanwhile asks it again
    (``LiveMoves.restarted``). ``TimeoutError`` if none does in ``timeout`` (no input came
    to cut after, or checkpoints do not complete); ``ValueError`` if ``stopped()`` (the
    job) first. ``on_poll``: called as it waits (a rescale to fewer asks its leave once
    its moves are carried)."""
    moves = checkpoints.moves
    moves.ask(asked)
    checkpoints.cut_now()
    started = clock()
    while clock() - started < timeout:
        if stopped():
            raise ValueError(f"the job stopped or failed (job.errors) before a complete "
                             f"checkpoint covered {asked}")
        latest = checkpoints.service.latest
        number = latest.number if latest is not None else None
        if not moves.pending(number):
            return number
        preparing = moves.preparing()  # (None once PREPARE_WAIT passed: carried anyway)
        if preparing is not None and staged(*preparing):
            moves.staged(preparing[0])
        if moves.waiting_for_cut() and checkpoints.wanted_cut is not None:
            checkpoints.cut_now()  # the moves' cut, or one a restart undid
        on_poll()
        sleep(0.02)
    raise TimeoutError(f"{asked} was not in a complete checkpoint within {timeout}s (it "
                       f"needs an input to cut after)")


class KeyGroupMoves:
    """Live moves of a running job; mixed into ``FluxJob`` (its attributes are the job's)."""

    def move_key_groups(self, first: int, last: int, to: int, stage: int = 1,
                        timeout: float = 60.0) -> Optional[int]:
        """Move key groups ``first..last`` of ``stage`` to partition ``to`` while the job
        runs, without a restart: the move rides the next checkpoint's cut; the groups'
        state goes from the partitions that own them to ``to``, which holds the inputs
        after the cut until it has it. Returns the number of the complete checkpoint
        that covers the move."""
        asked = MoveAsked(stage, first, last, to)
        self._check_live()
        check_move(asked, len(self.dataflow.stages), self._checkpointing.key_groups,
                   self.attempt.running)
        check_rescalable(self.dataflow, self._sample, self._checkpointing.key_groups, stage)
        return move_live(self._checkpointing, asked, timeout, self._bulks_staged,
                         stopped=self._ended)

    def spread_key_groups(self, over: int, timeout: float = 60.0) -> Optional[int]:
        """Spread every stage's key groups over the first ``over`` pairs, in contiguous
        ranges as a job of ``over`` nodes has them, while the job runs: a live rescale
        among the pairs started (``nodes=``), the others owning no key (idle). Every
        range that changes owner moves at one checkpoint's cut, as ``move_key_groups``
        moves one. Returns the number of the complete checkpoint that covers it."""
        self._check_live()
        running = self.attempt.running
        if not isinstance(over, int) or isinstance(over, bool) or not 1 <= over <= running:
            raise ValueError(f"over must be an int from 1 to the job's {running} running "
                             f"pairs, got {over!r}" + (
                                 f" (rescale({over}) starts dormant pairs)"
                                 if isinstance(over, int) and running < over <=
                                 self.config.partitions else ""))
        check_rescalable(self.dataflow, self._sample, self._checkpointing.key_groups)
        return move_live(self._checkpointing,
                         SpreadAsked(over, self._checkpointing.key_groups), timeout,
                         self._bulks_staged, stopped=self._ended)

    def _spread_again(self, pairs: int, timeout: float) -> None:
        """``rescale(n)`` at the job's own count of pairs: keys spread over fewer of them
        (``spread_key_groups``, ``move_key_groups``, the policy) are spread over all
        ``n`` again, live. Nothing when they are so already, or nothing may move live
        (no moves without ``checkpoint=``)."""
        moves = self._checkpointing.moves if self._checkpointing is not None else None
        if moves is None:
            return
        even = [int(p) for p in GroupMap.even(pairs, self._checkpointing.key_groups).owners]
        if any(owners != even for owners in moves.owners().values()):
            self.spread_key_groups(pairs, timeout)

    def key_group_owners(self, stage: int = 1) -> List[int]:
        """The partition that owns each key group of ``stage`` (1-based) now, as the
        moves carried so far left them."""
        moves = self._checkpointing.moves if self._checkpointing is not None else None
        if moves is None:
            raise ValueError("key_group_owners() needs checkpoint= (the moves ride its "
                             "cuts) of a job with key groups")
        return moves.owners()[stage]

    def key_group_rows(self, stage: int = 1) -> List[int]:
        """Rows routed to each key group of ``stage`` (1-based) so far, as the producers
        last reported them (about once a second; empty before the first report): where
        a stage's load is. The larger of each pair's two counts; a restart starts them
        again."""
        if not 1 <= stage <= len(self.dataflow.stages):
            raise ValueError(f"stage must be 1 to {len(self.dataflow.stages)}, got {stage!r}")
        return routed_loads(self._producer_stats()).get(stage, [])

    def _movable_stages(self) -> List[int]:
        """The stages whose key groups may move live; a stage named by
        ``Rebalance.stages`` that cannot is refused."""
        settings = self.options.replication.rebalance
        check_live(True, self.config, self._checkpointing)
        last = len(self.dataflow.stages)
        named = settings.stages or ()
        for stage in named:
            if not 1 <= stage <= last:
                raise RescaleRefused(f"Rebalance: stage {stage} cannot move live (the "
                                     f"stages that can: 1..{last})")
        movable = []
        for stage in range(1, last + 1):
            try:
                check_rescalable(self.dataflow, self._sample,
                                 self._checkpointing.key_groups, stage)
                movable.append(stage)
            except RescaleRefused as why:
                if stage in named:
                    raise
                log.info("Rebalance: stage %d stays where it is: %s", stage, why)
        return movable

    def _check_rebalance(self) -> None:
        """A rebalancing policy is refused when the job is built, naming why, if its
        groups cannot move (the refused job's checkpoint thread stopped)."""
        if self.options.replication.rebalance is None:
            return
        try:
            self._movable_stages()
        except BaseException:
            self.stop()
            raise

    def _start_rebalancing(self) -> Optional[threading.Thread]:
        settings = self.options.replication.rebalance
        if settings is None:
            return None
        policy = RebalancePolicy(settings, self._movable_stages(), self.config.partitions)
        thread = threading.Thread(target=self._rebalance, args=(policy,), daemon=True,
                                  name="flux-rebalance")
        thread.start()
        return thread

    def _rebalance(self, policy: RebalancePolicy, poll: float = 1.0) -> None:
        """Until the job ends: the policy looks at the nodes' counters, and each move it
        decides is asked and waited for (an event ``rebalanced``, ``(stage, first,
        last, to, rates)``)."""
        while not self._stopping.wait(poll) and not self.finished():
            try:
                move = policy.observe(time.monotonic(), self._inputs_taken(),
                                      self._checkpointing.moves.owners(),
                                      routed_loads(self._producer_stats()))
                if move is None:
                    continue
                log.info("Rebalance: stage %d groups %d..%d to partition %d (inputs/s "
                         "%s)", move.stage, move.first, move.last, move.dest,
                         [round(r) for r in move.rates])
                self.metrics.events.append((time.monotonic(), "rebalanced", (
                    move.stage, move.first, move.last, move.dest, move.rates)))
                self.move_key_groups(move.first, move.last, move.dest, move.stage)
            except (TimeoutError, ValueError) as exc:  # no input to cut after; job ending
                log.warning("Rebalance: %s", exc)
            policy.restart_look()

    def _inputs_taken(self) -> Dict[Tuple[int, int], int]:
        """(stage, partition) -> inputs taken, the more of its replicas' last counters."""
        taken: Dict[Tuple[int, int], int] = {}
        for s in self._producer_stats():
            key = (s.addr.stage, s.addr.partition)
            taken[key] = max(taken.get(key, 0), s.taken)
        return taken

    def _producer_stats(self) -> list:
        """Every replica's last counters: the nodes' (their segments, and the ingresses
        of a split source) and the ingress process's (as it last reported them)."""
        attempt = self.attempt
        if attempt is None:
            return []
        stats = [s for _, node in list(attempt.controller.node_stats.values())
                 for s in node.segments]
        feed = attempt.feed
        return stats + ([feed.stats] if feed is not None and feed.stats is not None else [])

    def _bulks_staged(self, number: int, moves) -> bool:
        attempt = self.attempt
        return attempt is not None and attempt.controller.bulks_staged(number, moves)

    def _ended(self) -> bool:
        """Has the job stopped or failed (a live move or rescale waits no longer)?"""
        return self._stopping.is_set() or bool(self.errors)

    def _check_live(self) -> None:
        check_live(self.attempt is not None and not self._stopped and not self.finished(),
                   self.config, self._checkpointing)
        self._check_left()  # (``PairGrowth``: pairs still leaving refuse any move)
