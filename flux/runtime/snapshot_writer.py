"""Write a node's checkpoint snapshots to the store off the data thread (DESIGN 10).

The segment packs its operators' state at the cut on the data thread (that is
what makes the snapshot consistent); the bytes go to the checkpoint store from
this thread, so a slow disk or object store never holds up the output. The
node's loop collects what was written (``done``) and reports it to the
controller, which completes the checkpoint once every partition is in.

A delta (``Snapshot.base``) builds on the file this writer wrote for the
same replica at checkpoint ``base``: the writer keeps each replica's chain
(flux.snapshot_chain) and reports it with the file, and every file's
checksum, so the manifest names every file a restore reads and what it must
hash to. A delta whose base it did not write (that write
failed) is not written: it is reported as an error, and the loop tells the
segment its next snapshot must be whole.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Dict, List, Optional, Tuple

from flux.addresses import Addr, P
from flux.control_messages import SnapshotWritten
from flux.effects import Snapshot
from flux.runtime.checkpoint_store import CheckpointStore, digest
from flux.runtime.retrying_writer import drain

log = logging.getLogger(__name__)

_STOP = object()


def snapshot_name(addr: Addr, job: str = "") -> str:
    """The file of replica ``addr``'s snapshot in a checkpoint's folder: both replicas of a
    partition may write one, a node of an earlier run of the job (its driver died, it
    has not noticed yet) may still write into a folder this run numbers alike, and so
    may a process declared dead that still runs (a zombie) beside the replica rebuilt in
    its place: never the same file (``job`` tells the runs, and the writing processes'
    incarnations, apart)."""
    replica = "P" if addr.replica == P else "S"
    return f"stage{addr.stage}-part{addr.partition}-{replica}{'-' + job if job else ''}.state"


class SnapshotWriter:
    """One thread that writes snapshots to ``store`` in the order they come."""

    def __init__(self, store: CheckpointStore, job: str = "", clock=time.monotonic):
        self.store, self.job = store, job
        self.clock = clock
        self._todo: "queue.Queue" = queue.Queue()
        self._done: "queue.Queue[SnapshotWritten]" = queue.Queue()
        #: per replica, the files of its last snapshot's chain and their checksums (writer
        #: thread only)
        self._chains: Dict[Addr, Tuple[Tuple[int, str], ...]] = {}
        self._digests: Dict[Addr, Tuple[str, ...]] = {}
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
        return drain(self._done)

    def _run(self) -> None:
        while True:
            snap = self._todo.get()
            if snap is _STOP:
                return
            self._done.put(self._write(snap))

    def _write(self, snap: Snapshot) -> SnapshotWritten:
        name = snapshot_name(snap.addr, self.job)
        started = self.clock()
        chain = self._chains.pop(snap.addr, ())
        digests = self._digests.pop(snap.addr, ())
        try:
            if snap.base is not None and (not chain or chain[-1][0] != snap.base):
                raise ValueError(f"a delta over checkpoint {snap.base}, whose snapshot this "
                                 f"node did not write")
            missing = [k for k, file in chain if not self.store.exists(k, file)] \
                if snap.base is not None else []
            if missing:  # pruned: this replica had stopped writing for a while
                raise FileNotFoundError(f"a delta over checkpoint {snap.base}, whose chain "
                                        f"lost the files of checkpoints {missing}")
            chain = (chain if snap.base is not None else ()) + ((snap.number, name),)
            digests = (digests if snap.base is not None else ()) + (digest(snap.data),)
            self.store.write(snap.number, name, snap.data)
        except Exception as exc:  # the checkpoint stays incomplete; the job goes on
            log.error("checkpoint %d: could not write %s to %s: %s", snap.number, name,
                      self.store.url, exc)
            return SnapshotWritten(snap.number, snap.addr, name, 0, self.clock() - started,
                                   f"{type(exc).__name__}: {exc}"[:500])
        self._chains[snap.addr], self._digests[snap.addr] = chain, digests
        return SnapshotWritten(snap.number, snap.addr, name, len(snap.data),
                               self.clock() - started, chain=chain, digests=digests)

    def stop(self, timeout: Optional[float] = 10.0) -> None:
        """Finish what is queued, then end the thread."""
        self._todo.put(_STOP)
        self._thread.join(timeout)
