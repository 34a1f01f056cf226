"""Which checkpoints a job may restore, and with which routing (DESIGN 10, 13).

A manifest written with key groups names the dataflow's shape (stage names, keys,
operators: ``fingerprint(dataflow, None)``) and the number of key groups: a job of the
same shape and key groups restores it at any partition count, each new partition taking
the groups it owns (a rescale). A manifest written before key groups names only a fingerprint of the
shape *and* the partition count, and its keys were routed by ``hash % partitions``: it
restores only at that count, with that routing.

Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from controller.checkpoints import fingerprint
from flux.dataflow import Dataflow
from flux.errors import CheckpointMismatch, RescaleRefused


@dataclass(frozen=True)
class JobShape:
    """This job's shape, partition count and key groups, against a manifest's."""

    shape: str  # ``fingerprint(dataflow, None)``: at any partition count
    partitions: int
    key_groups: int
    #: one ordered egress: its sink's last SN is the whole job's, so outputs stay exactly
    #: once across a rescale (an egress per partition: each sink's SN is its own)
    ordered_output: bool = True
    #: the dataflow: a manifest written before key groups names ``fingerprint(dataflow,
    #: its partitions)``
    dataflow: Optional[Dataflow] = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, dataflow: Dataflow, partitions: int, key_groups: int,
           ordered_output: bool = True) -> "JobShape":
        return cls(fingerprint(dataflow, None), partitions, key_groups, ordered_output, dataflow)

    def routing(self, manifest: dict, where: str) -> Optional[int]:
        """The key groups a restore of ``manifest`` (of checkpoint store ``where``) routes
        by: the manifest's, or None for one written before key groups. Refused with
        ``CheckpointMismatch`` naming what differs (``RescaleRefused`` for a partition
        count it cannot be restored at)."""
        k = manifest.get("checkpoint")
        groups, partitions = manifest.get("key_groups"), manifest.get("partitions")
        if groups is None:  # written before key groups
            written = manifest.get("fingerprint")
            same = isinstance(partitions, int) and partitions >= 1 and \
                written == fingerprint(self.dataflow, partitions)
            if same and partitions == self.partitions:
                return None
            if same:
                raise RescaleRefused(
                    f"checkpoint {k} at {where} was written with {partitions} partitions "
                    f"before key groups (its keys routed by hash % {partitions}): it is "
                    f"restored only with nodes={partitions}")
            raise self._mismatch(k, where, "another dataflow")
        if manifest.get("shape") != self.shape:
            raise self._mismatch(k, where, "another dataflow")
        if groups != self.key_groups:
            raise CheckpointMismatch(
                f"checkpoint {k} at {where} was written with key_groups={groups}, this job "
                f"has key_groups={self.key_groups}: key groups are the unit of keyed state, "
                f"run with key_groups={groups}")
        if partitions != self.partitions and not self.ordered_output:
            raise RescaleRefused(
                f"checkpoint {k} at {where} was written with {partitions} partitions, this "
                f"job has {self.partitions} and an egress per partition: each partition's "
                f"sink holds its own last output, and a key's outputs would move to "
                f"another partition's sink past what the restored cut says: run it at "
                f"{partitions} nodes and rescale it while it runs (job.rescale(n) drains "
                f"the sinks to its cut first), or use ordered_output=True")
        return groups

    def _mismatch(self, k, where: str, what: str) -> CheckpointMismatch:
        return CheckpointMismatch(
            f"the checkpoint at {where} (checkpoint {k}) was written by a job with {what} "
            f"(stage names, keys and operators must all be the same): use another "
            f"checkpoint location, or the dataflow that wrote it")
