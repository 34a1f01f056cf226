"""The driver's side of checkpoints: reports in, manifests out (DESIGN 10).

The ingress's thread says when it chose a cut and where the source was; the
controller's thread passes on what the nodes wrote; the egress's thread says
when the sink committed at a cut. Each report goes on one queue, in the order
it was made (a node can write a checkpoint only after the ingress chose it),
and one thread of this service hands them to the pure
``CheckpointCoordinator`` and writes the manifest of every checkpoint that
completes (then the store drops the oldest). Nothing here runs on a data
thread, so a slow store holds up no output.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from controller.checkpoints import CheckpointCoordinator
from flux.control_messages import SnapshotWritten
from flux.runtime.checkpoint_store import CheckpointStore

log = logging.getLogger(__name__)

_STOP = object()


@dataclass(frozen=True)
class Completed:
    """A checkpoint whose manifest was written."""

    number: int
    cut: int
    nbytes: int  # the snapshots' bytes
    seconds: float  # from the cut's choice to the manifest
    at: float  # when (the service's clock)
    source: Any = None  # the source's position after the cut


class CheckpointService:
    def __init__(self, store: CheckpointStore, coordinator: CheckpointCoordinator,
                 clock: Callable[[], float] = time.monotonic, events=None, input_log=None):
        self.store, self.coordinator, self.clock = store, coordinator, clock
        #: the ingress's input log (a source of several partitions), or the splits' logs
        #: (``flux.runtime.split_log.SplitLogs``): what a kept checkpoint covers is
        #: removed from it (``truncate(cut)``)
        self.input_log = input_log
        self.events = events  # the job's event log, or None
        #: told ``(number, cut)`` of each checkpoint whose manifest was written, on the
        #: service's thread (the driver's rules of live moves, the egresses through them)
        self.on_complete: Optional[Callable[[int, int], None]] = None
        self.completed: List[Completed] = []
        self.errors: List[str] = []  # snapshots or manifests that could not be written
        self._begun: dict = {}  # checkpoint -> when its cut was chosen
        self._bytes: dict = {}  # checkpoint -> snapshot bytes so far
        self._chains: dict = {}  # replica -> the chain of its last snapshot written
        self._kept: List[int] = []  # the complete checkpoints the store kept at the last one
        self._reports: "queue.Queue" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="flux-checkpoints",
                                        daemon=True)
        self._thread.start()

    # -- reports (any thread) -------------------------------------------------------------
    def cut_chosen(self, number: int, cut: int, position: Any,
                   groups: Optional[tuple] = None, dormant=(),
                   running: Optional[int] = None) -> None:
        """``groups``: the key groups' maps before and after the live moves the cut
        carries; ``dormant``: the partitions empty at the cut, whose snapshots are taken
        as written; ``running``: with dormant pairs, how many had started
        (``CheckpointCoordinator.begin``)."""
        self._reports.put(("cut", number, cut, position, self.clock(), groups,
                           frozenset(dormant), running))

    def cut_begun(self, number: int, cut: int, groups: Optional[tuple] = None) -> None:
        """Checkpoint ``number``'s cut is ``cut``; the source's position comes later
        (``source_recorded``: several ingresses pass the cut each by itself).
        ``groups``: as ``cut_chosen``'s."""
        self._reports.put(("begin", number, cut, self.clock(), groups))

    def source_recorded(self, number: int, position: Any) -> None:
        self._reports.put(("source", number, position))

    def snapshot_written(self, msg: SnapshotWritten) -> None:
        self._reports.put(("part", msg))

    def sink_committed(self, number: int, sn: Optional[Tuple[int, ...]],
                       partition: int = 0) -> None:
        self._reports.put(("sink", number, sn, partition))

    @property
    def latest(self) -> Optional[Completed]:
        return self.completed[-1] if self.completed else None

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until every report made so far was handled."""
        done = threading.Event()
        self._reports.put(("settle", done))
        done.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        self._reports.put(_STOP)
        self._thread.join(timeout)

    # -- the service's thread -------------------------------------------------------------
    def _run(self) -> None:
        while True:
            report = self._reports.get()
            if report is _STOP:
                return
            try:
                self._handle(report)
            except Exception as exc:  # a store that fails: this checkpoint is lost, not the job
                log.exception("checkpoint report %r failed", report[:2])
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _handle(self, report) -> None:
        kind = report[0]
        c = self.coordinator
        if kind == "settle":
            report[1].set()
            return
        if kind == "cut":
            _, number, cut, position, at, groups, dormant, running = report
            c.begin(number, cut, groups, dormant, running)
            self._begun[number] = at
            self._complete(number, c.source_recorded(number, position))
        elif kind == "begin":
            _, number, cut, at, groups = report
            c.begin(number, cut, groups)
            self._begun[number] = at
        elif kind == "source":
            self._complete(report[1], c.source_recorded(report[1], report[2]))
        elif kind == "part":
            msg: SnapshotWritten = report[1]
            if msg.error:
                self.errors.append(f"checkpoint {msg.number}: {msg.name}: {msg.error}")
                log.warning("checkpoint %d will not complete: stage %d partition %d: %s",
                            msg.number, msg.addr.stage, msg.addr.partition, msg.error)
                return
            self._bytes[msg.number] = self._bytes.get(msg.number, 0) + msg.nbytes
            if msg.chain:
                self._chains[msg.addr] = msg.chain
            self._complete(msg.number, c.part_written(msg.number, msg.addr.stage,
                                                      msg.addr.partition, msg.name, msg.chain,
                                                      msg.digests))
        elif kind == "sink":
            _, number, sn, partition = report
            self._complete(number, c.sink_committed(number, sn, partition))

    def _complete(self, number: int, manifest: Optional[dict]) -> None:
        if manifest is None:
            return
        # a replica's next delta builds on its last chain, even where this manifest took
        # its twin's snapshot: pruning keeps those folders too, for replicas still writing
        # (a chain older than every kept checkpoint is a replica's that stopped: if it
        # writes again after all, its writer finds the base gone and writes whole)
        oldest = self._kept[0] if self._kept else number
        for addr in [a for a, chain in self._chains.items() if chain[-1][0] < oldest]:
            del self._chains[addr]
        self._kept = self.store.complete(
            number, manifest, protect={k for chain in self._chains.values() for k, _ in chain})
        now = self.clock()
        done = Completed(number, manifest["cut"], self._bytes.pop(number, 0),
                         now - self._begun.pop(number, now), now, manifest["source"])
        if self.input_log is not None:  # what no kept checkpoint's replay reads goes
            # the smallest cut, not the oldest checkpoint's: after a fallback to checkpoint
            # k, a newer damaged one (if it could not be set aside) may hold a later cut
            # than the checkpoints that follow k
            cuts = [manifest["cut"] if k == number else self.store.manifest(k)["cut"]
                    for k in self._kept]
            self.input_log.truncate(min(cuts))
        self.completed.append(done)
        del self.completed[:-64]  # the last few are enough for metrics
        for k in [k for k in self._begun if k < number]:  # abandoned: never completes
            del self._begun[k]
            self._bytes.pop(k, None)
        log.info("checkpoint %d complete: cut at input %d, %.1f MB of snapshots, %.2fs",
                 number, done.cut, done.nbytes / 1e6, done.seconds)
        if self.on_complete is not None:
            self.on_complete(number, done.cut)
        if self.events is not None:
            self.events.append((now, "checkpoint", (number, done.cut, done.nbytes,
                                                    round(done.seconds, 3))))
