"""Both replicas of a partition die: the job restarts by itself from its last checkpoint,
and the sink's committed content is the failure-free output, no gap, no duplicate
(slow: Spark)."""
from __future__ import annotations

import time

import pytest

from experiments.resumable_job import make_sink, read_sink, write_inputs
from flux.addresses import Addr, P, S

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


#: executors of this module's Spark session (the ``spark`` fixture, conftest)
SPARK_EXECUTORS = 5


@pytest.mark.parametrize("fmt,stage,partition,keep", [("jsonl", 1, 0, 50), ("delta", 2, 3, 3)])
def test_a_double_failure_restarts_from_the_last_checkpoint(spark, tmp_path, fmt, stage,
                                                            partition, keep):
    """``keep`` 50: nothing is pruned, so the test can see that the checkpoint restored
    was incremental (a whole snapshot and deltas after it, rebuilt by the nodes)."""
    from flux.testing.dataflows import counting_dataflow
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob

    expected = write_inputs(tmp_path / "in", 24_000)
    out = str(tmp_path / "out")
    sink = make_sink(fmt, out)
    job = FluxJob(spark, counting_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                  nodes=4, standbys=1, sink=sink, checkpoint=str(tmp_path / "ckpt"),
                  checkpoint_interval=1.0, checkpoint_keep=keep)
    assert job.resumed_from is None
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 60)
        where = job.topology.where
        for replica in (P, S):
            job.kill_node(where[Addr(stage, partition, replica)])
        killed = time.monotonic()
        job.wait(timeout=240)
    assert len(job.restart_log) == 1
    when, restored, why = job.restart_log[0]
    assert restored is not None and restored >= 2 and "both replicas" in why
    assert when - killed < 5
    assert read_sink(fmt, out) == expected
    # every output leads back to its input, across the restart (a sample: each is a read)
    as_read = list(FileSource(str(tmp_path / "in")))
    for sn, _ in expected[::len(expected) // 60] + expected[-3:]:
        found = job.lineage(sn, FileSource(str(tmp_path / "in")))
        assert found.record == as_read[sn[0] - 1], sn
    if keep == 50:
        from flux.runtime.checkpoint_store import CheckpointStore

        chains = CheckpointStore(str(tmp_path / "ckpt")).manifest(restored)["chains"]
        assert max(len(chain) for chain in chains) > 1, chains


@pytest.mark.parametrize("fmt", ["jsonl", "delta"])
def test_a_sink_per_partition_restarts_from_the_checkpoint_without_loss_or_repeat(
        spark, tmp_path, fmt):
    """ordered_output=False with a sink per partition (folders, or Delta app ids in one
    table): each commits at the cuts its partition's egress passes; a double failure
    restarts the job from its checkpoint, each sink drops what it had committed of the
    replay, and together they hold the failure-free output, each partition's in order."""
    from flux.connector_api import SinkPerPartition
    from flux.connectors.delta_sink import DeltaSink, read_delta_sink
    from flux.connectors.file_sink import FileSink, read_file_sink
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import counting_dataflow

    expected = write_inputs(tmp_path / "in", 24_000)
    out = tmp_path / "out"
    if fmt == "delta":
        sinks = SinkPerPartition(lambda p: DeltaSink(str(out), app_id=f"job-{p}",
                                                     commit_every=100_000))
    else:
        sinks = SinkPerPartition(lambda p: FileSink(str(out / f"partition-{p}"),
                                                    commit_every=100_000))
    job = FluxJob(spark, counting_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                  nodes=4, standbys=1, sink=sinks, checkpoint=str(tmp_path / "ckpt"),
                  checkpoint_interval=1.0, ordered_output=False)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 60)
        manifest = job.checkpoints.store.manifest(job.checkpoints.completed[-1].number)
        assert len(manifest["sinks"]) == 4  # each sink partition's own commit at the cut
        where = job.topology.where
        for replica in (P, S):
            job.kill_node(where[Addr(2, 1, replica)])
        job.wait(timeout=240)
    assert len(job.restart_log) == 1 and job.restart_log[0][1] is not None
    if fmt == "delta":
        assert read_delta_sink(str(out)) == expected
        return
    parts = [read_file_sink(str(out / f"partition-{p}")) for p in range(4)]
    assert all(parts) and sorted(row for part in parts for row in part) == expected
    for part in parts:  # each in SN order, nothing twice
        sns = [sn for sn, _ in part]
        assert sns == sorted(set(sns))


def test_a_job_without_a_replayable_source_cannot_checkpoint(spark, tmp_path):
    from flux.testing.dataflows import counting_dataflow
    from flux.spark.job import FluxJob

    with pytest.raises(ValueError, match="read again from a position"):
        FluxJob(spark, counting_dataflow(2), iter(range(10)), nodes=4,
                checkpoint=str(tmp_path / "ckpt"))


def test_a_checkpoint_of_another_dataflow_is_refused(spark, tmp_path):
    """Checkpoints written by one dataflow are never restored into another, nor with other
    key groups, nor split over another partition count when an operator's state is not a
    keyed store: the job refuses to start and says why."""
    from flux.errors import CheckpointMismatch
    from flux.examples import paper_dataflow
    from flux.testing.dataflows import counting_dataflow
    from flux.spark.job import FluxJob

    from flux.testing.workloads import keyed_workload

    records = keyed_workload(3000, seed=1, keys=7)
    with FluxJob(spark, counting_dataflow(2), records, nodes=4, standbys=0,
                 checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=0.2) as job:
        job.wait(timeout=120)
        assert job.wait_until(lambda: job.checkpoints.completed, 10)
    with pytest.raises(CheckpointMismatch, match="another checkpoint location"):
        FluxJob(spark, paper_dataflow(), [], nodes=4, checkpoint=str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointMismatch, match="key_groups=256, this job has "
                                                 "key_groups=128"):
        FluxJob(spark, counting_dataflow(2), records, nodes=4, key_groups=128,
                checkpoint=str(tmp_path / "ckpt"))
    from flux import Dataflow, RescaleRefused, Stage
    from flux.testing.counter import KeyedCounter, first_field

    totals = Dataflow([Stage("count1", first_field, (KeyedCounter,)),
                       Stage("count2", first_field, (KeyedCounter, RunningTotal))])
    with FluxJob(spark, totals, records, nodes=4, standbys=0,
                 checkpoint=str(tmp_path / "totals"), checkpoint_interval=0.2) as job:
        job.wait(timeout=120)
        assert job.wait_until(lambda: job.checkpoints.completed, 10)
    with pytest.raises(RescaleRefused, match=r"stage 'count2' operator 1 \(RunningTotal\) "
                                             r"keeps state that is not a keyed store"):
        FluxJob(spark, totals, records, nodes=2, checkpoint=str(tmp_path / "totals"))


class RunningTotal:
    """State that is not a keyed store: a count of the partition's records."""

    def __init__(self):
        self.total = 0

    def process(self, record):
        self.total += 1
        return [record]

    def get_state(self):
        return self.total

    def install_state(self, state):
        self.total = state


def test_the_ingress_process_killed_restarts_the_job_from_its_checkpoint(spark, tmp_path):
    """The ingress runs in a process of its own: SIGKILLed (the OOM killer's
    way), what it held dies with it; the job restarts from its last checkpoint, and the
    sink's content is the failure-free output."""
    import os
    import signal

    from flux.testing.dataflows import counting_dataflow
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob

    expected = write_inputs(tmp_path / "in", 16_000)
    out = str(tmp_path / "out")
    job = FluxJob(spark, counting_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                  nodes=4, standbys=0, sink=make_sink("jsonl", out),
                  checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 1, 60)
        first = job.ingress_pid
        os.kill(first, signal.SIGKILL)
        job.wait(timeout=240)
        assert job.ingress_pid != first
    assert len(job.restart_log) == 1
    _, restored, why = job.restart_log[0]
    assert restored is not None and f"pid {first}) exited with code -9" in why
    assert read_sink("jsonl", out) == expected


def test_without_a_checkpoint_the_ingress_process_killed_stops_the_job_with_why(spark):
    import os
    import signal

    from flux.errors import IngressLost
    from flux.testing.dataflows import counting_dataflow
    from flux.connectors.sources import RateLimited
    from flux.spark.job import FluxJob
    from flux.testing.workloads import keyed_workload

    records = keyed_workload(40_000, seed=2, keys=50)
    with FluxJob(spark, counting_dataflow(2), RateLimited(records, 4000), nodes=4,
                 standbys=0) as job:
        assert job.wait_until(lambda: len(job.delivered) > 100, 60)
        pid = job.ingress_pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(IngressLost, match=f"pid {pid}\\) exited with code -9"):
            job.wait(timeout=60)


def kill_a_pair_after_two_checkpoints(job, stage: int, partition: int) -> None:
    """Both replicas of one partition die once two checkpoints are complete; the job
    restarts once, from a checkpoint, and runs to its end."""
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 60)
        where = job.topology.where
        for replica in (P, S):
            job.kill_node(where[Addr(stage, partition, replica)])
        job.wait(timeout=240)
    assert len(job.restart_log) == 1 and job.restart_log[0][1] is not None


def test_a_double_failure_under_batch_operators_restarts_from_the_checkpoint(spark, tmp_path):
    """The vectorized paper dataflow (operators on Arrow batches, columnar items in the
    buffers and states) loses a pair: it restarts from its checkpoint, and the sink holds
    the per-record dataflow's failure-free output, no gap, no duplicate."""
    from flux.connectors.file_sink import FileSink, read_file_sink
    from flux.connectors.sources import Paced, SequenceSource
    from flux.examples import paper_dataflow, vectorized_dataflow
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.spark.job import FluxJob
    from flux.testing.workloads import packet_workload

    records = packet_workload(60_000, seed=4, pairs=3000, apps=4, sources=60)
    expected = [wire_form(x) for x in reference_output(paper_dataflow(), records, 4)]
    out = str(tmp_path / "out")
    job = FluxJob(spark, vectorized_dataflow(), Paced(SequenceSource(records), 8000), nodes=4,
                  standbys=1, sink=FileSink(out), checkpoint=str(tmp_path / "ckpt"),
                  checkpoint_interval=1.0)
    kill_a_pair_after_two_checkpoints(job, 2, 1)
    assert [wire_form(x) for x in read_file_sink(out)] == expected


def test_a_parquet_fed_job_restarts_after_the_batch_its_checkpoint_holds(spark, tmp_path):
    """A ParquetSource's position lies between two batches; a double failure restarts
    from the checkpoint's and the sink holds the failure-free output of the rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from exchange.columns import to_batch
    from flux.connectors.file_sink import FileSink, read_file_sink
    from flux.connectors.parquet_source import ParquetSource
    from flux.connectors.sources import Paced
    from flux.examples import paper_dataflow, vectorized_dataflow
    from flux.examples.vectorized import PACKET_SCHEMA
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.spark.job import FluxJob
    from flux.testing.workloads import packet_workload

    records = packet_workload(60_000, seed=7, pairs=3000, apps=4, sources=60)
    (tmp_path / "in").mkdir()
    for i in range(3):
        pq.write_table(pa.Table.from_batches([to_batch(records[i * 20_000:(i + 1) * 20_000],
                                                       PACKET_SCHEMA)]),
                       tmp_path / "in" / f"part-{i}.parquet", row_group_size=3000)
    expected = [wire_form(x) for x in reference_output(paper_dataflow(), records, 4)]
    out = str(tmp_path / "out")
    source = Paced(ParquetSource(str(tmp_path / "in"), batch_rows=500), 16)  # 8K rows/s
    job = FluxJob(spark, vectorized_dataflow(), source, nodes=4, standbys=1,
                  sink=FileSink(out), checkpoint=str(tmp_path / "ckpt"),
                  checkpoint_interval=1.0)
    kill_a_pair_after_two_checkpoints(job, 1, 2)
    assert [wire_form(x) for x in read_file_sink(out)] == expected
