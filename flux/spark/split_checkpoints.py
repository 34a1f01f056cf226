"""The driver's part of checkpointing a job whose source is a ``flux.SplitSource``
(docs/design/parallel_io.md, checkpoints with pairs): no input passes the driver, so it
only steers.

- **Cuts.** Every ``interval`` seconds the coordinator names an epoch a margin ahead of
  the wall clock and tells every node (``CutAtEpoch``); the replicas of the pairs that
  decide stamp it, each by itself, and each pair reports passing it with its split's
  count there (``SplitCutPassed``) and, for a source that can seek
  (``flux.connector_api.SeekableSplits``), where the split's source stood at a count at
  or before it. With every split's, the checkpoint has its source position
  (``{"counts": [...], "marks": [...]}``). A pair already past that epoch refuses the
  cut and the checkpoint never completes (the next one does).
- **Restarts.** Each split's durable log is read, and every pair follows the entries
  past the restored cut (``node_settings``), reading its split from the mark (else
  from its origin); the epoch clock goes on past the last epoch any log starts, so a
  new driver's clock does not hold the pairs back.
- **The origin.** A source whose splits begin where it was made
  (``flux.connector_api.SplitOrigin``: Kafka's ``earliest`` and ``latest`` move) is
  read from the origin the first run at this location recorded: every count is from
  there.
- **Truncation.** As checkpoints complete, what no restart reads of the logs goes
  (``SplitLogs.truncate``, through the checkpoint service).
"""
from __future__ import annotations

import json
import logging
import math
import pickle
import time
from typing import Any, Callable, Dict, Optional, Tuple

from flux.connector_api import SplitOrigin
from flux.control_messages import CutAtEpoch, HoldInputs, SplitCutPassed
from flux.runtime.split_log import SplitLogs
from flux.sequence import EPOCH_INPUTS, epoch_ended_by, epoch_first
from flux.spark.driver_checkpoints import DriverCheckpoints

log = logging.getLogger(__name__)

#: how far ahead of the wall clock a cut's epoch lies (seconds): every node hears of it
#: before its pairs end that epoch, clocks a little apart included
CUT_AHEAD = 0.3
#: the checkpoints whose pairs' reports are kept while they come in (older: abandoned)
OPEN_CUTS = 16
#: seconds between tellings of a drained rescale's hold (``HoldInputs``)
HOLD_RETOLD = 0.5


def epoch_to_cut(epoch_now: int, epoch_interval: float) -> int:
    """The epoch whose end a cut named now is at: ``CUT_AHEAD`` past the clock's, so every
    pair hears of it before its leader ends that epoch."""
    return epoch_now + math.ceil(CUT_AHEAD / epoch_interval)


class SplitCheckpoints(DriverCheckpoints):
    def __init__(self, options, dataflow, partitions: int, source, splits: int,
                 epoch_interval: float, events: list, sinks: int, key_groups: int):
        super().__init__(options, dataflow, partitions, source, None, events, sinks=sinks,
                         key_groups=key_groups)
        self.splits, self.epoch_interval = splits, epoch_interval
        self.logs = SplitLogs(self.url, splits)
        if isinstance(source, SplitOrigin):  # counts from where the first run began
            recorded = self.logs.origin(source.origin())
            if recorded != source.origin():
                log.info("%r reads from the origin its first run at %s recorded: %s",
                         source, self.url, recorded)
                self.source = source.at_origin(recorded)
        self.service.input_log = self.logs  # truncated as checkpoints complete
        #: checkpoint -> split -> (its count at the cut, its source's mark or None), as
        #: the pairs report
        self._passed: Dict[int, Dict[int, Tuple[int, Any]]] = {}
        #: a drained rescale's epoch, past which the pairs take no input (None: none)
        self._hold_epoch: Optional[int] = None
        self._hold_told = 0.0
        position = self.restore["source"] if self.restore else None
        if self.restore is not None and not (
                isinstance(position, dict) and len(position.get("counts", ())) == splits
                and len(position.get("marks", ())) == splits):
            raise ValueError(f"checkpoint {self.restore['checkpoint']} of {self.url} holds "
                             f"the source position {position!r}, not a count for each of "
                             f"this SplitSource's {splits} splits: a job of another "
                             f"source wrote it (give another checkpoint location)")

    # -- a start or a restart ---------------------------------------------------------
    def node_settings(self, origin: float, now: float) -> dict:
        """This run's folder in the splits' logs, what its pairs follow of them past the
        restored cut, and the epoch clock's origin (``origin``, or earlier: the clock is
        past the last epoch any log starts)."""
        restore = self.restore
        cut = restore["cut"] if restore else 0
        logs = self.logs.replay(cut, restore["source"]["counts"] if restore else [])
        marks = {split: tuple(mark) for split, mark in enumerate(
            restore["source"]["marks"] if restore else []) if mark is not None}
        resume = {split: got for split, got in logs.items() if cut or got[1]}
        last = max(self.logs.last_epoch(logs), epoch_ended_by(cut, self.splits))
        if resume:
            log.info("the pairs of ingresses follow their splits' logs past cut %d: %s",
                     cut, {s: len(e) for s, (_, e, _) in resume.items()})
        self._cut_at = time.monotonic() + self.interval  # the first cut an interval on
        return dict(split_attempt=self.logs.next_attempt(),
                    split_resume=pickle.dumps((cut, resume, marks)) if resume else b"",
                    epoch_origin=min(origin, now - (last + 2) * self.epoch_interval))

    # -- while the data flows (a thread of the driver's) -----------------------------------
    def maybe_cut_at_epoch(self, epoch_now: int, tell: Callable[[Any], None],
                           done: bool) -> None:
        """Every ``interval`` seconds (and at once when one is wanted), checkpoint the
        job at the end of an epoch ``CUT_AHEAD`` past ``epoch_now``: ``tell`` every node.
        None once every split was read (``done``). While a rescale drains, only its cut
        (``_drain_at_epoch``)."""
        now = time.monotonic()
        if self.last_moves.blocks_cut():
            return  # a checkpoint that moved the last stage is not complete yet
        if self._drain_to is not None or self._hold_epoch is not None:
            self._drain_at_epoch(epoch_now, tell, now)
            return
        wanted = self._cut_wanted
        if (now < self._cut_at and not wanted) or done:
            return
        self._cut_at = now + self.interval
        self._cut_epoch(epoch_to_cut(epoch_now, self.epoch_interval), tell, wanted)

    def _drain_at_epoch(self, epoch_now: int, tell: Callable[[Any], None],
                        now: float) -> None:
        """A drained rescale (DESIGN 13): its cut at the end of an epoch at or past every
        SN a sink holds, every node told to hold its pairs past that epoch (told again
        every ``HOLD_RETOLD`` seconds: a node started since must hear it); a cut again,
        at a later epoch, holds the same inputs. Once the drain ends (given up), the
        pairs take inputs again."""
        if self._drain_to is None:  # given up
            self._hold_epoch = None
            tell(HoldInputs(None))
            return
        if self._hold_epoch is None:
            span = self.splits * EPOCH_INPUTS
            self._hold_epoch = max(epoch_to_cut(epoch_now, self.epoch_interval),
                                   self._drain_to // span)
            self._hold_told = 0.0
        if now - self._hold_told >= HOLD_RETOLD:
            tell(HoldInputs(self._hold_epoch))
            self._hold_told = now
        if self._cut_wanted:
            epoch = max(self._hold_epoch, epoch_to_cut(epoch_now, self.epoch_interval))
            self._cut_epoch(epoch, tell, True)

    def _cut_epoch(self, epoch: int, tell: Callable[[Any], None], wanted: bool) -> None:
        number = self.next_number
        self.next_number += 1
        cut = epoch_first(epoch + 1, 0, self.splits)
        moves, groups = self.moves_cut(number, cut)
        self.service.cut_begun(number, cut, groups)
        self._passed[number] = {}
        for old in sorted(self._passed)[:-OPEN_CUTS]:
            del self._passed[old]
        tell(CutAtEpoch(number, epoch, tuple(moves)))
        if wanted:
            self.wanted_cut, self._cut_wanted = number, False

    def passed(self, msg: SplitCutPassed) -> None:
        """A pair passed a cut (both replicas report it: the first counts); with every
        split's count, the checkpoint has its source position."""
        got = self._passed.get(msg.number)
        if got is None:
            return  # of an earlier run, or abandoned long ago
        if msg.split in got:
            if got[msg.split][0] != msg.read:  # the twins read the same split to one cut
                log.error("split %d passed checkpoint %d's cut having read %d inputs, "
                          "and %d by its twin's report", msg.split, msg.number, msg.read,
                          got[msg.split][0])
            return
        got[msg.split] = (msg.read, json.loads(msg.mark) if msg.mark else None)
        if len(got) == self.splits:
            del self._passed[msg.number]
            self.service.source_recorded(msg.number, {
                "counts": [got[i][0] for i in range(self.splits)],
                "marks": [got[i][1] for i in range(self.splits)]})

    def restart(self, sink_holds):
        self._passed.clear()  # the old run's cuts will not complete
        self._hold_epoch = None  # a drain goes on: at an epoch of the next attempt's clock
        return super().restart(sink_holds)


__all__ = ["SplitCheckpoints", "CUT_AHEAD", "epoch_to_cut"]
