"""A thread that makes writes durable in the order they were submitted, for a loop that
must not wait on a store (the driver's input log, the splits' logs): a write that
fails is tried again after ``retry_after`` seconds, what it holds waiting meanwhile
(nothing it covers may go on unwritten), and the failure is kept in ``errors``."""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, List

log = logging.getLogger(__name__)

_STOP = object()


def drain(q: "queue.Queue") -> List[Any]:
    """Everything ``q`` holds now, in order, without waiting."""
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


class RetryingWriter:
    """Subclasses say how a task is written (``_write``, returning what ``_results``
    gives back) and what waits on it (``_waiting``, for the error)."""

    def __init__(self, name: str, retry_after: float = 0.5):
        self.retry_after = retry_after
        self.errors: List[str] = []
        self._todo: "queue.Queue" = queue.Queue()
        self._done: "queue.Queue" = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _write(self, task: Any) -> Any:
        raise NotImplementedError

    def _waiting(self, task: Any) -> str:
        raise NotImplementedError

    def _submit(self, task: Any) -> None:
        self._todo.put(task)

    def _results(self) -> List[Any]:
        """What the writes made durable since the last call returned, in order."""
        return drain(self._done)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._todo.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            task = self._todo.get()
            if task is _STOP:
                return
            while not self._stop.is_set():
                try:
                    self._done.put(self._write(task))
                    break
                except Exception as exc:
                    log.error("%s could not be written (%s wait): %s", self._thread.name,
                              self._waiting(task), exc)
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    del self.errors[:-16]
                    self._stop.wait(self.retry_after)


__all__ = ["RetryingWriter", "drain"]
