"""Writing the pairs' entries to their splits' logs off a node loop's thread
(``flux.runtime.split_log``): a write on a slow store must hold up no other replica's
data, only the items the entries end (they wait for the write, as the driver's input log
holds its inputs, DESIGN 10).

One write at a time per replica (the node's ``NodeIngresses`` waits for one before it
submits the next), in order; a write that fails is tried again, the entries waiting
meanwhile (``flux.runtime.retrying_writer``).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, List, Sequence, Tuple

from flux.runtime.retrying_writer import RetryingWriter
from flux.runtime.split_log import SplitLog


class SplitLogWriter(RetryingWriter):
    def __init__(self, open_log: Callable[[int], SplitLog], retry_after: float = 0.5):
        """``open_log(split)``: the log this process writes for a split."""
        self.open_log = open_log
        self._logs: Dict[int, SplitLog] = {}
        super().__init__("flux-split-log", retry_after)

    def submit(self, key: Hashable, split: int, entries: Sequence[Tuple[int, Any]]) -> None:
        """Write ``entries`` ((place, entry) each) to split ``split``'s log; ``done`` gives
        ``(key, last place)`` once they are durable."""
        self._submit((key, split, list(entries)))

    def done(self) -> List[Tuple[Hashable, int]]:
        """The writes that became durable since the last call: (key, last place)."""
        return self._results()

    def _write(self, task) -> Tuple[Hashable, int]:
        key, split, entries = task
        if split not in self._logs:
            self._logs[split] = self.open_log(split)
        return key, self._logs[split].write(entries)

    def _waiting(self, task) -> str:
        _, split, entries = task
        return f"split {split}'s places {entries[0][0]}-{entries[-1][0]}"


__all__ = ["SplitLogWriter"]
