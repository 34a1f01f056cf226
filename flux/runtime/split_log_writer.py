"""Writing the pairs' entries to their splits' logs off a node loop's thread
(``flux.runtime.split_log``): a write on a slow store must hold up no other replica's
data, only the items the entries end (they wait for the write, as the driver's input log
holds its inputs, DESIGN 10).

One write at a time per replica, in order; a write that fails is tried again (the
entries wait meanwhile: nothing they number may leave unwritten) and the failure kept
in ``errors``.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Dict, Hashable, List, Sequence, Tuple

from flux.runtime.split_log import SplitLog

log = logging.getLogger(__name__)

_STOP = object()


class SplitLogWriter:
    def __init__(self, open_log: Callable[[int], SplitLog], retry_after: float = 0.5):
        """``open_log(split)``: the log this process writes for a split."""
        self.open_log, self.retry_after = open_log, retry_after
        self.errors: List[str] = []
        self._logs: Dict[int, SplitLog] = {}
        self._todo: "queue.Queue" = queue.Queue()
        self._done: "queue.Queue[Tuple[Hashable, int]]" = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flux-split-log", daemon=True)
        self._thread.start()

    def submit(self, key: Hashable, split: int, entries: Sequence[Tuple[int, Any]]) -> None:
        """Write ``entries`` ((place, entry) each) to split ``split``'s log; ``done`` gives
        ``(key, last place)`` once they are durable."""
        self._todo.put((key, split, list(entries)))

    def done(self) -> List[Tuple[Hashable, int]]:
        """The writes that became durable since the last call: (key, last place)."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._todo.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            task = self._todo.get()
            if task is _STOP:
                return
            key, split, entries = task
            while not self._stop.is_set():
                try:
                    if split not in self._logs:
                        self._logs[split] = self.open_log(split)
                    self._done.put((key, self._logs[split].write(entries)))
                    break
                except Exception as exc:
                    log.error("split %d's log could not be written (places %d-%d wait): %s",
                              split, entries[0][0], entries[-1][0], exc)
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    del self.errors[:-16]
                    self._stop.wait(self.retry_after)


__all__ = ["SplitLogWriter"]
