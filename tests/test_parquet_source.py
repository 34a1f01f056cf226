"""ParquetSource (flux/connectors/parquet_source.py): a folder's Parquet files as Arrow
batches in name order, replayable from any position between two batches, and a job fed
by it gives the output of its rows as records."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flux.connectors.parquet_source import ParquetSource
from flux.connectors.sources import NOT_YET
from flux.examples import paper_dataflow, vectorized_dataflow
from flux.examples.vectorized import PACKET_SCHEMA
from exchange.columns import to_batch, to_records
from flux.operator import wire_form
from flux.reference import reference_output
from flux.testing.threads import ThreadCluster
from flux.testing.workloads import packet_workload

pytestmark = pytest.mark.timeout(120)


def write(folder, records, files=3, row_group=700):
    per = -(-len(records) // files)
    for i in range(files):
        table = pa.Table.from_batches([to_batch(records[i * per:(i + 1) * per], PACKET_SCHEMA)])
        pq.write_table(table, folder / f"part-{i:03d}.parquet", row_group_size=row_group)


def rows_of(batches):
    return [row for batch in batches for row in to_records(batch)]


def test_the_files_are_read_in_name_order_as_batches_of_at_most_batch_rows(tmp_path):
    records = packet_workload(5000, seed=1, pairs=100, apps=3, sources=10)
    write(tmp_path, records)
    (tmp_path / "notes.txt").write_text("not parquet")
    batches = list(ParquetSource(str(tmp_path), batch_rows=512))
    assert all(0 < b.num_rows <= 512 for b in batches)
    assert rows_of(batches) == [tuple(r) for r in records]


def test_a_source_opened_at_a_position_goes_on_after_the_batch_returned_last(tmp_path):
    records = packet_workload(4000, seed=2, pairs=100, apps=3, sources=10)
    write(tmp_path, records)
    first = ParquetSource(str(tmp_path), batch_rows=300)
    whole = list(first)
    for k in (0, 1, 5, len(whole) - 1, len(whole)):
        source = ParquetSource(str(tmp_path), batch_rows=300)
        for _ in range(k):
            next(source)
        again = ParquetSource(str(tmp_path), batch_rows=300)
        again.open(source.position)
        assert rows_of(list(again)) == rows_of(whole[k:])


def test_a_position_that_no_longer_exists_is_refused_with_where(tmp_path):
    write(tmp_path, packet_workload(1000, seed=3, pairs=10, apps=2, sources=3), files=1)
    source = ParquetSource(str(tmp_path), batch_rows=100)
    with pytest.raises(FileNotFoundError, match="no longer has 'gone.parquet'"):
        source.open(["gone.parquet", 2])
    source.open(["part-000.parquet", 99])
    with pytest.raises(ValueError, match="fewer than 99 batches of 100 rows"):
        next(source)
    with pytest.raises(ValueError, match="not a position"):
        source.open(["part-000.parquet", -1])


def test_following_the_folder_picks_up_new_files(tmp_path):
    records = packet_workload(1200, seed=4, pairs=10, apps=2, sources=3)
    write(tmp_path, records[:600], files=1)
    now = [0.0]
    source = ParquetSource(str(tmp_path), batch_rows=1000, follow=True, poll_interval=1.0,
                           clock=lambda: now[0])
    assert rows_of([next(source)]) == [tuple(r) for r in records[:600]]
    assert next(source) is NOT_YET
    pq.write_table(pa.Table.from_batches([to_batch(records[600:], PACKET_SCHEMA)]),
                   tmp_path / "part-001.parquet")
    now[0] = 2.0
    assert rows_of([next(source)]) == [tuple(r) for r in records[600:]]


def test_a_job_fed_parquet_batches_gives_the_per_record_output(tmp_path):
    records = packet_workload(4000, seed=6, pairs=200, apps=3, sources=12)
    write(tmp_path, records)
    expected = reference_output(paper_dataflow(), records, 3)
    cluster = ThreadCluster(vectorized_dataflow(), 3, ParquetSource(str(tmp_path), 333),
                            standbys=1, batch_rows=2048)
    with cluster:
        cluster.wait_until(lambda: len(cluster.delivered) >= len(expected) or cluster.errors, 60)
    assert not cluster.errors, cluster.errors
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]
