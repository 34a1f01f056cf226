"""The files of a folder, read in name order, new ones picked up as they appear: what the
file sources share (``FileSource``, ``ParquetSource``).

Files are expected to be placed whole (written elsewhere, then moved in), as for
Spark's file source. The folder is a local path or any ``fsspec`` URL.
"""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Tuple

import fsspec

from flux.connectors.sources import NOT_YET

#: what ``FolderSource._next_in_file`` returns at the end of the current file
END_OF_FILE = object()


class FolderFiles:
    """The names of a folder's files ending in one of ``suffixes``, in name order, looked
    at again at most every ``poll_interval`` seconds when following it."""

    def __init__(self, path: str, suffixes: Tuple[str, ...], follow: bool,
                 poll_interval: float, clock: Callable[[], float] = time.monotonic,
                 owner: str = "FileSource"):
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        self.fs, self.root = fsspec.core.url_to_fs(path)
        if not self.fs.isdir(self.root):
            raise FileNotFoundError(f"{owner}: no folder {path!r}")
        self.path, self.suffixes, self.owner = path, suffixes, owner
        self.follow, self.poll_interval, self.clock = follow, poll_interval, clock
        self._listed_at = float("-inf")
        self._names: List[str] = []

    def following(self, current: Optional[str]) -> Optional[str]:
        """The name of the file after ``current`` (None: the first), looking at the folder
        again when the last look is ``poll_interval`` old."""
        now = self.clock()
        names = self._names
        if not names or names[-1] == current or current is None:
            if now - self._listed_at >= self.poll_interval or not self.follow:
                names = self._names = self._list()
                self._listed_at = now
        for name in names:
            if current is None or name > current:
                return name
        return None

    def full(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def check(self, name: Optional[str], position: object) -> None:
        """A restart's file must still be there."""
        if name is not None and not self.fs.exists(self.full(name)):
            raise FileNotFoundError(f"{self.owner}: {self.path!r} no longer has {name!r}, "
                                    f"where the checkpoint's position {position!r} is")

    def _list(self) -> List[str]:
        names = []
        for entry in self.fs.ls(self.root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name.endswith(self.suffixes) and not name.startswith((".", "_")):
                names.append(name)
        return sorted(names)


class FolderSource:
    """A source over a folder's files (a base): the current file's items, then the next
    file's, and at the end ``NOT_YET`` when following the folder, else the end.
    A subclass reads one file (``_next_in_file``, ``_begin``, ``_close``)."""

    files: FolderFiles
    follow: bool
    _file: Optional[str]

    def __iter__(self) -> "FolderSource":
        return self

    def __next__(self) -> Any:
        while True:
            item = self._next_in_file()
            if item is not END_OF_FILE:
                return item
            following = self.files.following(self._file)
            if following is not None:  # this file is done: on to the next one
                self._close()
                self._begin(following)
                continue
            if self.follow:
                return NOT_YET
            raise StopIteration

    def close(self) -> None:
        self._close()

    def _next_in_file(self) -> Any:
        """The current file's next item, or ``END_OF_FILE`` (also when there is none)."""
        raise NotImplementedError

    def _begin(self, name: str) -> None:
        """Read ``name`` from its start next."""
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError
