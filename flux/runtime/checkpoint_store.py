"""Where checkpoints live: a local folder or any ``fsspec`` URL (DESIGN 10).

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

Every file is verified before it is trusted (disks and object stores damage
files: truncated, zeroed, a bit flipped, gone). Each snapshot's checksum is
recorded in the manifest beside its name (``digests``) when the checkpoint
completes, and the manifest carries a checksum of itself. ``restorable``
picks the newest complete checkpoint whose manifest and files all verify,
setting aside (``MANIFEST.json.damaged``) and logging each one that does not,
so a restart falls back to an older checkpoint instead of restoring a wrong
state; with none left it raises ``CheckpointCorrupt`` naming the file. A
manifest written before checksums (no ``checksum``) is read as it is.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import fsspec

from flux.errors import CheckpointCorrupt, CheckpointMismatch
from flux.connectors.atomic_put import put_atomically
from flux.checksums import Damaged, digest, seal, unseal

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
#: a manifest whose checkpoint did not verify, set aside: no longer complete, kept to look at
DAMAGED = MANIFEST + ".damaged"
PREFIX = "ckpt-"
#: the checkpoint no restart may go back before, and why (``raise_floor``)
FLOOR = "FLOOR.json"


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
        data = seal({**manifest, "checkpoint": checkpoint})
        self.fs.makedirs(self._dir(checkpoint), exist_ok=True)
        put_atomically(self.fs, self._path(checkpoint, MANIFEST), data)
        return self.prune(protect)

    def prune(self, protect: Iterable[int] = ()) -> List[int]:
        """Remove every checkpoint older than the last ``keep`` complete ones (and any
        incomplete one older than those), but for the folders their chains read and the
        ones in ``protect`` (what snapshots being written build on); returns the last
        ``keep`` complete checkpoints. A kept one whose manifest is damaged could never be
        restored: it is set aside, and an older one is kept in its place (so a fallback
        has where to go)."""
        while True:
            done = self.complete_ids()
            if len(done) <= self.keep:
                return done
            try:
                manifests = {k: unseal(self.fs.cat_file(self._path(k, MANIFEST)),
                                       self._path(k, MANIFEST)) for k in done[-self.keep:]}
                break
            except Damaged as exc:
                log.error("a kept checkpoint's manifest is damaged: %s", exc)
                self._set_aside(int(exc.path.rsplit(PREFIX, 1)[1].split("/", 1)[0]))
        oldest_kept = done[-self.keep]
        needed = set(protect)
        for k, manifest in manifests.items():
            needed.update(j for j, _ in self._files(k, manifest))
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
        """The manifest of the newest complete checkpoint whose files all verify, or None
        when there is no complete checkpoint (``restorable``)."""
        return self.restorable(fingerprint, partitions)

    def restorable(self, fingerprint: Optional[str] = None,
                   partitions: Optional[int] = None,
                   check: Optional[Callable[[dict], None]] = None) -> Optional[dict]:
        """The manifest of the newest complete checkpoint whose manifest and every file
        verify (``verify``), or None when there is no complete checkpoint. Each newer one
        that does not verify is logged, naming the file and why, and set aside; with none
        left, ``CheckpointCorrupt`` names the newest damaged file. A checkpoint written by
        a job with another dataflow ``fingerprint`` or partition count is refused
        (``CheckpointMismatch``); ``check(manifest)``, when given, decides instead
        (``controller.checkpoint_shape``)."""
        damaged: List[Damaged] = []
        for k in reversed(self.complete_ids()):
            try:
                manifest = self.verify(k)
            except Damaged as exc:
                log.error("checkpoint %d of %s is damaged and will not be restored: %s; "
                          "falling back to the one before", k, self.url, exc)
                damaged.append(exc)
                self._set_aside(k)
                continue
            if check is not None:
                check({**manifest, "checkpoint": k})
            else:
                self._check_shape(k, manifest, fingerprint, partitions)
            if damaged:
                log.warning("restoring checkpoint %d of %s: the %d newer ones are damaged",
                            k, self.url, len(damaged))
            return manifest
        if damaged:
            raise CheckpointCorrupt(damaged[0].path, damaged[0].why)
        return None

    def verify(self, checkpoint: int) -> dict:
        """Complete checkpoint ``checkpoint``'s manifest, once it and every file its
        partitions read were found whole and unchanged (``Damaged`` otherwise). Reads every
        file: the cost of a restore's reading, once more, on the driver."""
        path = self._path(checkpoint, MANIFEST)
        try:
            manifest = unseal(self.fs.cat_file(path), path)
        except FileNotFoundError:
            raise Damaged(path, "the manifest is missing") from None
        if not isinstance(manifest.get("files", []), list):
            raise Damaged(path, "the manifest's files are not a list")
        digests = manifest.get("digests") or {}
        for k, name in self._files(checkpoint, manifest):
            self.read_verified(k, name, digests.get(f"{k}/{name}"))
        return manifest

    def read_verified(self, checkpoint: int, name: str, want: Optional[str]) -> bytes:
        """A file's bytes, checked against ``want`` (None: a manifest from before
        checksums, not checked); ``Damaged`` if it is missing or does not match."""
        path = self._path(checkpoint, name)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            raise Damaged(path, "the file is missing") from None
        if want is not None and digest(data) != want:
            raise Damaged(path, f"its checksum does not match ({len(data)} bytes)")
        return data

    def _check_shape(self, checkpoint: int, manifest: dict, fingerprint: Optional[str],
                     partitions: Optional[int]) -> None:
        for key, want, what in (("partitions", partitions, "partitions"),
                                ("fingerprint", fingerprint, "a dataflow of fingerprint")):
            if want is not None and manifest.get(key) != want:
                raise CheckpointMismatch(
                    f"the checkpoint at {self.url} (checkpoint {checkpoint}) was written by a "
                    f"job with {what} {manifest.get(key)!r}, this job has {want!r} (stage "
                    f"names, keys, operators and partitions must all be the same): use "
                    f"another checkpoint location, or the dataflow that wrote it")

    def _set_aside(self, checkpoint: int) -> None:
        """A damaged checkpoint is no longer complete (so it is never tried again, nor
        counted among the kept ones); its files stay until pruning, to be looked at."""
        try:
            self.fs.mv(self._path(checkpoint, MANIFEST), self._path(checkpoint, DAMAGED))
        except Exception as exc:  # it is skipped anyway; the next restore tries it again
            log.warning("could not set damaged checkpoint %d aside: %s", checkpoint, exc)

    def manifest(self, checkpoint: int) -> dict:
        """The manifest of complete checkpoint ``checkpoint`` (its own checksum verified)."""
        path = self._path(checkpoint, MANIFEST)
        try:
            return unseal(self.fs.cat_file(path), path)
        except Damaged as exc:
            raise CheckpointCorrupt(exc.path, exc.why) from None

    def read_part(self, manifest: dict, stage: int, partition: int) -> List[bytes]:
        """The snapshots that rebuild ``stage``'s ``partition`` in a complete checkpoint: a
        whole one, then the deltas up to the checkpoint (flux.snapshot_chain.rebuild),
        each verified against the manifest's checksum (``CheckpointCorrupt`` if one does
        not match). The manifest lists them stage by stage, partition by partition."""
        digests: Dict[str, str] = manifest.get("digests") or {}
        try:
            return [self.read_verified(k, name, digests.get(f"{k}/{name}"))
                    for k, name in self.part_files(manifest, stage, partition)]
        except Damaged as exc:
            raise CheckpointCorrupt(exc.path, exc.why) from None

    def part_files(self, manifest: dict, stage: int, partition: int) -> List[Tuple[int, str]]:
        """``(checkpoint, name)`` of each file that rebuilds ``stage``'s ``partition``."""
        return _chain(manifest, (stage - 1) * manifest["partitions"] + partition)

    def exists(self, checkpoint: int, name: str) -> bool:
        return self.fs.exists(self._path(checkpoint, name))

    def read(self, checkpoint: int, name: str) -> bytes:
        return self.fs.cat_file(self._path(checkpoint, name))

    def path(self, checkpoint: int, name: str) -> str:
        """Where a checkpoint's file lives (for messages)."""
        return self._path(checkpoint, name)

    def _files(self, checkpoint: int, manifest: dict) -> List[Tuple[int, str]]:
        """Every ``(checkpoint, name)`` a manifest's partitions read."""
        manifest = {**manifest, "checkpoint": checkpoint}
        return [f for i in range(len(manifest.get("files", ()))) for f in _chain(manifest, i)]

    # -- paths ----------------------------------------------------------------------------
    # -- the floor ------------------------------------------------------------------------
    def raise_floor(self, checkpoint: int, why: str) -> None:
        """No restart may restore a checkpoint older than ``checkpoint`` (the sinks hold
        outputs past its cut that a replay from before it would write again elsewhere:
        ``why``). Kept in the store, atomically and sealed, so a driver run again after
        it died keeps the rule."""
        put_atomically(self.fs, self._floor_path(), seal({"checkpoint": checkpoint,
                                                          "why": why}))

    def floor(self) -> Optional[Tuple[int, str]]:
        """``(checkpoint, why)`` of ``raise_floor``, or None; ``CheckpointCorrupt`` when
        the file does not verify (which checkpoints are safe to restore is not known)."""
        path = self._floor_path()
        try:
            floor = unseal(self.fs.cat_file(path), path)
        except FileNotFoundError:
            return None
        except Damaged as exc:
            raise CheckpointCorrupt(exc.path, exc.why) from None
        if not isinstance(floor.get("checkpoint"), int):
            raise CheckpointCorrupt(path, "it names no checkpoint")
        return floor["checkpoint"], str(floor.get("why", ""))

    def _floor_path(self) -> str:
        return f"{self.root.rstrip('/')}/{FLOOR}"

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
