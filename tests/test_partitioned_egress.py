"""An egress per last-stage partition in the runtime (``ordered_output=False``,
docs/design/parallel_io.md): each partition's outputs come out in SN order and equal the
failure-free run's outputs of that partition, through a kill; the sink's dedup after a
restart is per partition; what is not built yet is refused by name."""
from __future__ import annotations

import pytest

from flux.examples import paper_dataflow
from flux.operator import wire_form
from flux.spark.output import OutputWriter
from flux.testing.threads import ThreadCluster
from flux.testing.workloads import packet_workload
from thread_runs import paced, reference_by_partition

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kill", [None, "node1"])
def test_each_partition_delivers_its_failure_free_output_in_order(kill):
    records = packet_workload(6000, seed=8, pairs=600, apps=4, sources=30)
    outputs, expected = reference_by_partition(paper_dataflow(), records, 4)
    assert len(expected) == 4
    cluster = ThreadCluster(paper_dataflow(), 4, paced(records) if kill else iter(records),
                            standbys=1, ordered_output=False)
    with cluster:
        if kill:
            assert cluster.wait_until(lambda: len(cluster.delivered) > len(outputs) // 3, 60)
            cluster.kill(kill)
        assert cluster.wait_until(lambda: len(cluster.delivered) >= len(outputs)
                                  and not cluster.recovery.pending() or cluster.errors, 60)
    assert not cluster.errors, cluster.errors
    got = {p: [wire_form(x) for x in items] for p, items in cluster.by_partition.items()}
    assert got == expected
    assert sorted(wire_form(x) for x in cluster.delivered) == sorted(
        wire_form(x) for x in outputs)
    # the partitions' outputs interleave: no one order across partitions was waited for
    sns = [tuple(sn) for sn, _ in cluster.delivered]
    assert sns != sorted(sns)


def test_the_sinks_dedup_after_a_restart_is_per_partition():
    writer = OutputWriter(None, keep_output=True)
    writer.deliver([((5, 1), "a5"), ((9, 1), "a9")], partition=0)
    writer.deliver([((3, 1), "b3"), ((7, 1), "b7")], partition=1)  # below partition 0's
    writer.deliver([((9, 1), "a9"), ((11, 1), "a11")], partition=0)  # a replay: 9 given
    writer.deliver([((7, 1), "b7")], partition=1)
    assert [v for _, v in writer.delivered] == ["a5", "a9", "b3", "b7", "a11"]
    assert writer.last_sn == (11, 1)


def test_a_sink_per_partition_commits_and_dedups_each_partition_by_itself(tmp_path):
    """Each partition's FileSink drops what it committed (a restart's replay), commits at
    its own cuts, and the job's ``holds`` is the largest any partition holds."""
    from flux.connector_api import SinkPerPartition
    from flux.connectors.file_sink import FileSink, read_file_sink

    def folder(p):
        return str(tmp_path / f"partition-{p}")

    per_partition = SinkPerPartition(lambda p: FileSink(folder(p)))
    writer = OutputWriter(per_partition, keep_output=False, partitions=2)
    writer.deliver([((5, 1), "a5"), ((9, 1), "a9")], partition=0)
    writer.deliver([((3, 1), "b3")], partition=1)
    assert writer.commit(0) == (9, 1)  # partition 0's cut: partition 1 not committed
    assert read_file_sink(folder(1)) == []
    writer.deliver([((7, 1), "b7")], partition=1)
    assert writer.commit(1) == (7, 1)
    writer.deliver([((11, 1), "a11")], partition=0)  # handed, not committed
    assert writer.holds() == (11, 1)
    writer.close()
    # a new driver (a restart): each partition's sink reads back its own last SN, and a
    # replay from an earlier cut adds nothing twice to either partition
    again = OutputWriter(per_partition, keep_output=False, partitions=2)
    assert again.holds() == (11, 1)
    again.deliver([((5, 1), "a5"), ((9, 1), "a9"), ((11, 1), "a11"), ((13, 1), "a13")], 0)
    again.deliver([((3, 1), "b3"), ((7, 1), "b7"), ((8, 1), "b8")], 1)
    assert again.commit() == (13, 1)
    assert [v for _, v in read_file_sink(folder(0))] == ["a5", "a9", "a11", "a13"]
    assert [v for _, v in read_file_sink(folder(1))] == ["b3", "b7", "b8"]


def test_a_sink_per_partition_must_give_sinks(tmp_path):
    from flux.connector_api import SinkPerPartition
    from flux.connectors.file_sink import FileSink

    with pytest.raises(TypeError, match="partition 1 is a str, neither a flux.Sink nor"):
        OutputWriter(SinkPerPartition(lambda p: print if p == 0 else "out"), False,
                     partitions=2)
    with pytest.raises(TypeError, match="exactly-once sinks for some partitions"):
        OutputWriter(SinkPerPartition(lambda p: FileSink(str(tmp_path)) if p else print),
                     False, partitions=2)
    with pytest.raises(TypeError, match="a function of the partition"):
        SinkPerPartition("out/")


@pytest.mark.parametrize("ordered", [True, False])
def test_an_exactly_once_sink_and_the_egresses_must_match(ordered, tmp_path):
    """One exactly-once sink takes one ordered stream; a sink per partition needs an
    egress per partition: each mismatch is refused with what to give instead."""
    from flux.connector_api import SinkPerPartition
    from flux.connectors.file_sink import FileSink
    from flux.spark.job import FluxJob

    if ordered:
        sink, match = SinkPerPartition(lambda p: print), "SinkPerPartition needs ordered_outp"
    else:
        sink, match = FileSink(str(tmp_path / "out")), "give each partition its own, sink=fl"
    with pytest.raises(ValueError, match=match):
        FluxJob(None, paper_dataflow(), [], sink, ordered_output=ordered)


def test_an_egress_on_the_executors_needs_a_sink_per_partition():
    from flux.connector_api import SinkPerPartition
    from flux.spark.options import JobOptions

    per_partition = SinkPerPartition(lambda p: None)
    with pytest.raises(ValueError, match="egress_on_executors=True needs ordered_output=False"):
        JobOptions.from_kwargs(egress_on_executors=True).check_output(per_partition)
    with pytest.raises(ValueError, match="egress_on_executors=True needs"):
        JobOptions.from_kwargs(egress_on_executors=True, ordered_output=False).check_output(
            print)
    with pytest.raises(ValueError, match="keeps no output in the driver"):
        JobOptions.from_kwargs(egress_on_executors=True, ordered_output=False,
                               keep_output=True).check_output(per_partition)
    JobOptions.from_kwargs(egress_on_executors=True, ordered_output=False).check_output(
        per_partition)


def test_an_egress_on_the_executors_needs_a_sink_that_pickles():
    import threading

    from flux.connector_api import SinkPerPartition
    from flux.spark.job import shipped_sink

    lock = threading.Lock()
    with pytest.raises(ValueError, match="cannot be pickled.*never a lock"):
        shipped_sink(SinkPerPartition(lambda p: (lock, p)))
    assert shipped_sink(SinkPerPartition(lambda p: f"/data/{p}"))


def test_with_the_egresses_on_the_executors_the_driver_reads_what_the_sinks_hold(tmp_path):
    """The driver never writes them; what they hold (for a restart's check of the input
    log) is read from the sinks when asked, not from what the driver saw at its start."""
    from flux.connector_api import SinkPerPartition
    from flux.connectors.file_sink import FileSink

    per_partition = SinkPerPartition(lambda p: FileSink(str(tmp_path / f"partition-{p}")))
    driver = OutputWriter(per_partition, keep_output=False, partitions=2, on_executors=True)
    assert driver.holds() is None
    on_an_executor = per_partition.open(1)  # a writer, elsewhere
    on_an_executor.write([((4, 1), "x"), ((6, 1), "y")])
    on_an_executor.commit((6, 1))
    assert driver.holds() == (6, 1)
    assert driver.commit() is None and driver.delivered == []
    driver.close()
