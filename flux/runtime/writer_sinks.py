"""The sinks of the writers a node runs (docs/design/parallel_io.md).

A last-stage partition's egress may run on a node as a sink's writer
(``flux.protocol.sink_writer``): its outputs go from that node's loop straight into the
partition's exactly-once sink (a ``flux.Sink``, opened by the job's
``SinkPerPartition`` on the node), and its commits are this sink's. After a commit the
writer acks both replicas of its partition. A writer the controller starts here again
(its old node died) opens its partition's sink anew (the sink fences the old writer:
what it had not committed is gone) and resumes after the last output the sink
committed.

A sink commits on a thread of its own (``submit``, then ``finished`` at a later turn):
a commit waits on the sink's broker or store, for up to its timeout, and the node's
loop, which runs every replica there, must not wait with it (a loop stalled on a broker
was declared stuck and its pairs lost). Outputs released meanwhile wait here until
it returns; the writer's acks cover what the commit covered (``SinkCommit.through``).
A writer started again opens its sink on a thread too (``start``, then ``opened``): an
open fences the old writer and reads back what it committed, which may wait for a
transaction a crash left open (a Kafka sink: up to twice its timeout); the writer is
held meanwhile (``SinkWriter.hold``).
"""
from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, List, Set, Tuple

from flux.addresses import Addr
from flux.control_messages import WriterProgress
from flux.connector_api import ClosingSink, is_exactly_once, open_at_once
from flux.effects import SinkCommit
from flux.protocol.sink_writer import SinkWriter

log = logging.getLogger(__name__)

SN = Tuple[int, ...]


def kept_by(items, committed) -> int:
    """How many of ``items`` (in SN order) lie past ``committed``: what an exactly-once
    sink keeps of them (a restart's replay of what it holds is dropped)."""
    if committed is None or tuple(items[0][0]) > committed:
        return len(items)
    return sum(1 for sn, _ in items if tuple(sn) > committed)


class WriterSinks:
    """Partition -> its sink, for the writers of one node."""

    def __init__(self, open_sink: Callable[[int], Any],
                 new_writer: Callable[[int], SinkWriter], commit_interval: float = 0.1):
        """``open_sink(partition)``: that partition's exactly-once sink (the job's
        ``SinkPerPartition.open``); ``new_writer(partition)``: a fresh writer;
        ``commit_interval``: seconds a writer's items wait for a commit at most (its
        replicas keep them until then)."""
        self.commit_interval = commit_interval
        self._committed_at = self._reported_at = float("-inf")
        self._reported: Dict[int, WriterProgress] = {}
        #: partition -> its writer's progress as of its sink's last commit
        self._at_commit: Dict[int, WriterProgress] = {}
        self.open_sink = open_sink
        self.new_writer = new_writer
        self.sinks: Dict[int, Any] = {}
        self.last: Dict[int, SN] = {}  # partition -> the last output written to its sink
        #: partition -> outputs its writer here wrote that its sink keeps
        self.handed: Dict[int, int] = {}
        self.writers: Dict[int, SinkWriter] = {}  # partition -> its writer here
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="flux-sink-commit")
        #: (one thread per sink being opened: see ``open_at_once``)
        self._opener = ThreadPoolExecutor(8, thread_name_prefix="flux-sink-open")
        #: partition -> the sink being opened for its held writer, and the failures the
        #: view that started it knew
        self._opening: Dict[int, Tuple[Future, SinkWriter, Set[Addr]]] = {}
        #: partition -> the commit its sink is making, its future and its progress report
        self._inflight: Dict[int, Tuple[SinkCommit, Future, WriterProgress]] = {}
        self._queued: Dict[int, Deque[SinkCommit]] = {}  # commits asked meanwhile
        self._held: Dict[int, List] = {}  # outputs released meanwhile, for the sink after

    def _opened_as(self, partition: int, sink) -> Any:
        if not is_exactly_once(sink):
            raise TypeError(f"a writer on a node needs an exactly-once sink (a flux.Sink) "
                            f"for partition {partition}, got {type(sink).__name__}: a "
                            f"writer started again must read back what was committed")
        self.sinks[partition] = sink
        return sink

    def adopt(self, writers: List[SinkWriter]) -> List[SinkWriter]:
        """The writers built with the node (the job's start): their sinks opened, at once
        (``open_at_once``); a restart's replay of what one committed is dropped by its
        sink."""
        partitions = [w.partition for w in writers]
        for writer, sink in zip(writers, open_at_once(self.open_sink, partitions)):
            self._opened_as(writer.partition, sink)
            self.writers[writer.partition] = writer
        return writers

    def start(self, addr: Addr, dead: Set[Addr]) -> Tuple[SinkWriter, List]:
        """A view starts the writer ``addr`` here (``Host``'s ``writer_factory``): held
        until its sink is open (``opened``)."""
        p = addr.partition
        self.last.pop(p, None)
        self._at_commit.pop(p, None)
        self.writers.pop(p, None)
        self.handed[p] = 0
        writer = self.new_writer(p)
        writer.hold()
        self._opening[p] = (self._opener.submit(self.open_sink, p), writer, set(dead))
        log.info("writer of partition %s starts here: opening its sink", p)
        return writer, []

    def opened(self) -> List:
        """The writers whose sink opened: each resumes after the last output its sink
        committed (effects). A sink's error is raised here."""
        effects: List = []
        for p, (future, writer, dead) in list(self._opening.items()):
            if not future.done():
                continue
            del self._opening[p]
            sink = self._opened_as(p, future.result())
            self.writers[p] = writer
            log.info("writer of partition %s resumes after output %s", p, sink.committed())
            effects.extend(writer.resume(sink.committed(), dead))
        return effects

    def commits_due(self, now: float) -> List:
        """Every ``commit_interval``: each writer with items since its last commit commits
        (the effects: its ``SinkCommit``, which the loop carries out)."""
        if now - self._committed_at < self.commit_interval:
            return []
        self._committed_at = now
        return [e for writer in self.writers.values() for e in writer.commit_now()]

    def deliver(self, partition: int, items) -> None:
        if not items:
            return
        if partition in self._inflight:  # after the commit the sink is making
            self._held.setdefault(partition, []).append(items)
            return
        sink = self.sinks[partition]
        kept = kept_by(items, sink.committed())
        sink.write(items)
        self.last[partition] = tuple(items[-1][0])
        self.handed[partition] = self.handed.get(partition, 0) + kept

    def submit(self, commit: SinkCommit) -> None:
        """Make what the partition's sink was given durable, off the loop's thread (after
        the commit it is making, if any); ``finished`` says when it returned."""
        p = commit.partition
        if p in self._inflight:
            self._queued.setdefault(p, deque()).append(commit)
            return
        sink, last = self.sinks[p], self.last.get(p)
        committed = sink.committed()
        if last is not None and (committed is None or last > committed):
            future = self._committer.submit(sink.commit, last)
        else:
            future = Future()
            future.set_result(None)
        self._inflight[p] = (commit, future, self._progress_now(p, self.writers[p]))

    def finished(self) -> List[Tuple[SinkCommit, Any, List]]:
        """The commits whose sink returned: each with the last SN its sink holds now and
        its writer's acks to both replicas (effects). A sink's error is raised here."""
        out = []
        for p, (commit, future, progress) in list(self._inflight.items()):
            if not future.done():
                continue
            del self._inflight[p]
            future.result()
            self._at_commit[p] = progress
            out.append((commit, self.sinks[p].committed(),
                        self.writers[p].committed(commit.through)))
            for items in self._held.pop(p, []):
                self.deliver(p, items)
            queued = self._queued.get(p)
            if queued:
                self.submit(queued.popleft())
        return out

    def _progress_now(self, partition: int, writer: SinkWriter) -> WriterProgress:
        frontier, settled = writer.bounds()
        return WriterProgress(partition, frontier, settled, self.handed.get(partition, 0))

    def progress(self, now: float) -> List[WriterProgress]:
        """How far each writer's committed outputs got, for the driver (the job's end,
        its metrics), when it moved on and at most every ``commit_interval``: its bound
        now if everything it sent to its sink is committed, else its bound at its sink's
        last commit (at full rate a writer always has outputs since its last commit: its
        reports would otherwise stop until the feed pauses)."""
        if now - self._reported_at < self.commit_interval:
            return []
        self._reported_at = now
        out = []
        for p, writer in sorted(self.writers.items()):
            before = self._reported.get(p)
            if writer.uncommitted or p in self._inflight:
                report = self._at_commit.get(p, before)
                if report is None:
                    continue
            else:  # all committed: as good as a commit's, and never older than one
                report = self._at_commit[p] = self._progress_now(p, writer)
            if before != report:
                self._reported[p] = report
                out.append(report)
        return out

    def close(self) -> None:
        """The job's end: the commits being made return, then every sink closes."""
        for p, (future, _, _) in list(self._opening.items()):
            if future.exception() is None:  # (to be closed)
                self.sinks[p] = future.result()
        self._opening.clear()
        self._opener.shutdown(wait=True)
        while self._inflight:
            for _, future, _ in list(self._inflight.values()):
                future.result()
            self.finished()  # (and the commits asked meanwhile, in order)
        self._committer.shutdown(wait=True)
        for sink in self.sinks.values():
            if isinstance(sink, ClosingSink):
                sink.close()
