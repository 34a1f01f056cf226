"""A replayable source of Arrow batches over a folder of Parquet files (DESIGN 10, 11).

Every file in the folder whose name ends in ``.parquet``, read in name order as
``pyarrow.RecordBatch`` objects of at most ``batch_rows`` rows, new files picked
up as they appear with ``follow``. Each row is one input: the driver hands the
batches to the ingress as they are, without a record per row, and a stage of
operators on batches gets them as columns (a stage of record operators gets each
row as a tuple of its values in column order).

Its position is ``[file name, batches read from it]``: a file read again gives
the same batches (the same ``batch_rows``), so ``open(position)`` goes on after
exactly the batch returned last (a checkpoint's cut lies between two of them).
``columns`` reads only those, in that order.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional, Sequence

from flux.connectors.folder_files import END_OF_FILE, FolderFiles, FolderSource

SUFFIXES = (".parquet",)


class ParquetSource(FolderSource):
    """Arrow batches from the Parquet files of ``path``, in file-name order."""

    replay_order = "position"  # files in name order, read again alike

    def __init__(self, path: str, batch_rows: int = 8192,
                 columns: Optional[Sequence[str]] = None, follow: bool = False,
                 poll_interval: float = 0.5, clock: Callable[[], float] = time.monotonic):
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {batch_rows!r}")
        self.files = FolderFiles(path, SUFFIXES, follow, poll_interval, clock,
                                 owner="ParquetSource")
        self.path, self.batch_rows, self.follow = path, batch_rows, follow
        self.columns = list(columns) if columns is not None else None
        self._file: Optional[str] = None  # the file being read
        self._read = 0  # batches of it returned
        self._batches: Optional[Iterator[Any]] = None
        self._handle = None
        self.rows = 0  # rows returned, for monitoring

    # -- the Source protocol --------------------------------------------------------------
    @property
    def position(self) -> list:
        return [self._file, self._read]

    def open(self, position: Any) -> None:
        """Go on after ``position`` (``[file name, batches read]``; ``[None, 0]``: the
        start)."""
        name, read = position
        if name is not None and not isinstance(name, str) or not isinstance(read, int) \
                or read < 0:
            raise ValueError(f"ParquetSource: not a position: {position!r}")
        self.files.check(name, position)
        self._close()
        self._file, self._read = name, read

    # -- one file ---------------------------------------------------------------------
    def _next_in_file(self) -> Any:
        batch = self._next_batch()
        if batch is None:
            return END_OF_FILE
        self._read += 1
        self.rows += batch.num_rows
        return batch

    def _begin(self, name: str) -> None:
        self._file, self._read = name, 0

    # -- reading ------------------------------------------------------------------------
    def _next_batch(self) -> Any:
        if self._file is None:
            return None
        if self._batches is None:
            import pyarrow.parquet as pq

            self._handle = self.files.fs.open(self.files.full(self._file), "rb")
            batches = pq.ParquetFile(self._handle).iter_batches(
                batch_size=self.batch_rows, columns=self.columns)
            for _ in range(self._read):  # a restart: the batches returned before
                if next(batches, None) is None:
                    raise ValueError(f"ParquetSource: {self._file!r} has fewer than "
                                     f"{self._read} batches of {self.batch_rows} rows, "
                                     f"where the checkpoint's position is")
            self._batches = batches
        return next(self._batches, None)

    def _close(self) -> None:
        self._batches = None
        if self._handle is not None:
            self._handle.close()
            self._handle = None
