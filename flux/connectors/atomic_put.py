"""Whole-or-nothing writes of small files through ``fsspec``.

A process killed in the middle of a write leaves a torn file on a local disk, and a
reader then cannot tell it from one damaged later (both fail their checksum): a
checkpoint's manifest, a sink's manifest or a log's object would look corrupt though
its write never returned, so nothing could have trusted it. On a local file system the
data goes to a temporary name of its own (two processes may write the same file) and is
renamed into place, which is atomic; an object store's single put is whole already.
"""
from __future__ import annotations

import os
import uuid


def put_atomically(fs, path: str, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all."""
    if "file" not in fs.protocol:
        fs.pipe_file(path, data)
        return
    folder, name = os.path.split(path)
    tmp = f"{folder}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
    fs.pipe_file(tmp, data)
    try:
        fs.mv(tmp, path)
    except BaseException:
        fs.rm(tmp)
        raise
