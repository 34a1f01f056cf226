"""A job run again with another ``nodes=`` on its checkpoint location resumes from the
checkpoint, each new partition starting from the key groups it owns (DESIGN 13): the sink
ends with the failure-free output, nothing lost or twice (slow: Spark)."""
from __future__ import annotations

import json

import pytest

from experiments.resumable_job import make_sink, read_sink

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: executors of this module's Spark session: the larger job's 6 nodes
SPARK_EXECUTORS = 6


def write_inputs(folder, n: int) -> list:
    """``n`` keyed records in JSON-lines files; the failure-free output of the regrouping
    dataflow over them (the same at every partition count), as the sink reads it back."""
    from flux.connectors.file_source import FileSource
    from flux.operator import wire_form
    from flux.reference import reference_output
    from flux.testing.dataflows import regrouping_dataflow
    from flux.testing.workloads import keyed_workload

    folder.mkdir(parents=True)
    records = keyed_workload(n, seed=7, keys=300)
    for i in range(3):
        with open(folder / f"part-{i}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records[i::3])
    as_read = list(FileSource(str(folder)))
    return [(sn, wire_form(r)) for sn, r in reference_output(regrouping_dataflow(2), as_read, 5)]


@pytest.mark.parametrize("old, new", [(4, 6), (6, 3)])
def test_a_job_run_again_with_other_nodes_resumes_from_its_checkpoint(spark, tmp_path, old,
                                                                      new):
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    expected = write_inputs(tmp_path / "in", 24_000)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    first = FluxJob(spark, regrouping_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                    nodes=old, standbys=0, sink=make_sink("jsonl", out), checkpoint=ckpt,
                    checkpoint_interval=0.5)
    with first:
        assert first.wait_until(lambda: len(first.checkpoints.completed) >= 3, 120)
    partial = read_sink("jsonl", out)
    assert 0 < len(partial) < len(expected) and partial == expected[:len(partial)]

    second = FluxJob(spark, regrouping_dataflow(2), FileSource(str(tmp_path / "in")),
                     nodes=new, standbys=0, sink=make_sink("jsonl", out), checkpoint=ckpt)
    assert second.resumed_from["partitions"] == old and second.resumed_from["cut"] > 0
    with second:
        second.wait(timeout=240)
    assert read_sink("jsonl", out) == expected
    assert any(kind == "rescale" and what == (old, new)
               for _, kind, what in second.metrics.events)


def rescaled_to_6(spark, dataflow, source, tmp_path) -> tuple:
    """A job of 4 nodes into a JSON-lines sink, ``job.rescale(6)`` once two checkpoints
    are complete, run to its end: it restarted once, for the rescale, from a checkpoint.
    The job and its sink's rows."""
    from flux.spark.job import FluxJob

    out = str(tmp_path / "out")
    job = FluxJob(spark, dataflow, source, nodes=4, standbys=0, sink=make_sink("jsonl", out),
                  checkpoint=str(tmp_path / "ckpt"), checkpoint_interval=1.0)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.rescale(6)
        assert job.options.replication.nodes == 6 and len(job.topology.nodes) == 6
        job.wait(timeout=300)
    (when, restored, why), = job.restart_log
    assert "rescale to 6 nodes" in why and restored is not None
    assert any(kind == "rescale" and what == (4, 6) for _, kind, what in job.metrics.events)
    return job, read_sink("jsonl", out)


def test_a_running_job_rescaled_goes_on_at_the_new_count_exactly(spark, tmp_path):
    """``job.rescale(6)`` on a job of 4 nodes: a checkpoint cut at once, the job restarted
    from it at 6, each new partition with its key groups; the sink ends with the
    failure-free output."""
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.testing.dataflows import regrouping_dataflow

    expected = write_inputs(tmp_path / "in", 30_000)
    job, rows = rescaled_to_6(spark, regrouping_dataflow(2),
                              Paced(FileSource(str(tmp_path / "in")), 4000), tmp_path)
    assert rows == expected
    assert job.restarts_left == 3  # a rescale is not one of the failures' restarts


@pytest.mark.parametrize("old, new, on_executors", [(4, 6, False), (6, 3, True)])
def test_a_running_job_with_a_sink_per_partition_drains_then_goes_on_exactly(
        spark, tmp_path, old, new, on_executors):
    """``ordered_output=False``, a JSON-lines sink per partition (written in the driver, or
    by writers on the executors): ``job.rescale`` reads the source no further than a cut,
    every sink partition commits up to it, and the job goes on at the new count from
    that checkpoint. The sinks together hold the failure-free output, each output once
    (an output the old count's sinks held and the new count made again would be in two
    partitions), each partition's in SN order; the partitions only the new count has
    hold only outputs past the cut."""
    from flux.connector_api import SinkPerPartition
    from flux.connectors.file_sink import FileSink, read_file_sink
    from flux.connectors.file_source import FileSource
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import regrouping_dataflow

    expected = write_inputs(tmp_path / "in", 30_000)
    out = tmp_path / "out"
    sinks = SinkPerPartition(lambda p: FileSink(str(out / f"partition-{p}"),
                                                commit_every=100_000))
    job = FluxJob(spark, regrouping_dataflow(2), Paced(FileSource(str(tmp_path / "in")), 4000),
                  nodes=old, standbys=0, sink=sinks, checkpoint=str(tmp_path / "ckpt"),
                  checkpoint_interval=1.0, checkpoint_keep=1000, ordered_output=False,
                  egress_on_executors=on_executors)  # (kept: the test reads the cut)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.rescale(new)
        assert job.options.replication.nodes == new and len(job.topology.nodes) == new
        job.wait(timeout=300)
    (_, restored, why), = job.restart_log
    assert f"rescale to {new} nodes" in why and restored is not None
    cut = job.checkpoints.store.manifest(restored)["cut"]
    assert 0 < cut < len(expected)
    parts = [read_file_sink(str(out / f"partition-{p}")) for p in range(max(old, new))]
    rows = sorted(tuple(row) for part in parts for row in part)
    assert len(rows) == len(expected) and rows == sorted(tuple(row) for row in expected)
    for part in parts:  # each in SN order, nothing twice
        sns = [tuple(sn) for sn, _ in part]
        assert sns == sorted(set(sns))
    for part in parts[old:]:
        assert part and all(sn[0] > cut for sn, _ in part)


@pytest.mark.parametrize("old, new", [(4, 6), (6, 3)])
def test_a_split_job_run_again_with_other_nodes_resumes_from_its_checkpoint(spark, tmp_path,
                                                                            old, new):
    """The input read on the executors (``ListSplits`` of 3 splits by key, a pair of
    ingresses each): stopped after three checkpoints and run again at another count,
    each pair follows its split's log past the cut and each new partition starts from
    the key groups it owns. The sink ends with the failure-free output of the inputs in
    the order the job numbered them, each once (the dataflow's output is the same at
    every count)."""
    from flux.connectors.split_sources import ListSplits
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import relayed_mismatch, relaying_dataflow
    from flux.testing.workloads import keyed_workload

    records = [tuple(r) for r in keyed_workload(24_000, seed=8, keys=300)]
    splits = ListSplits.by_key(records, 3, key=lambda r: r[0])
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    first = FluxJob(spark, relaying_dataflow(), ListSplits(splits.parts, rate=4000 / 3),
                    nodes=old, standbys=0, sink=make_sink("jsonl", out), checkpoint=ckpt,
                    checkpoint_interval=0.5)
    with first:
        assert first.wait_until(lambda: len(first.checkpoints.completed) >= 3, 120)
    assert 0 < len(read_sink("jsonl", out)) < len(records)

    second = FluxJob(spark, relaying_dataflow(), splits, nodes=new, standbys=0,
                     sink=make_sink("jsonl", out), checkpoint=ckpt)
    assert second.resumed_from["partitions"] == old and second.resumed_from["cut"] > 0
    with second:
        second.wait(timeout=240)
    rows = [(tuple(sn), record) for sn, record in read_sink("jsonl", out)]
    wrong = relayed_mismatch(rows, records, splits.parts, new)
    assert wrong is None, wrong
    assert any(kind == "rescale" and what == (old, new)
               for _, kind, what in second.metrics.events)


def test_a_running_split_job_rescaled_goes_on_at_the_new_count_exactly(spark, tmp_path):
    """``job.rescale(6)`` on a job of 4 nodes whose splits are read on the executors: the
    driver names a cut at once, the pairs pass it, and the job restarts from that
    checkpoint at 6, each pair of ingresses following its split's log past the cut."""
    from flux.connectors.split_sources import ListSplits
    from flux.testing.dataflows import relayed_mismatch, relaying_dataflow
    from flux.testing.workloads import keyed_workload

    records = [tuple(r) for r in keyed_workload(30_000, seed=9, keys=300)]
    splits = ListSplits.by_key(records, 3, key=lambda r: r[0])
    _, rows = rescaled_to_6(spark, relaying_dataflow(),
                            ListSplits(splits.parts, rate=4000 / 3), tmp_path)
    wrong = relayed_mismatch([(tuple(sn), r) for sn, r in rows], records, splits.parts, 6)
    assert wrong is None, wrong


def test_a_running_split_job_with_a_sink_per_partition_drains_then_goes_on_exactly(
        spark, tmp_path):
    """Splits read by pairs of ingresses on the executors, ``ordered_output=False``, a
    sink per partition: ``job.rescale(6)`` cuts at an epoch's end past what the sinks
    hold and tells every node to hold its pairs past that epoch, every sink partition
    commits up to the cut, and the job goes on at 6. The sinks together hold the
    failure-free output of the inputs in the order the job numbered them, each once."""
    from flux.connector_api import SinkPerPartition
    from flux.connectors.file_sink import FileSink, read_file_sink
    from flux.connectors.split_sources import ListSplits
    from flux.spark.job import FluxJob
    from flux.testing.dataflows import relayed_mismatch, relaying_dataflow
    from flux.testing.workloads import keyed_workload

    records = [tuple(r) for r in keyed_workload(30_000, seed=9, keys=300)]
    splits = ListSplits.by_key(records, 3, key=lambda r: r[0])
    out = tmp_path / "out"
    sinks = SinkPerPartition(lambda p: FileSink(str(out / f"partition-{p}"),
                                                commit_every=100_000))
    job = FluxJob(spark, relaying_dataflow(), ListSplits(splits.parts, rate=4000 / 3),
                  nodes=4, standbys=0, sink=sinks, checkpoint=str(tmp_path / "ckpt"),
                  checkpoint_interval=1.0, checkpoint_keep=1000, ordered_output=False)
    with job:
        assert job.wait_until(lambda: len(job.checkpoints.completed) >= 2, 120)
        job.rescale(6)
        assert job.options.replication.nodes == 6
        job.wait(timeout=300)
    (_, restored, why), = job.restart_log
    assert "rescale to 6 nodes" in why and restored is not None
    cut = job.checkpoints.store.manifest(restored)["cut"]
    parts = [read_file_sink(str(out / f"partition-{p}")) for p in range(6)]
    for part in parts:  # each in SN order, nothing twice
        sns = [tuple(sn) for sn, _ in part]
        assert sns == sorted(set(sns))
    for part in parts[4:]:
        assert part and all(sn[0] > cut for sn, _ in part)
    rows = sorted((tuple(sn), record) for part in parts for sn, record in part)
    wrong = relayed_mismatch(rows, records, splits.parts, 6)
    assert wrong is None, wrong
