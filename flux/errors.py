"""The errors of the library: the ones users catch, and the protocol's own.

Users catch ``DataflowError`` (a dataflow refused before it runs),
``OperatorError`` (their code raised on a record while the job ran) and
``PairLost`` (both replicas of a partition failed: not maskable).

A protocol machine raises ``RemoteProtocolError`` when a peer sent something
no state of it can accept, and ``LocalProtocolError`` when its own driver
called it out of turn (h11's split): the first is a fault of another process,
the second a bug here. Both are ``ProtocolError``.
"""
from __future__ import annotations

from typing import Any, Optional


class ProtocolError(Exception):
    """A rule of the protocol was broken."""


class RemoteProtocolError(ProtocolError):
    """A peer sent something no state of this machine can accept."""


class LocalProtocolError(ProtocolError):
    """This machine was called out of turn by its own process (a bug here)."""


class DataflowError(ValueError):
    """A dataflow or operator that breaks the contract, found before the job runs."""


class OperatorError(RuntimeError):
    """User code (an operator, or the key that routes its outputs) raised on a record.

    Both replicas of the partition run the same code on the same input, so failing over
    would only fail again: the job stops with this error, which names the operator, the
    stage and partition, and the input's sequence number, so the record can be found."""

    def __init__(self, what: str, stage: int, partition: int, sn: Any, error: str):
        self.what, self.stage, self.partition = what, stage, partition
        self.sn, self.error = tuple(sn), error
        super().__init__(f"{what} failed in stage {stage}, partition {partition}, on the "
                         f"record with sequence number {self.sn}: {error}")

    def __reduce__(self):  # picklable, e.g. out of a Spark task
        return (OperatorError, (self.what, self.stage, self.partition, self.sn, self.error))


class ReplicasDiverged(RuntimeError):
    """The replicas of a partition disagree at a cut (DESIGN 14): their states or outputs
    differ, so one of its operators is not deterministic (or a replica's memory was
    damaged), and a failover would deliver the other replica's different output. The job
    stops with ``on_divergence="fail"``; ``message`` names stage, partition, checkpoint,
    cut and the operators whose states differ, and the first key whose values differ
    where both replicas could say (``key``: ``(operator index, key)``, else None)."""

    def __init__(self, message: str, stage: int, partition: int, number: int,
                 operators: tuple = (), key: Optional[tuple] = None):
        self.stage, self.partition, self.number = stage, partition, number
        self.operators = tuple(operators)
        self.key = key
        super().__init__(message)

    def __reduce__(self):
        return (ReplicasDiverged, (str(self), self.stage, self.partition, self.number,
                                   self.operators, self.key))


class PairLost(RuntimeError):
    """Both replicas of a partition are gone: the job must stop (DESIGN 4.6)."""

    def __init__(self, stage: int, partition: int):
        self.stage, self.partition = stage, partition
        super().__init__(f"both replicas of stage {stage} partition {partition} failed; "
                         "the job cannot continue without losing data")


class ReplicaSetLost(PairLost):
    """Under cluster pairs (paper 4.2, DESIGN 7) a replica set failed, and a checkpoint
    cut after the loss completed (a consistent snapshot of the surviving set): the job
    restarts from it, which rebuilds the lost set. Every pair had one replica left: no
    pair was lost; a restart is how this baseline rebuilds (the paper's stall)."""

    def __init__(self, replica: int, checkpoint: int):
        self.replica, self.checkpoint = replica, checkpoint
        self.stage = self.partition = None
        RuntimeError.__init__(self, f"replica set {'PS'[replica]} failed (cluster pairs): "
                              f"rebuilt by a restart from checkpoint {checkpoint}, cut "
                              "after the loss")

    def __reduce__(self):
        return (ReplicaSetLost, (self.replica, self.checkpoint))

    def __reduce__(self):
        return (PairLost, (self.stage, self.partition))


class IngressLost(RuntimeError):
    """The ingress's process died (the OOM killer, a signal): the inputs it held and had
    not yet sent are gone with it, so the job cannot go on; with a checkpoint it restarts
    from there, as after a lost pair (DESIGN 10)."""


class SinkFenced(RuntimeError):
    """Another writer committed to this exactly-once sink since it was opened (another
    incarnation of the job took over): this one must stop, not write a duplicate."""


class CheckpointMismatch(ValueError):
    """A checkpoint written by a job with another dataflow, or one that cannot be restored
    at this job's partition count."""


class RescaleRefused(CheckpointMismatch):
    """A checkpoint's state cannot be split over another partition count: an operator's
    state is not a keyed store, or holds keys other than its stage's partition key
    (DESIGN 13)."""


class DamagedFile(RuntimeError):
    """A file the library wrote and must trust does not verify (truncated, changed, zeroed
    or missing): read as if whole, it would give a wrong result without a word."""

    def __init__(self, path: str, why: str):
        self.path, self.why = path, why
        super().__init__(self._message())

    def _message(self) -> str:
        return f"{self.path} is damaged: {self.why}"

    def __reduce__(self):
        return (type(self), (self.path, self.why))


class CheckpointCorrupt(DamagedFile):
    """A checkpoint file that does not verify, and no older complete checkpoint to fall
    back to whose files all verify: the job stops and names the file."""

    def _message(self) -> str:
        return (f"checkpoint file {self.path} is damaged ({self.why}), and no older complete "
                f"checkpoint verifies: the job cannot resume without a wrong state")


class SourceOrderUnknown(ValueError):
    """``checkpoint=`` with a source that does not say how a restart reads it again in the
    same order (``replay_order``): a wrong guess would give inputs other SNs than before,
    and outputs already committed would belong to other inputs, with no one noticing."""
