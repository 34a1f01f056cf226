"""An egress per last-stage partition in the runtime (``ordered_output=False``,
docs/design/parallel_io.md): each partition's outputs come out in SN order and equal the
failure-free run's outputs of that partition, through a kill; the sink's dedup after a
restart is per partition; what is not built yet is refused by name."""
from __future__ import annotations

import pytest

from flux.examples import paper_dataflow
from flux.operator import wire_form
from flux.reference import ReferenceRun
from flux.spark.output import OutputWriter
from flux.testing.threads import ThreadCluster
from flux.testing.workloads import packet_workload
from thread_runs import paced

pytestmark = pytest.mark.timeout(120)


def reference_by_partition(dataflow, records, partitions):
    run = ReferenceRun(dataflow, partitions)
    outputs = [o for r in records for o in run.feed(r)]
    by: dict = {}
    for output, p in zip(outputs, run.output_partitions):
        by.setdefault(p, []).append(wire_form(output))
    return outputs, by


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


@pytest.mark.parametrize("options", [dict(checkpoint="/tmp/x"), {}])
def test_what_an_egress_per_partition_does_not_do_yet_is_refused(options, tmp_path):
    from flux.connectors.file_sink import FileSink
    from flux.spark.job import FluxJob

    sink = None if options else FileSink(str(tmp_path / "out"))
    with pytest.raises(ValueError, match="ordered_output=False .* not built yet"):
        FluxJob(None, paper_dataflow(), [], sink, ordered_output=False, **options)
