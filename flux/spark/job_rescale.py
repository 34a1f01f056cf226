"""``FluxJob.rescale``: another number of nodes while the job runs, by a restart (DESIGN 13).

A checkpoint is cut at once (as a lost replica set's rebuild cuts one,
``flux.spark.set_rebuild``), and once it is complete the job restarts from it at the new
count: each new partition installs the key groups it owns of the checkpoint's
partitions (``flux.runtime.restore``), the source resumes at the cut, and the one
ordered egress's sink drops what it had. With an egress per partition the rescale
drains first (docs/design/rescaling.md): the source is read no further than the cut (a
``SplitSource``'s pairs take no input past the cut's epoch), so every sink partition
commits up to it and nothing past it, and the new count's outputs all lie above what
any old sink partition holds. The output stalls for a restart's
length (seconds); nothing is lost or twice. Live, without a restart: key groups moved
between the running pairs (``flux.spark.job_moves``), and a job started with
``max_nodes`` grown by dormant pairs started on standbys (``flux.spark.job_growth``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Optional

from flux.errors import RescaleRefused
from flux.rescale import check_rescalable
from flux.spark.attempt import driver_builder
from flux.spark.settings import check_settings

log = logging.getLogger(__name__)

#: seconds a wanted cut may wait for an input before the rescale goes from the newest
#: complete checkpoint instead (a source with nothing new: nothing to cut after)
IDLE_CUT_WAIT = 2.0
#: seconds a drained rescale's checkpoint may take before the source's thread cuts again at
#: the same place: a replica that died before its snapshot leaves a checkpoint open, and a
#: drained job has no later input to carry the next one (docs/design/rescaling.md)
RECUT_AFTER = 15.0
#: cuts again at most, before a drained rescale is given up and the job reads on at its
#: count (while a replica that writes snapshots is lost, no checkpoint completes)
RECUTS = 3


class RescaleAsked(Exception):
    """What the supervisor restarts the job for: ``nodes`` pairs from now on."""

    def __init__(self, nodes: int, checkpoint: Optional[int]):
        super().__init__(f"a rescale to {nodes} nodes (from checkpoint {checkpoint})")
        self.nodes, self.checkpoint = nodes, checkpoint


def check_rescale(dataflow, config, nodes: int, checkpoints, sample=()) -> None:
    """Refuse, naming why, a rescale this job cannot make, before anything stops
    (``sample``: the source's first records, ``check_rescalable``)."""
    if checkpoints is None:
        raise ValueError("rescale() restarts the job from a checkpoint cut now: give the "
                         "job checkpoint=")
    if config.key_groups is None:
        raise RescaleRefused("this job restored a checkpoint written before key groups "
                             "(its keys routed by hash % partitions): it cannot be "
                             "rescaled; start it on a new checkpoint location to rescale")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or \
            not 2 <= nodes <= config.key_groups:
        raise ValueError(f"nodes must be an int from 2 to key_groups ({config.key_groups}), "
                         f"got {nodes!r}")
    check_rescalable(dataflow, sample, config.key_groups)


def cut_for_rescale(checkpoints, timeout: float, clock=time.monotonic,
                    sleep=time.sleep) -> Optional[int]:
    """Cut a checkpoint now and wait until it is complete; its number (or a later one's).
    When no input comes to cut after within ``IDLE_CUT_WAIT``, the newest complete
    checkpoint's (None: none yet). ``TimeoutError`` if the cut does not complete."""
    checkpoints.cut_now()
    started = clock()
    while clock() - started < timeout:
        done = checkpoints.wanted_complete()
        if done is not None:
            return done
        if checkpoints.wanted_cut is None and clock() - started > IDLE_CUT_WAIT:
            if checkpoints.cancel_cut() is None:  # the source's thread did not cut it
                latest = checkpoints.service.latest
                return latest.number if latest is not None else None
        sleep(0.02)
    checkpoints.cancel_cut()
    raise TimeoutError(f"the rescale's checkpoint did not complete in {timeout}s")


def rescale_cut(checkpoints, output, ordered_output: bool, timeout: float) -> Optional[int]:
    """The checkpoint a rescale restarts from (None: the first input): one cut now
    (``cut_for_rescale``), or with an egress per partition a drained one (``drained_cut``)
    past the furthest input whose output a sink (of ``output``) holds."""
    if ordered_output:
        return cut_for_rescale(checkpoints, timeout)
    holds = output.holds(writers_running=True)
    return drained_cut(checkpoints, holds[0] if holds else 0, timeout)


def drained_cut(checkpoints, holds: int, timeout: float, clock=time.monotonic,
                sleep=time.sleep) -> int:
    """A drained rescale's checkpoint (``DriverCheckpoints.drain``): the source read up
    to ``holds`` at least and no further, a cut there, and its number once complete (the
    source stays held until the restart). Cut again at the same place every
    ``RECUT_AFTER`` seconds it is not complete, ``RECUTS`` times; then, or after
    ``timeout``, the drain is given up, the source read on, and ``TimeoutError`` raised."""
    checkpoints.drain(holds)
    started = cut_at = clock()
    recuts = 0
    try:
        while clock() - started < timeout:
            done = checkpoints.wanted_complete()
            if done is not None:
                return done
            if checkpoints.wanted_cut is None:
                cut_at = clock()  # not cut yet: the source is read up to ``holds``
            elif clock() - cut_at > RECUT_AFTER:
                if recuts == RECUTS:
                    break
                recuts += 1
                log.warning("the drained rescale's checkpoint %d did not complete in %.0fs: "
                            "cutting again at the same place (%d of %d)",
                            checkpoints.wanted_cut, RECUT_AFTER, recuts, RECUTS)
                checkpoints.cut_now()
                cut_at = clock()
            sleep(0.02)
    except BaseException:
        checkpoints.end_drain()
        raise
    checkpoints.end_drain()
    raise TimeoutError(f"the drained rescale's checkpoint did not complete ({recuts + 1} "
                       f"cuts, {clock() - started:.0f}s): the job goes on at its count; a "
                       f"replica that writes snapshots may be lost and not yet rebuilt")


def rescaled_parts(parts, nodes: int):
    """The parts every attempt shares (``JobParts``), at ``nodes`` pairs."""
    config = replace(parts.config, partitions=nodes)
    return replace(parts, config=config, builder=driver_builder(parts.builder.dataflow, config),
                   nodes=nodes)


class JobRescale:
    """``FluxJob.rescale``; mixed into ``FluxJob`` (its attributes are the job's)."""

    def rescale(self, nodes: int, timeout: float = 120.0) -> None:
        """Go on with ``nodes`` pairs (DESIGN 13; ``flux.spark.job_rescale``): a
        checkpoint cut now, then a restart from it at the new count, each new partition
        with the key groups it owns; returns once the data flows again. The output
        stalls for the restart; nothing is lost or twice. Needs ``checkpoint=``; refuses
        state it cannot split (``RescaleRefused``); with an egress per partition, drains
        first (``drained_cut``). At the job's own count, keys moved onto fewer pairs
        are spread over all of them again, live (``spread_key_groups``). A job started
        with ``max_nodes`` rescales live: up to it, dormant pairs start on standbys and
        the keys spread over them; below the pairs running, the keys spread over fewer
        and the others stop (``flux.spark.job_growth``)."""
        if self.attempt is None or self._stopped or self.finished():
            raise ValueError("rescale() a running job: start() it first (or give nodes= "
                             "to FluxJob), and not once it finished or stopped")
        check_rescale(self.dataflow, self.config, nodes, self._checkpointing, self._sample)
        if self.config.running:  # pairs started and dormant (``max_nodes``): live
            self._grow(nodes, timeout)
            return
        if nodes == self._parts.nodes:
            self._spread_again(nodes, timeout)
            return
        check_settings(self.spark, nodes + self._parts.standbys,
                       wait=self.options.network.executor_wait)
        cut = rescale_cut(self._checkpointing, self.output, self.config.ordered_output,
                          timeout)
        restarts = len(self.restart_log)  # (a lost pair's restart may come meanwhile)
        self._restart_due = RescaleAsked(nodes, cut)
        started = self.wait_until(lambda: self._parts.nodes == nodes and self.attempt.number
                                  > restarts and self.attempt.feed is not None, timeout)
        if not started:
            raise TimeoutError(f"the rescale to {nodes} nodes did not restart the data "
                               f"within {timeout}s")
