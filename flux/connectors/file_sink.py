"""An exactly-once sink of part files in a folder (DESIGN 10).

Outputs are written to a part file that stays hidden (``.part-E-N.tmp``) until
``commit(sn)``: the part is renamed into place (``part-E-N.jsonl`` or
``.parquet``, E the writer's epoch) and then the writer's manifest
(``_flux_epochs/manifest-E.json``), naming every committed part and the last
SN, is replaced atomically. The manifest of the highest epoch is the truth: a
reader reads the parts it names (``read_file_sink``), and a sink opened again
takes a new epoch, which fences every earlier writer of the folder (a zombie's
commit raises ``SinkFenced``: ``file_sink_epochs``), deletes every part of an
earlier epoch the manifest does not name (what a crash left between rename and
manifest) and drops every output whose SN is not above the committed one, which
a restart's replay regenerates. A folder written before epochs (its manifest
``_flux_sink.json``) is read and carried on.

Rows are ``{"sn": [...], "record": ...}``: one JSON object per line, or in
Parquet two columns, ``sn`` (list of int64) and ``record`` (its JSON text).
The folder is a local path or any ``fsspec`` URL (the manifest is then one
object put, atomic on object stores). The manifest carries its own checksum
and each part's: a damaged manifest stops the sink from opening, and a
damaged part stops ``read_file_sink`` (``DamagedFile``, naming the file),
never a silent loss or repeat.
"""
from __future__ import annotations

import io
import json
import logging
from typing import Any, Dict, List, Optional, Tuple

import fsspec

from flux.checksums import digest
from flux.connector_api import CommitsBySN, opened_to_read
# MANIFEST: the folder's manifest before epochs, importable from here as ever
from flux.connectors.file_sink_epochs import MANIFEST, Epochs, part_epoch  # noqa: F401
from flux.errors import DamagedFile, SinkFenced

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "parquet")


class FileSink(CommitsBySN):
    """Exactly-once part files under ``path``. Also a plain callable sink (``sink(item)``),
    committing every ``commit_every`` outputs and at ``close``."""

    name = "FileSink"

    def __init__(self, path: str, format: str = "jsonl", commit_every: int = 10_000):
        if format not in FORMATS:
            raise ValueError(f"FileSink: format must be one of {FORMATS}, got {format!r}")
        self.fs, self.root = fsspec.core.url_to_fs(path)
        self.path, self.format = path, format
        self.fs.makedirs(self.root, exist_ok=True)
        self.epochs = Epochs(self.fs, self.root)
        #: opened only to read what was committed: no epoch, nothing fenced or removed
        self.reading = opened_to_read()
        #: this writer's epoch (fenced first, then the manifest read: file_sink_epochs)
        self.epoch, self._token = (0, "") if self.reading else self.epochs.claim()
        manifest = self.epochs.newest()
        if manifest is not None and manifest.get("format") != format:
            raise ValueError(f"FileSink: {path!r} holds {manifest.get('format')} parts, "
                             f"not {format}")
        self.parts: List[str] = list(manifest["parts"]) if manifest else []
        #: each committed part's checksum (parts committed before checksums have none)
        self.digests: Dict[str, str] = dict(manifest.get("digests") or {}) if manifest else {}
        #: parts this writer committed (they are named by its epoch and this count)
        self._made = 0
        super().__init__(tuple(manifest["sn"]) if manifest and manifest["sn"] is not None
                         else None, commit_every)
        if not self.reading:
            self._write_manifest(self._committed)  # readers trust this epoch from now
            self._remove_leftovers()
            self.epochs.forget_before(self.epoch)

    def _commit(self, rows: list, sn: tuple) -> None:
        """The part renamed into place, then this epoch's manifest naming it replaced
        atomically; then, if a newer writer opened the folder meanwhile, ``SinkFenced``
        (file_sink_epochs: the commit does not count)."""
        if self.reading:
            raise RuntimeError(f"FileSink {self.path}: opened only to read, not to commit")
        self._check_fence(sn)
        parts = list(self.parts)
        if rows:
            name = f"part-{self.epoch:08d}-{self._made:08d}.{self.format}"
            tmp = self._full(f".{name}.tmp")
            data = self._encode(rows)
            with self.fs.open(tmp, "wb") as f:
                f.write(data)
            self.fs.mv(tmp, self._full(name))
            parts.append(name)
            self._made += 1
        digests = {**self.digests, **({parts[-1]: digest(data)} if rows else {})}
        self.parts, self.digests = parts, digests
        self._write_manifest(sn)
        self._check_fence(sn)

    def _check_fence(self, sn: tuple) -> None:
        if self.epochs.fenced(self.epoch, self._token):
            raise SinkFenced(f"FileSink {self.path}: a newer writer opened the sink; this "
                             f"one (epoch {self.epoch}) cannot commit up to {sn}")

    # -- files ----------------------------------------------------------------------------
    def _encode(self, rows) -> bytes:
        if self.format == "jsonl":
            return "".join(json.dumps({"sn": list(sn), "record": rec}) + "\n"
                           for sn, rec in rows).encode()
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({"sn": pa.array([list(sn) for sn, _ in rows], pa.list_(pa.int64())),
                          "record": pa.array([json.dumps(rec) for _, rec in rows], pa.string())})
        out = io.BytesIO()
        pq.write_table(table, out)
        return out.getvalue()

    def _write_manifest(self, sn: Optional[tuple]) -> None:
        self.epochs.write(self.epoch, {"format": self.format, "epoch": self.epoch,
                                       "sn": list(sn) if sn is not None else None,
                                       "parts": self.parts, "digests": self.digests})

    def _remove_leftovers(self) -> None:
        """Parts of earlier writers no manifest names (a crash between a part's rename and
        its manifest); a newer writer's are not ours to judge."""
        named = set(self.parts)
        for entry in self.fs.ls(self.root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if (name.startswith("part-") or name.startswith(".part-")) \
                    and name not in named and part_epoch(name) < self.epoch:
                log.info("FileSink %s: removing %s, never committed", self.path, name)
                self.fs.rm(entry)

    def _full(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"


def read_manifest(fs, root: str) -> Optional[dict]:
    """The sink's newest manifest, verified: a damaged one (``DamagedFile``) names neither
    the committed parts nor the last SN for certain, and guessing either would lose or
    repeat outputs; None when nothing was committed yet."""
    return Epochs(fs, root).newest()


def read_file_sink(path: str) -> List[Tuple[tuple, Any]]:
    """The committed ``(sn, record)`` outputs of a ``FileSink`` folder, in SN order."""
    fs, root = fsspec.core.url_to_fs(path)
    manifest = read_manifest(fs, root)
    if manifest is None:
        return []
    rows: List[Tuple[tuple, Any]] = []
    digests = manifest.get("digests") or {}
    for name in manifest["parts"]:
        part = f"{root.rstrip('/')}/{name}"
        try:
            data = fs.cat_file(part)
        except FileNotFoundError:
            raise DamagedFile(part, "a committed part of the sink is missing") from None
        if name in digests and digest(data) != digests[name]:
            raise DamagedFile(part, "a committed part's checksum does not match")
        if manifest["format"] == "jsonl":
            rows += [(tuple(r["sn"]), r["record"]) for r in map(json.loads, data.splitlines())]
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(io.BytesIO(data))
            rows += [(tuple(sn), json.loads(rec)) for sn, rec in
                     zip(table.column("sn").to_pylist(), table.column("record").to_pylist())]
    return rows
