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
from typing import Any, Callable, Optional

from flux.connectors.folder_files import END_OF_FILE, FolderFiles, FolderSource

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".json")


class FileSource(FolderSource):
    """Records from the JSON-lines files of ``path``, in file-name order.

    ``follow``: at the end of the files, wait for more (``NOT_YET``, looking again
    every ``poll_interval`` seconds) instead of ending."""

    replay_order = "position"  # files in name order, read again alike

    def __init__(self, path: str, follow: bool = False, poll_interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic):
        self.files = FolderFiles(path, SUFFIXES, follow, poll_interval, clock)
        self.fs, self.path, self.follow = self.files.fs, path, follow
        self._file: Optional[str] = None  # name (not path) of the file being read
        self._offset = 0  # byte offset after the last record returned
        self._handle = None
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
        self.files.check(name, position)
        self._close()
        self._file, self._offset = name, offset

    # -- one file ---------------------------------------------------------------------
    def _next_in_file(self) -> Any:
        line = self._line()
        if line is None:
            return END_OF_FILE
        self.records += 1
        try:
            return json.loads(line)
        except ValueError as exc:
            raise ValueError(f"FileSource: {self._file!r} at byte "
                             f"{self._offset - len(line)} is not JSON: {exc}") from None

    def _begin(self, name: str) -> None:
        self._file, self._offset = name, 0

    # -- reading ------------------------------------------------------------------------
    def _line(self) -> Optional[bytes]:
        """The next whole line of the current file (skipping blank ones), or None."""
        if self._file is None:
            return None
        if self._handle is None:
            self._handle = self.fs.open(self.files.full(self._file), "rb")
            self._handle.seek(self._offset)
        while True:
            line = self._handle.readline()
            if not line:
                return None
            if not line.endswith(b"\n") and self.follow and \
                    self.files.following(self._file) is None:
                self._handle.seek(self._offset)  # maybe still being written: later
                return None
            self._offset += len(line)
            if line.strip():
                return line

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
