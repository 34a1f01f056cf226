"""The durable input log of a source with partitions of its own (DESIGN 10).

A Kafka topic's partitions interleave differently on every read, so a restart
would number the inputs after a checkpoint's cut otherwise, and outputs the
sink committed would belong to other inputs. The ingress (``log_inputs``)
holds every input until the partition it came from is in this log; a restart
reads the log past the checkpoint's cut and has the source replay that order
(``PartitionedSource.replay``). What a complete checkpoint covers is removed.

The log lives beside the checkpoints (``<checkpoint>/inputs/``), one small
object per append, named by the SNs it covers: the same on a local disk and
on an object store, where nothing can be appended to. An entry is the
partitions of inputs ``first..last`` in order, run-length encoded, with the
checksum of its content: a damaged or missing entry ends what the log can
replay (``read_checked`` says which file and why), and the job decides
whether what it committed needs more.

``InputLogWriter`` writes off the ingress's thread, one append at a time:
the ingress takes what comes while one is written, and sends once it is done.
"""
from __future__ import annotations

import json
import logging
from typing import Any, List, Optional, Sequence, Tuple

from flux.runtime.checkpoint_store import CheckpointStore
from flux.connectors.atomic_put import put_atomically
from flux.checksums import Damaged, digest
from flux.runtime.ranged_objects import ranged_objects, ranged_path
from flux.runtime.retrying_writer import RetryingWriter

log = logging.getLogger(__name__)

FOLDER = "inputs"


class InputLog:
    def __init__(self, store: CheckpointStore):
        self.store = store
        self.fs = store.fs
        self.dir = f"{store.root.rstrip('/')}/{FOLDER}"
        self.fs.makedirs(self.dir, exist_ok=True)

    def append(self, first: int, partitions: Sequence[Any]) -> int:
        """Inputs ``first``, ``first + 1``, ... came from ``partitions``; durable when this
        returns. Returns the last input it covers."""
        last = first + len(partitions) - 1
        runs: List[list] = []
        for p in partitions:
            if runs and runs[-1][0] == p:
                runs[-1][1] += 1
            else:
                runs.append([p, 1])
        body = json.dumps(runs)
        put_atomically(self.fs, self._path(first, last), json.dumps(
            {"runs": runs, "checksum": digest(body.encode())}).encode())
        return last

    def read(self, after: int) -> List[Any]:
        """The partitions of inputs ``after + 1``, ``after + 2``, ... as far as the log goes
        without a gap (entries may overlap: a restart logs again what it replays)."""
        return self.read_checked(after)[0]

    def read_checked(self, after: int) -> Tuple[List[Any], Optional[Damaged]]:
        """``read``, and what ended it early: the damaged entry (or a missing one, named by
        the inputs it should cover) that left a gap, else None."""
        order: List[Any] = []
        damaged: Optional[Damaged] = None
        for first, last in self._entries():
            if last <= after + len(order):
                continue
            if first > after + len(order) + 1:
                gap = after + len(order) + 1
                log.warning("the input log has a gap after input %d (next entry starts at %d)",
                            gap - 1, first)
                return order, damaged or Damaged(f"{self.dir}/{gap:012d}-*.json",
                                                 f"no entry covers input {gap}")
            try:
                runs = self._runs(first, last)
            except Damaged as exc:  # an overlapping entry may still cover it
                log.error("an input log entry is damaged: %s", exc)
                damaged = damaged or exc
                continue
            parts = [p for p, n in runs for _ in range(n)]
            order.extend(parts[after + len(order) + 1 - first:])
        return order, None

    def drop_after(self, n: int) -> None:
        """Remove every entry that starts after input ``n``: past a gap the log cannot
        replay, and a restart logs those inputs anew, in their new order."""
        for first, last in self._entries():
            if first > n:
                self.fs.rm(self._path(first, last))

    def _runs(self, first: int, last: int) -> list:
        path = self._path(first, last)
        try:
            data = self.fs.cat_file(path)
            entry = json.loads(data)
        except FileNotFoundError:
            raise Damaged(path, "the file is missing") from None
        except (UnicodeDecodeError, ValueError) as exc:
            raise Damaged(path, f"not an input log entry: {exc}") from None
        if isinstance(entry, dict):  # with its checksum (a list: an entry from before them)
            runs = entry.get("runs")
            if digest(json.dumps(runs).encode()) != entry.get("checksum"):
                raise Damaged(path, "its checksum does not match its content")
        else:
            runs = entry
        try:
            whole = sum(n for _, n in runs) == last - first + 1
        except (TypeError, ValueError):
            whole = False
        if not whole:
            raise Damaged(path, f"it does not hold the partitions of inputs {first}-{last}")
        return runs

    def truncate(self, upto: int) -> None:
        """Remove what only covers inputs up to ``upto`` (a complete checkpoint has them)."""
        for first, last in self._entries():
            if last <= upto:
                self.fs.rm(self._path(first, last))

    def _entries(self) -> List[tuple]:
        return ranged_objects(self.fs, self.dir)

    def _path(self, first: int, last: int) -> str:
        return ranged_path(self.dir, first, last)


class InputLogWriter(RetryingWriter):
    """One append at a time, off the ingress's thread; ``done()`` says how far the log
    is durable. A write that fails is retried (inputs wait meanwhile: none may leave
    unlogged), and the failure is kept in ``errors``."""

    def __init__(self, input_log: InputLog, retry_after: float = 0.5):
        self.log = input_log
        self.busy = False
        super().__init__("flux-input-log", retry_after)

    def submit(self, first: int, partitions: Sequence[Any]) -> None:
        if self.busy:
            raise RuntimeError("an append of the input log is under way")
        self.busy = True
        self._submit((first, list(partitions)))

    def done(self) -> Optional[int]:
        """The last input the log covers once the append under way is durable, else None."""
        results = self._results()
        if not results:
            return None
        self.busy = False
        return results[-1]

    def _write(self, task) -> int:
        return self.log.append(*task)

    def _waiting(self, task) -> str:
        first, partitions = task
        return f"inputs {first}-{first + len(partitions) - 1}"
