"""What users read of a running ``FluxJob``: its outputs, checkpoints, topology, where
its tasks run, its processes, and the lineage of an output.

A part of ``flux.spark.job.FluxJob`` (its attributes are the job's): the job's life
cycle (start, supervise, restart, wait, kill, stop) lives there, the read side here.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from flux.connectors.sources import SequenceSource
from flux.runtime.lineage import Lineage, lineage
from flux.spark.placement import placement_of


class JobViews:
    """The read side of a job; mixed into ``FluxJob``."""

    @property
    def delivered(self) -> List[Any]:
        """The outputs so far, in order, when kept (``keep_output``)."""
        return self.output.delivered

    @property
    def resumed_from(self) -> Optional[dict]:
        """The manifest of the checkpoint this job started from (it found one at its
        checkpoint location), or None: it started from the source's first input."""
        return self._resumed_from

    @property
    def checkpoints(self):
        """The checkpoint service (``completed``, ``latest``), or None without checkpoints."""
        return self._checkpointing.service if self._checkpointing else None

    @property
    def input_log(self):
        """The input log of a source whose order is logged, or None."""
        return self._checkpointing.input_log if self._checkpointing else None

    @property
    def controller(self):
        return self.attempt.controller if self.attempt else None

    @property
    def topology(self):
        """Who hosts what in the current attempt (``topology.where[addr]``: the node)."""
        return self.attempt.topology if self.attempt else self.config.topology()

    @property
    def running_pairs(self) -> int:
        """The pairs running now (with ``max_nodes``, the others are dormant)."""
        return self.attempt.running

    @property
    def task_results(self) -> List[Any]:
        return self.attempt.task_results if self.attempt else []

    @property
    def ingress_pid(self) -> Optional[int]:
        """The process the ingress runs in (this attempt's), or None before it starts."""
        a = self.attempt
        return a.ingress_process.pid if a is not None and a.ingress_process else None

    @property
    def metrics_url(self) -> Optional[str]:
        """Where Prometheus scrapes this job (``metrics_port``), or None."""
        return self.endpoint.url if self.endpoint is not None else None

    def driver_stats(self) -> list:
        """The counters of the ingress and the egress, as a segment's."""
        return self.attempt.driver_stats() if self.attempt else []

    def placement(self) -> Dict[str, dict]:
        """Where the job's tasks run now (``flux.spark.placement``)."""
        c = self.controller
        return placement_of(c, self.topology, len(self.dataflow.stages)) if c else {}

    def lineage(self, sn: Sequence[int], source: Any = None) -> Lineage:
        """The input output ``sn`` derives from (``flux.lineage``), read again from
        ``source``: a fresh copy of the job's source (its own is being read); None for a
        job whose source is a sequence. With checkpoints, read from the newest kept one
        before the input, in the input log's order where the source's order is logged."""
        if source is None:
            source = self.source.records if isinstance(self.source, SequenceSource) \
                else self.source
            if not isinstance(source, Sequence):
                raise ValueError("job.lineage(sn, source): give a fresh copy of the job's "
                                 "source (the same files, topic or sequence): the job is "
                                 "reading its own")
        location = self._checkpointing.url if self._checkpointing else None
        return lineage(sn, source, checkpoint=location)
