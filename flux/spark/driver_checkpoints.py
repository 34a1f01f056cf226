"""The driver's part of a checkpointing job (DESIGN 10): which checkpoint to start from,
the input log's replay, when to cut, and what the source hears.

One object per job, kept across its restarts: the store and the service that completes
checkpoints, the checkpoint a start or a restart restores (the newest whose files all
verify: ``CheckpointStore.restorable``), the logged order of the inputs after its cut
(checked against what the sink holds), and the cuts the source's thread chooses.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, List, Optional, Tuple

from controller.checkpoint_shape import JobShape
from controller.checkpoints import CheckpointCoordinator, fingerprint
from exchange.partitioner import KEY_GROUPS
from flux.connector_api import LOGGED, SplitSource
from flux.errors import CheckpointCorrupt, CheckpointMismatch
from flux.runtime.checkpoint_service import CheckpointService
from flux.runtime.checkpoint_store import CheckpointStore
from flux.runtime.ingress_feed import IngressFeed
from flux.runtime.input_log import InputLog, InputLogWriter
from flux.spark.last_stage_moves import LastStageMoves
from flux.spark.live_moves import LiveMoves
from flux.spark.options import Checkpointing

log = logging.getLogger(__name__)


class DriverCheckpoints:
    def __init__(self, options: Checkpointing, dataflow, partitions: int, source,
                 replay_order: str, events: list, sinks: int = 1,
                 key_groups: int = KEY_GROUPS, running: int = 0):
        """``sinks``: the sink partitions committing at every cut (an egress each);
        ``key_groups``: the job's (DESIGN 13); ``running``: the pairs a job with dormant
        ones starts with (0: every pair runs; docs/design/rescaling.md)."""
        url = options.location
        if "://" not in url:
            url = os.path.abspath(url)  # executors run elsewhere
        self.url, self.interval = url, options.interval
        self.source = source
        store = CheckpointStore(url, keep=options.keep)
        print_ = fingerprint(dataflow, partitions)
        shape = JobShape.of(dataflow, partitions, key_groups, ordered_output=sinks == 1)
        #: the manifest of the checkpoint the next attempt starts from (None: the first
        #: input); a damaged newer one is passed over, another dataflow's refused, one of
        #: another partition count rescaled (its state split by key group, DESIGN 13)
        self.restore: Optional[dict] = store.restorable(
            check=lambda manifest: shape.routing(manifest, url))
        #: how keys are routed: the job's key groups, or the restored checkpoint's routing
        #: (None: ``hash % partitions``, a checkpoint written before key groups)
        self.key_groups: Optional[int] = key_groups if self.restore is None else \
            shape.routing(self.restore, url)
        #: where the source starts without a checkpoint (a restart before the first one;
        #: a ``SplitSource``'s splits start at their first input)
        self.start_position = None if isinstance(source, SplitSource) else source.position
        #: a source with partitions of its own interleaves them differently on every
        #: read: the ingress logs each input's partition before it leaves, and a restart
        #: replays that order
        self.input_log: Optional[InputLog] = InputLog(store) if replay_order == LOGGED \
            else None
        self.log_writer: Optional[InputLogWriter] = None
        #: the logged partitions of the inputs after the restored cut
        self.replay: List[Any] = []
        self.service = CheckpointService(store, CheckpointCoordinator(
            len(dataflow.stages), partitions, print_, sinks, key_groups=self.key_groups,
            shape=shape.shape), events=events, input_log=self.input_log)
        self.next_number = max(store.ids(), default=0) + 1
        self._cut_at = 0.0
        #: a checkpoint wanted at once (a lost replica set's rebuild under cluster pairs,
        #: ``flux.spark.set_rebuild``; a rescale, ``FluxJob.rescale``): the next input gets
        #: a cut, and its number is kept (``cut_now``, ``wanted_cut``)
        self._cut_wanted = False
        self.wanted_cut: Optional[int] = None
        #: a drained rescale's (DESIGN 13, docs/design/rescaling.md): the source is read
        #: up to this input at least and then no further, and the wanted cut falls after
        #: the last input read (None: no drain)
        self._drain_to: Optional[int] = None
        #: no restart restores a checkpoint older than this one, and why: a drained
        #: rescale restarted from it (the outputs up to its cut are in the old count's
        #: sinks), or it covers a live move of the last stage's groups
        self.floor, self.floor_why = store.floor() or (None, "")
        self._check_floor()
        #: the rules of live moves of the last stage with a sink per partition
        self.last_moves = LastStageMoves(len(dataflow.stages), sinks > 1, options.interval)
        self._tell_done: Optional[Callable[[int, int], None]] = None
        #: with dormant pairs, how many run now (``count_running``: the attempt's)
        self._pairs_running: Callable[[], int] = lambda: 0
        self.service.on_complete = self._completed
        self._offsets_reported: Optional[int] = None
        #: live moves of key groups asked, carried by cuts, and the maps they make
        self.moves: Optional[LiveMoves] = None if self.key_groups is None else LiveMoves(
            len(dataflow.stages), partitions, self.key_groups, self.restore, running=running)
        if self.restore is not None:
            log.info("resuming from checkpoint %d of %s (cut at input %d)",
                     self.restore["checkpoint"], url, self.restore["cut"])
            if self.restore["partitions"] != partitions:
                log.info("rescaling from %d to %d partitions: each new partition takes the "
                         "key groups it owns of the old partitions' state",
                         self.restore["partitions"], partitions)
                events.append((time.monotonic(), "rescale",
                               (self.restore["partitions"], partitions)))

    # -- a start or a restart ---------------------------------------------------------
    def plan(self, sink_holds: Optional[tuple]) -> None:
        """Read the input log past the restored cut, before any task starts; a move of the
        last stage waits for a cut past what the sinks hold (``sink_holds``)."""
        self.last_moves.restarted(sink_holds)
        if self.input_log is not None:
            self.replay = self._logged_order(sink_holds)

    def restart(self, sink_holds: Optional[tuple]) -> Optional[dict]:
        """The checkpoint a restart starts from: the store is the truth (a checkpoint the
        coordinator completed may have failed to get its manifest written, and one whose
        files do not verify is passed over; ``CheckpointCorrupt`` when none is left)."""
        self.service.settle()
        self.restore = self.service.store.latest()
        self._check_floor()
        if self._drain_to is not None:  # the drain goes on in the next attempt: past
            holds = sink_holds[0] if sink_holds else 0  # what the sinks hold now, cut anew
            self._drain_to = max(self._drain_to, holds)
            self.cut_now()
        self.service.coordinator.restarted(self.restore["checkpoint"] if self.restore
                                           else None)
        if self.moves is not None:
            self.moves.restarted(self.restore, self.service.coordinator.partitions)
        self.plan(sink_holds)
        return self.restore

    def _check_floor(self) -> None:
        """The checkpoint to restore is not older than the floor (``CheckpointMismatch``)."""
        had = self.restore["checkpoint"] if self.restore is not None else None
        if self.floor is not None and (had is None or had < self.floor):
            raise CheckpointMismatch(
                f"checkpoint {self.floor} of {self.url}, {self.floor_why}, does not "
                f"verify, and an older checkpoint cannot be restored: the sink partitions "
                f"hold outputs past its cut that a replay from before it would write "
                f"again to other partitions")

    def _raise_floor(self, checkpoint: int, why: str) -> None:
        """No restart from now on, of this driver or of one run again, restores a
        checkpoint older than ``checkpoint``."""
        self.floor, self.floor_why = checkpoint, why
        self.service.store.raise_floor(checkpoint, why)

    def _logged_order(self, sink_holds: Optional[tuple]) -> List[Any]:
        """Every input an output the sink holds derives from must get its SN again: if a
        damaged or missing entry of the log stops short of that, the job cannot resume
        exactly (``CheckpointCorrupt``, naming the entry). Short of that, what lies past
        the gap is dropped from the log: those inputs are read and logged anew, and
        nothing the sink has depends on them."""
        cut = self.restore["cut"] if self.restore else 0
        order, damaged = self.input_log.read_checked(after=cut)
        if damaged is None:
            return order
        needed = sink_holds[0] if sink_holds else 0
        if cut + len(order) < needed:
            raise CheckpointCorrupt(damaged.path, f"{damaged.why}; the sink holds outputs "
                                    f"of input {needed}, the log replays up to input "
                                    f"{cut + len(order)}")
        log.warning("the input log replays up to input %d (%s: %s); nothing the sink holds "
                    "depends on later inputs: they are read and logged anew",
                    cut + len(order), damaged.path, damaged.why)
        self.input_log.drop_after(cut + len(order))
        return order

    def open_source(self, events: list) -> tuple:
        """When the data starts: the source opened where the restored checkpoint says (or
        at its start), the logged order handed to it; returns ``(accepted, logged_before,
        log_writer)`` for the feed: inputs after the cut come again, numbered as before."""
        restore, source = self.restore, self.source
        source.open(restore["source"] if restore else self.start_position)
        accepted = logged_before = restore["cut"] if restore else 0
        self._cut_at = time.monotonic() + self.interval
        if self.input_log is not None:  # in the order they had (DESIGN 10)
            source.replay(self.replay)
            logged_before = accepted + len(self.replay)
            if self.log_writer is not None:
                self.log_writer.stop()
            self.log_writer = InputLogWriter(self.input_log)
            log.info("the input log replays inputs %d to %d in their logged order",
                     accepted + 1, logged_before)
            events.append((time.monotonic(), "input log replay", (accepted + 1, logged_before)))
        return accepted, logged_before, self.log_writer

    def node_settings(self, origin: float, now: float) -> dict:
        """What an attempt's nodes are told beside the checkpoint they restore (none
        here; the splits' logs for a ``SplitSource``: ``SplitCheckpoints``)."""
        return {}

    # -- while the data flows (the source's thread) -----------------------------------
    def maybe_cut(self, feed: IngressFeed) -> None:
        """Every ``interval`` seconds (when inputs came since the last), checkpoint the job
        at a cut after the last input handed over; while a rescale drains, only its cut."""
        feed.hold_from = self._drain_to
        if self.last_moves.blocks_cut():
            return  # a checkpoint that moved the last stage is not complete yet
        if self._drain_to is not None:
            if self._cut_wanted and feed.drained():  # again at the same place: a re-cut
                self._cut(feed, wanted=True)
            return
        now = time.monotonic()
        wanted = self._cut_wanted
        if now < self._cut_at and not wanted:
            return
        self._cut_at = now + self.interval
        if not feed.has_new_inputs():
            return  # nothing new since the last cut (a rebuild's waits for the next input)
        self._cut(feed, wanted)

    def _cut(self, feed: IngressFeed, wanted: bool) -> None:
        number = self.next_number
        self.next_number += 1
        moves, groups = self.moves_cut(number, feed.handed)
        cut, position = feed.choose_cut(number, moves)
        if self.moves is not None:
            self.moves.cut_at(number, cut)
        dormant = self.moves.unowned() if self.moves is not None else ()
        running = self.moves.running_at(self._pairs_running()) if self.moves is not None \
            and self.moves.first_running else None
        self.service.cut_chosen(number, cut, position, groups, dormant, running)
        if wanted:
            self.wanted_cut, self._cut_wanted = number, False

    def moves_cut(self, number: int, position: Any) -> Tuple[list, Optional[tuple]]:
        """The live moves asked that ride checkpoint ``number``'s cut at ``position``
        (DESIGN 13), and the maps before and after them (None: no key groups, or none
        moved); one of the last stage only past what the sinks held at a restart, and
        never at a drained rescale's cut (the drain's restart regroups every stage)."""
        if self.moves is None:
            return [], None
        latest = self.service.latest
        self.moves.completed(latest.number if latest is not None else 0)
        last = self.last_moves.may_move(position) and self._drain_to is None
        moves, groups = self.moves.cut(number, last)
        self.last_moves.cut(number, moves)
        return moves, groups

    def count_running(self, running: Callable[[], int]) -> None:
        """An attempt says how many pairs run now: each cut's manifest records it, and a
        restart from it runs as many at least (pairs started and idle keep what is not
        a key's, an expiry's watermark; docs/design/rescaling.md)."""
        self._pairs_running = running

    def tell_done(self, tell: Callable[[int, int], None]) -> None:
        """An attempt's controller is told, now, the checkpoint its data starts from and,
        later, each that completes (``CheckpointDone``: its egresses let go what they
        hold past a move of the last stage's groups at a cut up to it)."""
        self._tell_done = tell
        if self.restore is not None:
            tell(self.restore["checkpoint"], self.restore["cut"])

    def _completed(self, number: int, cut: int) -> None:
        """The service's thread: checkpoint ``number`` (cut ``cut``) is complete."""
        self.last_moves.completed(number)
        covered = self.last_moves.covered
        if covered is not None and (self.floor is None or covered > self.floor):
            self._raise_floor(covered, "which covers a live move of the last stage's key "
                                       "groups")
        if self._tell_done is not None:
            self._tell_done(number, cut)

    def cut_now(self) -> None:
        """A checkpoint at the next input, cut by the source's thread (it waits for an
        input when none came since the last cut); ``wanted_cut`` is its number once cut."""
        self.wanted_cut, self._cut_wanted = None, True

    def drain(self, holds: int) -> None:
        """A drained rescale (DESIGN 13): read the source up to input ``holds`` at least
        (the furthest input a sink holds an output of, its SN with splits: after a
        restart the replay must pass it, else the new count would write those outputs to
        other sink partitions) and no further, then cut there; ``cut_now`` cuts there
        again. Every sink commits up to the cut before its checkpoint completes, and
        holds nothing past it. (``SplitCheckpoints`` holds the pairs at an epoch.)"""
        self._drain_to = max(holds, 0)
        self.cut_now()

    def drained_restart(self, checkpoint: int) -> None:
        """The drained rescale restarts from ``checkpoint``: the next attempt reads on,
        and no restart from now on restores an older checkpoint (``floor``)."""
        self._drain_to = None
        self._raise_floor(checkpoint, "the one a drained rescale restarted from")
        self.cancel_cut()

    def end_drain(self) -> None:
        """The drained rescale was given up: the source is read on at this count."""
        self._drain_to = None
        self.cancel_cut()

    def cancel_cut(self) -> Optional[int]:
        """No checkpoint wanted any more; the number of the wanted one if it was cut."""
        self._cut_wanted = False
        return self.wanted_cut

    def wanted_complete(self) -> Optional[int]:
        """The number of the newest complete checkpoint once it is the wanted one or a
        later one, else None."""
        number, latest = self.wanted_cut, self.service.latest
        if number is not None and latest is not None and latest.number >= number:
            return latest.number
        return None

    def rescaled(self, partitions: int) -> None:
        """The job restarted at another partition count: the checkpoints from now on
        wait for its partitions (DESIGN 13)."""
        self.service.coordinator.rescaled(partitions)
        if self.moves is not None:
            self.moves.restarted(self.restore, partitions)

    def report_offsets(self, report: Optional[Callable[[Any], None]]) -> None:
        """A source that reports positions elsewhere (Kafka's consumer group, for lag
        monitoring) hears each complete checkpoint's, never one of inputs not yet covered
        by a checkpoint."""
        latest = self.service.latest
        if latest is None or report is None or latest.number == self._offsets_reported:
            return
        self._offsets_reported = latest.number
        try:
            report(latest.source)
        except Exception as exc:  # monitoring only: the checkpoint is the truth
            log.warning("could not report checkpoint %d's source position: %s",
                        latest.number, exc)

    def stop(self) -> None:
        self.service.stop()
        if self.log_writer is not None:
            self.log_writer.stop()
