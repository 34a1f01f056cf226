"""An exactly-once sink into a Delta table, through delta-rs (DESIGN 10).

Each ``commit(sn)`` appends the outputs written since the last one in one
Delta commit that also carries, atomically, an application transaction
``(app_id, version)`` (the commit number of this job's sink) and the last SN
in the commit's metadata (``flux.sn``). Opened again, the sink reads both
back: outputs whose SN is not above the committed one are dropped (a
restart's replay regenerates them).

A writer opened again fences the one before it (a zombie: a node declared dead
that still runs), as the protocol's writers assume: the open commits an empty
transaction of the next version, and every commit is made on the table as it
was read when its version was checked, so a commit of this ``app_id`` by
anyone meanwhile makes it fail (delta-rs finds two transactions of one app id
in conflict) instead of landing beside it: ``SinkFenced``. Which of two racing
commits wins is Delta's to say; the loser never writes.

Rows: ``sn`` (list of int64) and ``record`` (its JSON text).
"""
from __future__ import annotations

import json
import logging
import random
import time
from typing import Any, List, Optional, Tuple

from flux.connector_api import CommitsBySN, opened_to_read
from flux.errors import SinkFenced

log = logging.getLogger(__name__)

SN_KEY, APP_KEY = "flux.sn", "flux.app"
#: opens whose fence another writer's commit beat before one is given up
FENCE_TRIES = 20


class DeltaSink(CommitsBySN):
    """Exactly-once appends to the Delta table at ``table_uri`` (created if absent). Also a
    plain callable sink (``sink(item)``)."""

    name = "DeltaSink"

    def __init__(self, table_uri: str, app_id: str = "flux", storage_options=None,
                 commit_every: int = 10_000, history_limit: int = 10_000):
        self.uri, self.app_id = table_uri, app_id
        self.storage_options = storage_options
        #: opened only to read what was committed (``opened_to_read``): no fence, no commit
        self.reading = opened_to_read()
        self.version: Optional[int] = None  # this app's last transaction version
        committed = None
        for _ in range(FENCE_TRIES):
            table = self._table()
            if table is not None:
                self.version = table.transaction_version(app_id)
                if self.version is not None:
                    committed = self._sn_of_last_commit(table, history_limit)
            if self.reading or self._fence(table, committed):
                break
            time.sleep(random.uniform(0.0, 0.05))  # the others' commits go first
        else:
            raise SinkFenced(f"DeltaSink: {table_uri} for {app_id!r}: another writer "
                             f"committed each of {FENCE_TRIES} times this one opened")
        super().__init__(committed, commit_every)

    def _table(self):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri, storage_options=self.storage_options)
        except TableNotFoundError:  # no table yet: the first commit creates it
            return None

    def _fence(self, table, committed: Optional[tuple]) -> bool:
        """An empty commit of the next version: every earlier writer's next commit fails.
        False when another commit came first: of this app id, or the table's creation by
        the sink of another partition opened at the same moment (read again)."""
        from deltalake.exceptions import CommitFailedError

        try:
            self._write(table, [], committed)
        except (SinkFenced, CommitFailedError):  # (the sinks of a table's partitions
            return False  # opened at once: its creation races, an empty commit is retried)
        return True

    def _sn_of_last_commit(self, table, limit: int) -> Optional[Tuple[int, ...]]:
        """From the table's history, newest first: the last ``limit`` commits, then (sinks
        sharing a table, one per partition, may have committed far more than this one
        since its last) the whole history. None: only fences, nothing committed yet."""
        for entries in (table.history(limit), table.history()):
            for entry in entries:
                if entry.get(APP_KEY) == self.app_id and SN_KEY in entry:
                    sn = json.loads(entry[SN_KEY])
                    return None if sn is None else tuple(sn)
        raise RuntimeError(f"DeltaSink: {self.uri} has transaction version {self.version} "
                           f"for {self.app_id!r} but no commit in its history says which SN "
                           f"it committed")

    def _commit(self, rows: list, sn: tuple) -> None:
        """One Delta commit: the rows, the app transaction and the SN, together."""
        if self.reading:
            raise RuntimeError(f"DeltaSink {self.uri}: opened only to read, not to commit")
        table = self._table()
        now = table.transaction_version(self.app_id) if table is not None else None
        if now != self.version:
            raise SinkFenced(f"DeltaSink: {self.uri} has transaction version {now} for "
                             f"{self.app_id!r}, this sink wrote {self.version}: another "
                             f"writer took over")
        self._write(table, rows, sn)

    def _write(self, table, rows: list, sn: Optional[tuple]) -> None:
        """``rows`` and the next transaction version, committed on ``table`` as read (None:
        created): a commit of this app id since then makes it fail, ``SinkFenced``."""
        import pyarrow as pa
        from deltalake import CommitProperties, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError

        version = (self.version or 0) + 1
        data = pa.table({"sn": pa.array([list(s) for s, _ in rows], pa.list_(pa.int64())),
                         "record": pa.array([json.dumps(r) for _, r in rows], pa.string())})
        try:
            write_deltalake(self.uri if table is None else table, data, mode="append",
                            storage_options=self.storage_options,
                            commit_properties=CommitProperties(
                                custom_metadata={SN_KEY: json.dumps(None if sn is None
                                                                    else list(sn)),
                                                 APP_KEY: self.app_id},
                                app_transactions=[Transaction(self.app_id, version)]))
        except CommitFailedError as exc:
            if "Concurrent transaction" not in str(exc):
                raise
            raise SinkFenced(f"DeltaSink: {self.uri}: another writer of {self.app_id!r} "
                             f"committed while this one did: {exc}") from None
        self.version = version


def read_delta_sink(table_uri: str, storage_options=None) -> List[Tuple[tuple, Any]]:
    """The ``(sn, record)`` rows of a ``DeltaSink`` table, in SN order."""
    from deltalake import DeltaTable

    table = DeltaTable(table_uri, storage_options=storage_options).to_pyarrow_table()
    rows = [(tuple(sn), json.loads(rec)) for sn, rec in
            zip(table.column("sn").to_pylist(), table.column("record").to_pylist())]
    return sorted(rows, key=lambda r: r[0])
