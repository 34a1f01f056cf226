"""A replayable source over a folder of JSON-lines files (DESIGN 10).

What Structured Streaming users know as the file source: every file in the
folder whose name ends in ``.jsonl`` or ``.json`` (one JSON value per line),
read in name order, new files picked up as they appear. Files are expected to
be placed whole (written elsewhere, then moved in), as for Spark's file
source; a last line without its newline is read only once a later file exists
or the source does not follow the folder.

Its position is ``[file name, byte offset]`` after the record it returned
last: ``open(position)`` goes on from exactly there after a restart. The
folder is a local path or any ``fsspec`` URL.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, List, Optional

import fsspec

from flux.connectors.sources import NOT_YET

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".json")


class FileSource:
    """Records from the JSON-lines files of ``path``, in file-name order.

    ``follow``: at the end of the files, wait for more (``NOT_YET``, looking again
    every ``poll_interval`` seconds) instead of ending."""

    replay_order = "position"  # files in name order, read again alike

    def __init__(self, path: str, follow: bool = False, poll_interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic):
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        self.fs, self.root = fsspec.core.url_to_fs(path)
        if not self.fs.isdir(self.root):
            raise FileNotFoundError(f"FileSource: no folder {path!r}")
        self.path = path
        self.follow = follow
        self.poll_interval = poll_interval
        self.clock = clock
        self._file: Optional[str] = None  # name (not path) of the file being read
        self._offset = 0  # byte offset after the last record returned
        self._handle = None
        self._listed_at = float("-inf")
        self._names: List[str] = []
        self.records = 0

    # -- the Source protocol --------------------------------------------------------------
    @property
    def position(self) -> list:
        return [self._file, self._offset]

    def open(self, position: Any) -> None:
        """Go on after ``position`` (``[file name, offset]``; ``[None, 0]``: the start)."""
        name, offset = position
        if name is not None and not isinstance(name, str) or not isinstance(offset, int):
            raise ValueError(f"FileSource: not a position: {position!r}")
        if name is not None and not self.fs.exists(self._full(name)):
            raise FileNotFoundError(f"FileSource: {self.path!r} no longer has {name!r}, "
                                    f"where the checkpoint's position is")
        self._close()
        self._file, self._offset = name, offset

    def __iter__(self) -> "FileSource":
        return self

    def __next__(self) -> Any:
        while True:
            line = self._line()
            if line is not None:
                self.records += 1
                try:
                    return json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"FileSource: {self._file!r} at byte "
                                     f"{self._offset - len(line)} is not JSON: {exc}") from None
            following = self._following()
            if following is not None:  # this file is done: on to the next one
                self._close()
                self._file, self._offset = following, 0
                continue
            if self.follow:
                return NOT_YET
            raise StopIteration

    def close(self) -> None:
        self._close()

    # -- reading ------------------------------------------------------------------------
    def _line(self) -> Optional[bytes]:
        """The next whole line of the current file (skipping blank ones), or None."""
        if self._file is None:
            return None
        if self._handle is None:
            self._handle = self.fs.open(self._full(self._file), "rb")
            self._handle.seek(self._offset)
        while True:
            line = self._handle.readline()
            if not line:
                return None
            if not line.endswith(b"\n") and self.follow and self._following() is None:
                self._handle.seek(self._offset)  # maybe still being written: later
                return None
            self._offset += len(line)
            if line.strip():
                return line

    def _following(self) -> Optional[str]:
        """The name of the file after the current one, looking at the folder again when
        the last look is ``poll_interval`` old."""
        now = self.clock()
        names = self._names
        if not names or names[-1] == self._file or self._file is None:
            if now - self._listed_at >= self.poll_interval or not self.follow:
                names = self._names = self._list()
                self._listed_at = now
        for name in names:
            if self._file is None or name > self._file:
                return name
        return None

    def _list(self) -> List[str]:
        names = []
        for entry in self.fs.ls(self.root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name.endswith(SUFFIXES) and not name.startswith((".", "_")):
                names.append(name)
        return sorted(names)

    def _full(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
