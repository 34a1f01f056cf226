"""The durable epoch log of one split of a ``flux.SplitSource``, beside the checkpoints
(docs/design/parallel_io.md, checkpoints with pairs, step 4).

A replica of a pair of ingresses writes the entries of its pair's log it has due
(``PairedIngress.unwritten``: what a follower heard, what a replica alone decided) here
before what they number leaves (``journal_written``); a restart reads the entries back
and has both replicas of the pair follow those past the restored cut
(``resume_from_log``). One small object per write, named by the places it covers
(``<first>-<last>.json``, ``flux.runtime.ranged_objects``), as the driver's input log.

Two writers may write the same places: a leader whose follower died writes the entries
that follower had not acked, which it may have written. They write the same entries,
so the reader takes each place once and names a place written twice otherwise (or a
damaged or missing object) as what ends what the log can replay.

**Attempts.** Each run of the job (the first, and every restart) writes a folder of its
own, ``<split>/<attempt>-<start>``: its places follow ``start``, the places the log held
when it began. A node of an earlier run that has not stopped yet (a zombie: Spark ends
the executors some time after their driver) may still write its own decisions past
``start``; the reader takes an attempt's places only up to the next attempt's start, so
those are never read.

**Truncation.** The places before the first epoch a restart from the oldest kept
checkpoint follows are never read again: they are deleted as checkpoints complete.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import fsspec

from flux.checksums import Damaged, digest, seal, unseal
from flux.connectors.atomic_put import put_atomically
from flux.errors import CheckpointCorrupt
from flux.protocol.ingress_journal import entries_past
from flux.protocol.ingress_twin_log import EPOCH
from flux.sequence import epoch_ended_by
from flux.runtime.ranged_objects import ranged_objects, ranged_path

log = logging.getLogger(__name__)

FOLDER = "splits"


@dataclass
class LogRead:
    """What a split's log holds: its entries from place ``first`` on, as far as the log
    goes without a gap, and what ended it early (a damaged or missing object, two
    writers that disagree), else None."""

    first: int = 1
    entries: List[tuple] = field(default_factory=list)
    damaged: Optional[Damaged] = None

    @property
    def last(self) -> int:
        """The last place read (the file's index)."""
        return self.first + len(self.entries) - 1


class SplitLog:
    """Split ``split``'s log under the checkpoint location ``root`` of filesystem ``fs``
    (an fsspec filesystem); written as attempt ``attempt``, which began when the log held
    ``start`` places."""

    def __init__(self, fs, root: str, split: int, attempt: int = 0, start: int = 0):
        self.fs = fs
        self.base = f"{root.rstrip('/')}/{FOLDER}/{split}"
        self.attempt, self.start = attempt, start
        self.dir = f"{self.base}/{attempt:06d}-{start:012d}"
        self._made = False

    # -- writing -----------------------------------------------------------------
    def write(self, entries: Sequence[Tuple[int, Sequence]]) -> int:
        """Write ``entries`` ((place, entry) each, places consecutive, past this attempt's
        start); durable when this returns. Returns the last place written."""
        first, last = entries[0][0], entries[-1][0]
        if [n for n, _ in entries] != list(range(first, last + 1)) or first <= self.start:
            raise ValueError(f"split log places not consecutive or not past {self.start}: "
                             f"{[n for n, _ in entries]}")
        body = [list(entry) for _, entry in entries]
        if not self._made:
            self.fs.makedirs(self.dir, exist_ok=True)
            self._made = True
        put_atomically(self.fs, ranged_path(self.dir, first, last), json.dumps(
            {"entries": body, "checksum": digest(json.dumps(body).encode())}).encode())
        return last

    # -- reading -------------------------------------------------------------------
    def attempts(self) -> List[Tuple[int, int]]:
        """The attempts that wrote this log, in order: (attempt, start)."""
        found = []
        if not self.fs.exists(self.base):
            return found
        for entry in self.fs.ls(self.base, detail=False):
            attempt, _, start = entry.rstrip("/").rsplit("/", 1)[-1].partition("-")
            if attempt.isdigit() and start.isdigit():
                found.append((int(attempt), int(start)))
        return sorted(found)

    def _objects(self) -> List[Tuple[str, int, int, int]]:
        """Every object a reader takes places from, in place order: (folder, first, its
        last, the last place read of it); an attempt's only up to the next attempt's
        start."""
        attempts = self.attempts()
        out = []
        for k, (attempt, start) in enumerate(attempts):
            limit = attempts[k + 1][1] if k + 1 < len(attempts) else None
            for first, last in ranged_objects(self.fs, self._folder(attempt, start)):
                if limit is None or first <= limit:
                    out.append((self._folder(attempt, start), first, last,
                                last if limit is None else min(last, limit)))
        return sorted(out, key=lambda o: (o[1], o[3]))

    def _folder(self, attempt: int, start: int) -> str:
        return f"{self.base}/{attempt:06d}-{start:012d}"

    def read(self) -> LogRead:
        """The entries from the first place kept on (``LogRead``)."""
        objects = self._objects()
        got = LogRead(first=objects[0][1] if objects else self.start + 1)
        damaged: Optional[Tuple[int, Damaged]] = None  # (its last place, why)
        for folder, first, stored, last in objects:
            if last <= got.last:
                continue
            if first > got.last + 1:
                got.damaged = self._lost(got, damaged) or Damaged(
                    f"{self.base}/*/{got.last + 1:012d}-*.json",
                    f"no object holds place {got.last + 1}")
                return got
            try:
                body = self._body(folder, first, stored)[:last - first + 1]
            except Damaged as exc:  # an overlapping object may still hold those places
                log.error("a split log object is damaged: %s", exc)
                damaged = damaged or (last, exc)
                continue
            overlap = got.last - first + 1
            if body[:overlap] != got.entries[first - got.first:]:
                got.damaged = Damaged(ranged_path(folder, first, stored), "it holds other "
                                      "entries than another writer at the same places")
                return got
            got.entries.extend(body[overlap:])
        got.damaged = self._lost(got, damaged)
        return got

    @staticmethod
    def _lost(got: LogRead, damaged: Optional[Tuple[int, Damaged]]):
        """The damaged object whose places the others do not all hold, if any."""
        return damaged[1] if damaged is not None and damaged[0] > got.last else None

    def _body(self, folder: str, first: int, last: int) -> List[tuple]:
        path = ranged_path(folder, first, last)
        try:
            obj = json.loads(self.fs.cat_file(path))
        except FileNotFoundError:
            raise Damaged(path, "the file is missing") from None
        except (UnicodeDecodeError, ValueError) as exc:
            raise Damaged(path, f"not a split log object: {exc}") from None
        body = obj.get("entries") if isinstance(obj, dict) else None
        if not isinstance(body, list) or digest(json.dumps(body).encode()) != obj.get(
                "checksum"):
            raise Damaged(path, "its checksum does not match its content")
        if len(body) != last - first + 1:
            raise Damaged(path, f"it does not hold places {first}-{last}")
        return [tuple(entry) for entry in body]

    # -- truncation ----------------------------------------------------------------
    def truncate(self, ended: int) -> int:
        """Delete the objects wholly before the first start of an epoch after ``ended``
        (the epoch the oldest kept checkpoint's cut ends: no restart reads them), and the
        folders of earlier attempts left with none; returns how many objects went. Reads
        the log only as far as that start."""
        keep_from = None
        objects = self._objects()
        for folder, first, stored, last in objects:
            try:
                body = self._body(folder, first, stored)[:last - first + 1]
            except Damaged:
                return 0  # what lies past it a restart may need: keep it all
            at = next((first + n for n, e in enumerate(body) if e[0] == EPOCH
                       and e[1] > ended), None)
            if at is not None:
                keep_from = at
                break
        if keep_from is None:
            return 0
        gone = [o for o in objects if o[3] < keep_from]
        for folder, first, stored, _ in gone:
            self.fs.rm_file(ranged_path(folder, first, stored))
        kept = {o[0] for o in objects if o[3] >= keep_from}
        for attempt, start in self.attempts()[:-1]:  # earlier attempts with nothing kept,
            folder = self._folder(attempt, start)   # the oldest first (a later one's start
            if folder in kept:                       # limits what is read of an earlier)
                break
            self.fs.rm(folder, recursive=True)
        return len(gone)


class SplitLogs:
    """Every split's log, as the driver reads it for a restart and truncates it as
    checkpoints complete: ``splits`` splits numbered in epochs by ``ingresses`` ingresses
    (the same: each split has its pair), under checkpoint location ``url``."""

    def __init__(self, url: str, splits: int):
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.url, self.splits = url, splits

    def log(self, split: int) -> SplitLog:
        return SplitLog(self.fs, self.root, split)

    def origin(self, current: Any) -> Any:
        """Where the splits begin, as the first run at this location recorded it (the
        counts in the logs and the checkpoints are from there); ``current`` is recorded
        when none was. A damaged record: ``CheckpointCorrupt``."""
        path = f"{self.root.rstrip('/')}/{FOLDER}/origin.json"
        if not self.fs.exists(path):
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(path, seal({"origin": current}))
            return current
        try:
            return unseal(self.fs.cat_file(path), path)["origin"]
        except (Damaged, KeyError) as exc:
            raise CheckpointCorrupt(path, f"the splits' origin cannot be read: {exc}") \
                from None

    def next_attempt(self) -> int:
        """The folder number of the next run's writes: past every earlier run's."""
        return 1 + max([-1] + [a for i in range(self.splits)
                               for a, _ in self.log(i).attempts()])

    def replay(self, cut: int, positions: Sequence[int]) -> Dict[int, Tuple[int, list, int]]:
        """What a restart from the checkpoint whose cut is ``cut`` (0: none) has each
        pair follow: split -> (its count at the cut, the entries of its log past the
        cut, the log's last place). A log that ends early on a damaged or missing object
        or on writers that disagree may have numbered inputs whose outputs a sink
        holds: ``CheckpointCorrupt`` names it."""
        out = {}
        for split in range(self.splits):
            got = self.log(split).read()
            if got.damaged is not None:
                raise CheckpointCorrupt(got.damaged.path, f"split {split}'s log: "
                                        f"{got.damaged.why}")
            if not cut and got.first > 1:  # truncated for checkpoints none of which is left
                raise CheckpointCorrupt(f"{self.url}/{FOLDER}/{split}", f"a restart from "
                                        f"the first input needs its log from place 1, it "
                                        f"keeps places from {got.first} on")
            out[split] = (positions[split] if cut else 0,
                          entries_past(got.entries, cut, self.splits), got.last)
        return out

    def last_epoch(self, entries_by_split: Dict[int, Tuple[int, list, int]]) -> int:
        """The last epoch any split's log starts (-1: none)."""
        return max([-1] + [e[1] for _, entries, _ in entries_by_split.values()
                           for e in entries if e[0] == EPOCH])

    def truncate(self, cut: int) -> None:
        """The oldest checkpoint kept has cut ``cut``: what no restart reads goes."""
        ended = epoch_ended_by(cut, self.splits)
        for split in range(self.splits):
            try:
                self.log(split).truncate(ended)
            except Exception as exc:  # kept for now; the next checkpoint tries again
                log.warning("split %d's log could not be truncated: %s", split, exc)


__all__ = ["FOLDER", "LogRead", "SplitLog", "SplitLogs"]
