"""Each partition's egress on an executor (``egress_on_executors=True``,
docs/design/parallel_io.md): a sink's writer beside its last-stage replica writes its
partition's FileSink there, no output crossing the driver. Killing the node of a writer
starts it again beside the survivor; a double failure restarts the job from its
checkpoint (the writers' commits at the cuts reach the manifest); either way the sinks
hold the failure-free output, each partition's in SN order, none twice (slow: Spark)."""
from __future__ import annotations

import pytest

from experiments.resumable_job import write_inputs
from flux.addresses import Addr, P, S

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: executors of this module's Spark session (the ``spark`` fixture, conftest)
SPARK_EXECUTORS = 5


@pytest.mark.parametrize("double", [False, True], ids=["writer-node-killed", "double-failure"])
def test_the_sinks_hold_the_failure_free_output_once(spark, tmp_path, double):
    from flux.connector_api import SinkPerPartition
    from flux.connectors.file_sink import FileSink, read_file_sink
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import counting_dataflow

    expected = write_inputs(tmp_path / "in", 24_000)
    out = tmp_path / "out"
    sinks = SinkPerPartition(lambda p: FileSink(str(out / f"partition-{p}")))
    job = FluxJob(spark, counting_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                  nodes=4, standbys=1, sink=sinks, ordered_output=False,
                  egress_on_executors=True, checkpoint=str(tmp_path / "ckpt"),
                  checkpoint_interval=1.0)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 60)
        manifest = job.checkpoints.store.manifest(job.checkpoints.completed[-1].number)
        assert len(manifest["sinks"]) == 4  # each writer's sink committed at the cut
        where = job.topology.where
        assert where[Addr(3, 1, P)] == where[Addr(2, 1, P)]  # the writer beside its replica
        for replica in (P, S) if double else (P,):
            job.kill_node(where[Addr(2, 1, replica)])
        job.wait(timeout=240)
    assert len(job.restart_log) == (1 if double else 0)
    assert job.delivered == []  # no output in the driver
    # counted from the writers' reports (a writer that died may have committed a few
    # more than it last reported)
    assert 0 < job.metrics.output_total <= len(expected)
    if not double:
        assert job.metrics.output_total >= 0.9 * len(expected)
    parts = [read_file_sink(str(out / f"partition-{p}")) for p in range(4)]
    assert all(parts) and sorted(row for part in parts for row in part) == expected
    for part in parts:  # each in SN order, nothing twice
        sns = [sn for sn, _ in part]
        assert sns == sorted(set(sns))
