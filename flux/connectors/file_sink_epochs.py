"""The writers of one ``FileSink`` folder, fenced by epochs (DESIGN 10, docs/design/parallel_io.md).

A writer started again while the one before it still runs (a node declared dead that has
not heard so yet: a zombie) must not commit once its successor opened the folder: the
protocol's writers rely on the sink's open fencing the old writer (the simulator's
model). A folder gives no compare-and-swap, so each opening writer takes an *epoch*,
one above every epoch the folder has seen, and fences the others by files alone:

- the opener writes its fence ``_flux_epochs/fence-<epoch>-<token>`` first, then reads
  the newest manifest, then writes its own ``manifest-<epoch>.json``; readers trust the
  manifest of the highest epoch;
- a writer commits by writing its part (a name of its epoch: no two writers collide) and
  its own epoch's manifest, and only then looks for a fence above its own: if there is
  one, the commit raises ``SinkFenced`` and is never acknowledged.

If the old writer's manifest came before the opener's read, the opener carries its
commit on; if after, its look for fences came after the opener's fence and it raises.
Either way nothing it acknowledged is lost, and its own manifest is below the opener's.
Two openers that claim one epoch at once fence each other (both commits raise): an error,
never an output lost or written twice.
A folder written before epochs has its manifest at the root (``_flux_sink.json``, epoch 0).
"""
from __future__ import annotations

import secrets
from typing import Dict, List, Optional, Tuple

from flux.connectors.atomic_put import put_atomically
from flux.checksums import Damaged, seal, unseal
from flux.errors import DamagedFile

#: the folder's manifest before epochs, and the folder of the epochs' files
MANIFEST = "_flux_sink.json"
EPOCHS = "_flux_epochs"
#: a manifest deleted between a listing and its read (an opener forgets old epochs)
READ_TRIES = 5


class Epochs:
    """The epochs' files of the sink folder ``root`` on ``fs``."""

    def __init__(self, fs, root: str):
        self.fs, self.root = fs, root.rstrip("/")
        self.folder = f"{self.root}/{EPOCHS}"

    def _listing(self) -> Tuple[Dict[int, str], List[Tuple[int, str]]]:
        """Manifests by epoch, and fences as (epoch, token)."""
        if not self.fs.exists(self.folder):
            return {}, []
        manifests, fences = {}, []
        for entry in self.fs.ls(self.folder, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            kind, _, rest = name.partition("-")
            if kind == "manifest" and rest.endswith(".json") and rest[:-5].isdigit():
                manifests[int(rest[:-5])] = entry
            elif kind == "fence" and rest[:8].isdigit():
                fences.append((int(rest[:8]), rest[9:]))
        return manifests, fences

    def newest(self) -> Optional[dict]:
        """The manifest of the highest epoch, verified (``DamagedFile``: guessing what was
        committed would lose or repeat outputs); None when nothing was committed."""
        for _ in range(READ_TRIES):
            manifests, _ = self._listing()
            if not manifests:
                return _read(self.fs, f"{self.root}/{MANIFEST}")
            try:
                return _read(self.fs, manifests[max(manifests)])
            except FileNotFoundError:
                continue  # forgotten by an opener meanwhile: a newer one is listed now
        raise DamagedFile(self.folder, "the sink's manifests keep vanishing while read")

    def claim(self) -> Tuple[int, str]:
        """A new epoch, one above every epoch seen, fenced before anything is read."""
        manifests, fences = self._listing()
        epoch = 1 + max([*manifests, *(e for e, _ in fences), 0])
        token = secrets.token_hex(6)
        self.fs.makedirs(self.folder, exist_ok=True)
        self.fs.pipe_file(f"{self.folder}/fence-{epoch:08d}-{token}", b"")
        return epoch, token

    def fenced(self, epoch: int, token: str) -> bool:
        """Has another writer claimed an epoch at or above ``epoch`` since?"""
        _, fences = self._listing()
        return any(e > epoch or (e == epoch and t != token) for e, t in fences)

    def write(self, epoch: int, manifest: dict) -> None:
        """``epoch``'s manifest, replaced atomically (a rename on a local file system,
        one object put on object stores)."""
        put_atomically(self.fs, f"{self.folder}/manifest-{epoch:08d}.json", seal(manifest))

    def forget_before(self, epoch: int) -> None:
        """The files of epochs more than one below ``epoch``: a reader trusts the highest."""
        manifests, fences = self._listing()
        old = [path for e, path in manifests.items() if e < epoch - 1]
        old += [f"{self.folder}/fence-{e:08d}-{t}" for e, t in fences if e < epoch - 1]
        for path in old:
            try:
                self.fs.rm(path)
            except FileNotFoundError:
                pass  # another opener forgot it first


def _read(fs, path: str) -> Optional[dict]:
    if path.endswith(MANIFEST) and not fs.exists(path):
        return None
    try:
        return unseal(fs.cat_file(path), path)
    except Damaged as exc:
        raise DamagedFile(exc.path, f"the sink's manifest: {exc.why}") from None


def part_epoch(name: str) -> int:
    """The epoch of the writer that made part file ``name`` (``part-<epoch>-<n>.<ext>``,
    maybe hidden as ``.part-...tmp``); 0 for a part from before epochs (``part-<n>``)."""
    fields = name.lstrip(".").split(".")[0].split("-")
    return int(fields[1]) if len(fields) == 3 and fields[1].isdigit() else 0
