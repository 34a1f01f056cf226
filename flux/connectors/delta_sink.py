"""An exactly-once sink into a Delta table, through delta-rs (DESIGN 10).

Each ``commit(sn)`` appends the outputs written since the last one in one
Delta commit that also carries, atomically, an application transaction
``(app_id, version)`` (the commit number of this job's sink) and the last SN
in the commit's metadata (``flux.sn``). Opened again, the sink reads both
back: outputs whose SN is not above the committed one are dropped (a
restart's replay regenerates them). delta-rs does not refuse a lower
transaction version by itself, so before each commit the sink checks that
the table's version for ``app_id`` is still the one it last wrote: if another
writer (another incarnation of the job) committed meanwhile, ``SinkFenced``.

Rows: ``sn`` (list of int64) and ``record`` (its JSON text).
"""
from __future__ import annotations

import json
import logging
from typing import Any, List, Optional, Tuple

from flux.connector_api import CommitsBySN
from flux.errors import SinkFenced

log = logging.getLogger(__name__)

SN_KEY, APP_KEY = "flux.sn", "flux.app"


class DeltaSink(CommitsBySN):
    """Exactly-once appends to the Delta table at ``table_uri`` (created if absent). Also a
    plain callable sink (``sink(item)``)."""

    name = "DeltaSink"

    def __init__(self, table_uri: str, app_id: str = "flux", storage_options=None,
                 commit_every: int = 10_000, history_limit: int = 10_000):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        self.uri, self.app_id = table_uri, app_id
        self.storage_options = storage_options
        self.version: Optional[int] = None  # this app's last transaction version
        committed = None
        try:
            table = DeltaTable(table_uri, storage_options=storage_options)
        except TableNotFoundError:  # no table yet: the first commit creates it
            table = None
        if table is not None:
            self.version = table.transaction_version(app_id)
            if self.version is not None:
                committed = self._sn_of_last_commit(table, history_limit)
        super().__init__(committed, commit_every)

    def _sn_of_last_commit(self, table, limit: int) -> Tuple[int, ...]:
        """From the table's history, newest first: the last ``limit`` commits, then (sinks
        sharing a table, one per partition, may have committed far more than this one
        since its last) the whole history."""
        for entries in (table.history(limit), table.history()):
            for entry in entries:
                if entry.get(APP_KEY) == self.app_id and SN_KEY in entry:
                    return tuple(json.loads(entry[SN_KEY]))
        raise RuntimeError(f"DeltaSink: {self.uri} has transaction version {self.version} "
                           f"for {self.app_id!r} but no commit in its history says which SN "
                           f"it committed")

    def _commit(self, rows: list, sn: tuple) -> None:
        """One Delta commit: the rows, the app transaction and the SN, together."""
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
        from deltalake.exceptions import TableNotFoundError

        try:
            now = DeltaTable(self.uri, storage_options=self.storage_options
                             ).transaction_version(self.app_id)
        except TableNotFoundError:
            now = None
        if now != self.version:
            raise SinkFenced(f"DeltaSink: {self.uri} has transaction version {now} for "
                             f"{self.app_id!r}, this sink wrote {self.version}: another "
                             f"writer took over")
        version = (self.version or 0) + 1
        table = pa.table({"sn": pa.array([list(s) for s, _ in rows], pa.list_(pa.int64())),
                          "record": pa.array([json.dumps(r) for _, r in rows], pa.string())})
        write_deltalake(self.uri, table, mode="append", storage_options=self.storage_options,
                        commit_properties=CommitProperties(
                            custom_metadata={SN_KEY: json.dumps(list(sn)),
                                             APP_KEY: self.app_id},
                            app_transactions=[Transaction(self.app_id, version)]))
        self.version = version


def read_delta_sink(table_uri: str, storage_options=None) -> List[Tuple[tuple, Any]]:
    """The ``(sn, record)`` rows of a ``DeltaSink`` table, in SN order."""
    from deltalake import DeltaTable

    table = DeltaTable(table_uri, storage_options=storage_options).to_pyarrow_table()
    rows = [(tuple(sn), json.loads(rec)) for sn, rec in
            zip(table.column("sn").to_pylist(), table.column("record").to_pylist())]
    return sorted(rows, key=lambda r: r[0])
