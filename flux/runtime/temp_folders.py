"""Temporary folders that go even when the process that made them was killed.

A process removes its own folders on every path it lives through (a ``finally``, a
finalizer, the interpreter's exit); a SIGKILL, or a SIGTERM that Python does not
catch, gives it none. So each folder holds a lock for as long as its maker lives:
``.owner``, locked with ``flock`` and never handed to a child process. The kernel
drops the lock when the maker dies, however it died, and the next ``make`` of the
same prefix removes every folder of that prefix whose lock it can take (a folder
without ``.owner`` is not one of these, or is being made: it is left alone).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from typing import Dict, Optional

OWNER = ".owner"

_held: Dict[str, int] = {}  # folder -> the descriptor of its locked ``.owner``


def make(prefix: str, parent: Optional[str] = None) -> str:
    """A new folder (mode 0700) in ``parent`` (the temporary directory by default),
    held by this process until ``remove``; first, the dead makers' folders go."""
    sweep(prefix, parent)
    folder = tempfile.mkdtemp(prefix=prefix, dir=parent)
    claim = os.path.join(folder, OWNER + ".new")
    fd = os.open(claim, os.O_CREAT | os.O_RDWR, 0o600)  # not inherited (PEP 446)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(claim, os.path.join(folder, OWNER))  # locked before a sweep can see it
    _held[folder] = fd
    return folder


def remove(folder: str) -> None:
    """Remove ``folder`` and all it holds (again is nothing)."""
    fd = _held.pop(folder, None)
    if fd is not None:
        os.close(fd)
    shutil.rmtree(folder, ignore_errors=True)


def sweep(prefix: str, parent: Optional[str] = None) -> list:
    """Remove the folders of ``prefix`` in ``parent`` whose maker is gone; returns them."""
    parent = parent or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return []
    gone = []
    for name in names:
        folder = os.path.join(parent, name)
        if folder in _held:
            continue
        try:
            fd = os.open(os.path.join(folder, OWNER), os.O_RDWR | os.O_NOFOLLOW)
        except OSError:  # not one of ours, not ours to open, or being made
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its maker lives
            os.close(fd)
            continue
        shutil.rmtree(folder, ignore_errors=True)  # under the lock: no one else sweeps it
        os.close(fd)
        gone.append(folder)
    return gone
