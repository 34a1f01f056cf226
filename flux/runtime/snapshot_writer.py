"""Write a node's checkpoint snapshots to the store off the data thread (DESIGN 10).

The segment packs its operators' state at the cut on the data thread (that is
what makes the snapshot consistent); the bytes go to the checkpoint store from
this thread, so a slow disk or object store never holds up the output. The
node's loop collects what was written (``done``) and reports it to the
controller, which completes the checkpoint once every partition is in.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import List, Optional

from flux.addresses import Addr, P
from flux.control_messages import SnapshotWritten
from flux.effects import Snapshot
from flux.runtime.checkpoint_store import CheckpointStore

log = logging.getLogger(__name__)

_STOP = object()


def snapshot_name(addr: Addr, job: str = "") -> str:
    """The file of replica ``addr``'s snapshot in a checkpoint's folder: both replicas of a
    partition may write one, and a node of an earlier run of the job (its driver died, it
    has not noticed yet) may still write into a folder this run numbers alike: never the
    same file (``job`` tells the runs apart)."""
    replica = "P" if addr.replica == P else "S"
    return f"stage{addr.stage}-part{addr.partition}-{replica}{'-' + job if job else ''}.state"


class SnapshotWriter:
    """One thread that writes snapshots to ``store`` in the order they come."""

    def __init__(self, store: CheckpointStore, job: str = "", clock=time.monotonic):
        self.store, self.job = store, job
        self.clock = clock
        self._todo: "queue.Queue" = queue.Queue()
        self._done: "queue.Queue[SnapshotWritten]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="flux-snapshot-writer",
                                        daemon=True)
        self._thread.start()

    def write(self, snap: Snapshot) -> None:
        """Queue ``snap`` (its data packed) for the store; returns at once."""
        if snap.data is None:
            raise ValueError(f"{snap.addr}: a snapshot without its state cannot be written")
        self._todo.put(snap)

    def done(self) -> List[SnapshotWritten]:
        """What was written (or failed) since the last call: the reports for the controller."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def _run(self) -> None:
        while True:
            snap = self._todo.get()
            if snap is _STOP:
                return
            name = snapshot_name(snap.addr, self.job)
            started = self.clock()
            try:
                self.store.write(snap.number, name, snap.data)
            except Exception as exc:  # the checkpoint stays incomplete; the job goes on
                log.error("checkpoint %d: could not write %s to %s: %s", snap.number, name,
                          self.store.url, exc)
                self._done.put(SnapshotWritten(snap.number, snap.addr, name, 0,
                                               self.clock() - started,
                                               f"{type(exc).__name__}: {exc}"[:500]))
                continue
            self._done.put(SnapshotWritten(snap.number, snap.addr, name, len(snap.data),
                                           self.clock() - started))

    def stop(self, timeout: Optional[float] = 10.0) -> None:
        """Finish what is queued, then end the thread."""
        self._todo.put(_STOP)
        self._thread.join(timeout)
