"""Where checkpoints live: a local folder or any ``fsspec`` URL (DESIGN 10, issue 14).

Checkpoint ``k`` is a folder ``ckpt-<k>/`` of files written by whoever
contributes to it (each partition's state, the source position), and is
complete only once its manifest ``ckpt-<k>/MANIFEST.json`` exists: the
coordinator writes it last, atomically (a rename on a local disk, one object
put on an object store), so a reader never sees half a checkpoint. The
manifest names the job's dataflow fingerprint and partition count, and a
checkpoint of another dataflow is refused (``CheckpointMismatch``). Older
checkpoints are removed, keeping the last ``keep`` and every folder a kept
manifest's chains reach into (an incremental snapshot is read with the whole
one and the deltas before it, flux.snapshot_chain), and any folder the caller
says a snapshot still being written builds on.
"""
from __future__ import annotations

import json
import logging
from typing import Iterable, List, Optional, Tuple

import fsspec

from flux.errors import CheckpointMismatch

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
PREFIX = "ckpt-"


class CheckpointStore:
    def __init__(self, url: str, keep: int = 3, storage_options: Optional[dict] = None):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 checkpoint, got {keep!r}")
        self.url, self.keep = url, keep
        self.fs, self.root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.fs.makedirs(self.root, exist_ok=True)

    # -- writing --------------------------------------------------------------------------
    def write(self, checkpoint: int, name: str, data: bytes) -> str:
        """One contribution to ``checkpoint`` (a partition's state, say); returns its path."""
        if "/" in name or name == MANIFEST or not name:
            raise ValueError(f"not a checkpoint file name: {name!r}")
        path = self._path(checkpoint, name)
        self.fs.makedirs(self._dir(checkpoint), exist_ok=True)
        self.fs.pipe_file(path, data)
        return path

    def complete(self, checkpoint: int, manifest: dict,
                 protect: Iterable[int] = ()) -> List[int]:
        """Checkpoint ``checkpoint`` is whole: write its manifest last, atomically, then
        remove checkpoints older than the last ``keep`` (``prune``); returns the complete
        checkpoints kept."""
        for k, name in self._files(checkpoint, manifest):
            if not self.exists(k, name):
                raise FileNotFoundError(f"checkpoint {checkpoint}: {name} of checkpoint {k} "
                                        f"is not in the store")
        data = json.dumps({**manifest, "checkpoint": checkpoint}).encode()
        self.fs.makedirs(self._dir(checkpoint), exist_ok=True)
        if "file" in self.fs.protocol:
            tmp = self._path(checkpoint, f".{MANIFEST}.tmp")
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, self._path(checkpoint, MANIFEST))
        else:
            self.fs.pipe_file(self._path(checkpoint, MANIFEST), data)
        return self.prune(protect)

    def prune(self, protect: Iterable[int] = ()) -> List[int]:
        """Remove every checkpoint older than the last ``keep`` complete ones (and any
        incomplete one older than those), but for the folders their chains read and the
        ones in ``protect`` (what snapshots being written build on); returns the last
        ``keep`` complete checkpoints."""
        done = self.complete_ids()
        if len(done) <= self.keep:
            return done
        oldest_kept = done[-self.keep]
        needed = set(protect)
        for k in done[-self.keep:]:
            needed.update(j for j, _ in self._files(k, self.manifest(k)))
        for k in self.ids():
            if k < oldest_kept and k not in needed:
                log.info("removing checkpoint %d of %s", k, self.url)
                self.fs.rm(self._dir(k), recursive=True)
        return done[-self.keep:]

    # -- reading --------------------------------------------------------------------------
    def complete_ids(self) -> List[int]:
        return [k for k in self.ids() if self.fs.exists(self._path(k, MANIFEST))]

    def latest(self, fingerprint: Optional[str] = None,
               partitions: Optional[int] = None) -> Optional[dict]:
        """The manifest of the last complete checkpoint, or None; refused if it was written
        by a job with another dataflow ``fingerprint`` or partition count."""
        done = self.complete_ids()
        if not done:
            return None
        manifest = json.loads(self.fs.cat_file(self._path(done[-1], MANIFEST)))
        for key, want, what in (("partitions", partitions, "partitions"),
                                ("fingerprint", fingerprint, "a dataflow of fingerprint")):
            if want is not None and manifest.get(key) != want:
                raise CheckpointMismatch(
                    f"the checkpoint at {self.url} (checkpoint {done[-1]}) was written by a "
                    f"job with {what} {manifest.get(key)!r}, this job has {want!r} (stage "
                    f"names, keys, operators and partitions must all be the same): use "
                    f"another checkpoint location, or the dataflow that wrote it")
        return manifest

    def manifest(self, checkpoint: int) -> dict:
        """The manifest of complete checkpoint ``checkpoint``."""
        return json.loads(self.fs.cat_file(self._path(checkpoint, MANIFEST)))

    def read_part(self, manifest: dict, stage: int, partition: int) -> List[bytes]:
        """The snapshots that rebuild ``stage``'s ``partition`` in a complete checkpoint: a
        whole one, then the deltas up to the checkpoint (flux.snapshot_chain.rebuild). The
        manifest lists them stage by stage, partition by partition."""
        index = (stage - 1) * manifest["partitions"] + partition
        return [self.read(k, name) for k, name in _chain(manifest, index)]

    def exists(self, checkpoint: int, name: str) -> bool:
        return self.fs.exists(self._path(checkpoint, name))

    def read(self, checkpoint: int, name: str) -> bytes:
        return self.fs.cat_file(self._path(checkpoint, name))

    def _files(self, checkpoint: int, manifest: dict) -> List[Tuple[int, str]]:
        """Every ``(checkpoint, name)`` a manifest's partitions read."""
        manifest = {**manifest, "checkpoint": checkpoint}
        return [f for i in range(len(manifest.get("files", ()))) for f in _chain(manifest, i)]

    # -- paths ----------------------------------------------------------------------------
    def ids(self) -> List[int]:
        ids = []
        for entry in self.fs.ls(self.root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(PREFIX) and name[len(PREFIX):].isdigit():
                ids.append(int(name[len(PREFIX):]))
        return sorted(ids)

    def _dir(self, checkpoint: int) -> str:
        return f"{self.root.rstrip('/')}/{PREFIX}{checkpoint:010d}"

    def _path(self, checkpoint: int, name: str) -> str:
        return f"{self._dir(checkpoint)}/{name}"


def _chain(manifest: dict, index: int) -> List[Tuple[int, str]]:
    """The files of the manifest's ``index``-th partition (a manifest written before
    incremental checkpoints names one whole file per partition)."""
    chains = manifest.get("chains")
    if chains is None:
        return [(manifest["checkpoint"], manifest["files"][index])]
    return [(k, name) for k, name in chains[index]]
