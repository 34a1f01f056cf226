"""The durable epoch log of one split of a ``flux.SplitSource``, beside the checkpoints
(docs/design/parallel_io.md, checkpoints with pairs, step 4).

A replica of a pair of ingresses writes the entries of its pair's log it has due
(``PairedIngress.unwritten``: what a follower heard, what a replica alone decided) here
before what they number leaves (``journal_written``); a restart reads the entries back
and has both replicas of the pair follow those past the restored cut
(``resume_from_log``). One small object per write, named by the places it covers
(``<checkpoint>/splits/<split>/<first>-<last>.json``, ``flux.runtime.ranged_objects``),
as the driver's input log.

Two writers may write the same places: a leader whose follower died writes the entries
that follower had not acked, which it may have written. They write the same entries,
so the reader takes each place once and names a place written twice otherwise (or a
damaged or missing object) as what ends what the log can replay.

Not yet used by the runtime: a split source refuses ``checkpoint=`` until the nodes
write these logs and the coordinator cuts at epochs' ends.
"""
from __future__ import annotations

import json
import logging
from typing import List, Optional, Sequence, Tuple

from flux.checksums import Damaged, digest
from flux.runtime.ranged_objects import ranged_objects, ranged_path

log = logging.getLogger(__name__)

FOLDER = "splits"


class SplitLog:
    """Split ``split``'s log under the checkpoint location ``root`` of filesystem ``fs``
    (an fsspec filesystem)."""

    def __init__(self, fs, root: str, split: int):
        self.fs = fs
        self.dir = f"{root.rstrip('/')}/{FOLDER}/{split}"
        self.fs.makedirs(self.dir, exist_ok=True)

    def write(self, entries: Sequence[Tuple[int, Sequence]]) -> int:
        """Write ``entries`` ((place, entry) each, places consecutive); durable when this
        returns. Returns the last place written."""
        first, last = entries[0][0], entries[-1][0]
        if [n for n, _ in entries] != list(range(first, last + 1)):
            raise ValueError(f"split log places not consecutive: {[n for n, _ in entries]}")
        body = [list(entry) for _, entry in entries]
        self.fs.pipe_file(self._path(first, last), json.dumps(
            {"entries": body, "checksum": digest(json.dumps(body).encode())}).encode())
        return last

    def read(self) -> Tuple[List[tuple], Optional[Damaged]]:
        """The entries from place 1 on, as far as the log goes without a gap, and what
        ended it early (a damaged or missing object, two writers that disagree), else
        None."""
        entries: List[tuple] = []
        damaged: Optional[Tuple[int, Damaged]] = None  # (its last place, why)
        for first, last in self._objects():
            if last <= len(entries):
                continue
            if first > len(entries) + 1:
                return entries, self._lost(entries, damaged) or Damaged(
                    f"{self.dir}/{len(entries) + 1:012d}-*.json",
                    f"no object holds place {len(entries) + 1}")
            try:
                body = self._body(first, last)
            except Damaged as exc:  # an overlapping object may still hold those places
                log.error("a split log object is damaged: %s", exc)
                damaged = damaged or (last, exc)
                continue
            overlap = len(entries) - first + 1
            if body[:overlap] != entries[first - 1:]:
                return entries, Damaged(self._path(first, last), "it holds other entries "
                                        "than another writer at the same places")
            entries.extend(body[overlap:])
        return entries, self._lost(entries, damaged)

    @staticmethod
    def _lost(entries: List[tuple], damaged: Optional[Tuple[int, Damaged]]):
        """The damaged object whose places the others do not all hold, if any."""
        return damaged[1] if damaged is not None and damaged[0] > len(entries) else None

    def _body(self, first: int, last: int) -> List[tuple]:
        path = self._path(first, last)
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

    def _objects(self) -> List[Tuple[int, int]]:
        return ranged_objects(self.fs, self.dir)

    def _path(self, first: int, last: int) -> str:
        return ranged_path(self.dir, first, last)


__all__ = ["FOLDER", "SplitLog"]
