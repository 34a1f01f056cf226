"""What the driver knows of the sinks' writers on the executors (``egress_on_executors``,
docs/design/parallel_io.md): no output passes through it, so it learns from each
writer's reports how far the outputs got (its metrics' settled inputs) and when the job
is done, and forwards their sinks' checkpoint commits to the checkpoint coordinator."""
from __future__ import annotations

from typing import Callable, Dict, Optional

from flux.control_messages import SinkCommitted, WriterProgress
from flux.sequence import INF, bound_key


class WriterWatch:
    """The last progress of each of ``partitions`` writers; told by the controller's
    thread, asked by the driver's."""

    def __init__(self, partitions: int,
                 on_commit: Optional[Callable[[int, object, int], None]] = None):
        """``on_commit(number, sn, partition)``: a writer's sink committed at a cut."""
        self.partitions = partitions
        self.on_commit = on_commit
        self.progress: Dict[int, WriterProgress] = {}
        #: partition -> the outputs its earlier writers committed (each writer counts
        #: from 0 on the node it starts on)
        self._earlier: Dict[int, int] = {}

    def report(self, msg) -> None:
        if isinstance(msg, WriterProgress):
            before = self.progress.get(msg.partition)
            if before is not None and msg.outputs < before.outputs:  # a writer started anew
                self._earlier[msg.partition] = self._earlier.get(msg.partition, 0) + \
                    before.outputs
            self.progress[msg.partition] = msg
        elif isinstance(msg, SinkCommitted) and self.on_commit is not None:
            self.on_commit(msg.number, msg.sn, msg.partition)

    def settled(self) -> Optional[int]:
        """Every output of inputs up to this is in its sink (None: not every writer
        reported yet)."""
        progress = dict(self.progress)
        if len(progress) < self.partitions:
            return None
        return min(r.settled for r in progress.values())

    def outputs(self) -> int:
        """The outputs the writers committed to their sinks, as far as they reported."""
        progress, earlier = dict(self.progress), dict(self._earlier)
        return sum(earlier.values()) + sum(r.outputs for r in progress.values())

    def finished(self, read: int) -> bool:
        """Every writer's bound covers input ``read`` (the last): no output can still come
        (as ``Egress.finished``, DESIGN 4.3)."""
        progress = dict(self.progress)
        return len(progress) == self.partitions and all(
            read == 0 or bound_key(r.bound) >= (read, INF) for r in progress.values())

    def watch(self, stop, metrics, finished, feed: Callable[[], object]) -> None:
        """A driver thread's loop until ``stop``: the metrics' settled inputs, and the
        job's end (``finished`` set) once the source is exhausted and every writer's
        bound covers the last input. The outputs counted add to those of the job's
        earlier attempts."""
        before = metrics.output_total
        while not stop.wait(0.01):
            settled = self.settled()
            if settled is not None:
                metrics.settled(settled)
            metrics.outputs_elsewhere(before + self.outputs())
            now = feed()
            if not finished.is_set() and now is not None and now.source_done \
                    and self.finished(now.read):
                finished.set()
