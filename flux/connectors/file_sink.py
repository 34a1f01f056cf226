"""An exactly-once sink of part files in a folder (DESIGN 10).

Outputs are written to a part file that stays hidden (``.part-N.tmp``) until
``commit(sn)``: the part is renamed into place (``part-N.jsonl`` or
``part-N.parquet``) and then the manifest ``_flux_sink.json``, naming every
committed part and the last SN, is replaced atomically. The manifest is the
truth: a reader reads the parts it names (``read_file_sink``), and a sink
opened again deletes every part it does not name (what a crash left between
rename and manifest) and drops every output whose SN is not above the
committed one, which a restart's replay regenerates.

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

from flux.connector_api import CommitsBySN
from flux.errors import DamagedFile
from flux.checksums import Damaged, digest, seal, unseal

log = logging.getLogger(__name__)

MANIFEST = "_flux_sink.json"
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
        manifest = read_manifest(self.fs, self.root)
        if manifest is not None and manifest.get("format") != format:
            raise ValueError(f"FileSink: {path!r} holds {manifest.get('format')} parts, "
                             f"not {format}")
        self.parts: List[str] = list(manifest["parts"]) if manifest else []
        #: each committed part's checksum (parts committed before checksums have none)
        self.digests: Dict[str, str] = dict(manifest.get("digests") or {}) if manifest else {}
        super().__init__(tuple(manifest["sn"]) if manifest and manifest["sn"] is not None
                         else None, commit_every)
        self._remove_leftovers()

    def _commit(self, rows: list, sn: tuple) -> None:
        """The part renamed into place, then the manifest naming it replaced atomically."""
        parts = list(self.parts)
        if rows:
            name = f"part-{len(parts):08d}.{self.format}"
            tmp = self._full(f".{name}.tmp")
            data = self._encode(rows)
            with self.fs.open(tmp, "wb") as f:
                f.write(data)
            self.fs.mv(tmp, self._full(name))
            parts.append(name)
        digests = {**self.digests, **({parts[-1]: digest(data)} if rows else {})}
        self._write_manifest({"format": self.format, "sn": list(sn), "parts": parts,
                              "digests": digests})
        self.parts, self.digests = parts, digests

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

    def _write_manifest(self, manifest: dict) -> None:
        data = seal(manifest)
        if "file" in self.fs.protocol:  # a rename is atomic on a local file system
            tmp = self._full(f".{MANIFEST}.tmp")
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, self._full(MANIFEST))
        else:  # one object put is atomic on object stores
            self.fs.pipe_file(self._full(MANIFEST), data)

    def _remove_leftovers(self) -> None:
        named = set(self.parts) | {MANIFEST}
        for entry in self.fs.ls(self.root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name not in named and (name.startswith("part-") or name.startswith(".part-")
                                      or name == f".{MANIFEST}.tmp"):
                log.info("FileSink %s: removing %s, never committed", self.path, name)
                self.fs.rm(entry)

    def _full(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"


def read_manifest(fs, root: str) -> Optional[dict]:
    """The sink's manifest, verified: a damaged one (``DamagedFile``) names neither the
    committed parts nor the last SN for certain, and guessing either would lose or repeat
    outputs; None when nothing was committed yet."""
    path = f"{root.rstrip('/')}/{MANIFEST}"
    if not fs.exists(path):
        return None
    try:
        return unseal(fs.cat_file(path), path)
    except Damaged as exc:
        raise DamagedFile(exc.path, f"the sink's manifest: {exc.why}") from None


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
