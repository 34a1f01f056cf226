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

from dataclasses import dataclass
from typing import Dict, Optional

from controller.checkpoints import fingerprint
from flux.dataflow import Dataflow
from flux.errors import CheckpointMismatch, RescaleRefused


@dataclass(frozen=True)
class JobShape:
    """This job's shape, partition count and key groups, against a manifest's."""

    shape: str  # ``fingerprint(dataflow, None)``: at any partition count
    #: ``fingerprint(dataflow, n)`` for n from 1 to ``key_groups``: what a manifest
    #: written before key groups names
    legacy: Dict[int, str]
    partitions: int
    key_groups: int
    #: one ordered egress: its sink's last SN is the whole job's, so outputs stay exactly
    #: once across a rescale (an egress per partition: each sink's SN is its own)
    ordered_output: bool = True

    @classmethod
    def of(cls, dataflow: Dataflow, partitions: int, key_groups: int,
           ordered_output: bool = True) -> "JobShape":
        legacy = {n: fingerprint(dataflow, n) for n in range(1, max(key_groups, partitions) + 1)}
        return cls(fingerprint(dataflow, None), legacy, partitions, key_groups, ordered_output)

    def routing(self, manifest: dict, where: str) -> Optional[int]:
        """The key groups a restore of ``manifest`` (of checkpoint store ``where``) routes
        by: the manifest's, or None for one written before key groups. Refused with
        ``CheckpointMismatch`` naming what differs (``RescaleRefused`` for a partition
        count it cannot be restored at)."""
        k = manifest.get("checkpoint")
        groups, partitions = manifest.get("key_groups"), manifest.get("partitions")
        if groups is None:  # written before key groups
            written = manifest.get("fingerprint")
            if written == self.legacy.get(self.partitions) and partitions == self.partitions:
                return None
            if isinstance(partitions, int) and written == self.legacy.get(partitions):
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
                f"another partition's sink; rescale with ordered_output=True")
        return groups

    def _mismatch(self, k, where: str, what: str) -> CheckpointMismatch:
        return CheckpointMismatch(
            f"the checkpoint at {where} (checkpoint {k}) was written by a job with {what} "
            f"(stage names, keys and operators must all be the same): use another "
            f"checkpoint location, or the dataflow that wrote it")
