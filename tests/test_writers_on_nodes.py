"""Sinks' writers on the nodes in the runtime (ThreadCluster over ZeroMQ;
docs/design/parallel_io.md): each last-stage partition's egress runs on the node of its
P replica and writes its own FileSink; killing that node starts the writer again beside
the survivor, and every partition's sink holds exactly the failure-free outputs of its
partition, in order, none twice."""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P
from flux.connector_api import SinkPerPartition
from flux.connectors.file_sink import FileSink, read_file_sink
from flux.examples import paper_dataflow
from flux.operator import wire_form
from flux.testing.threads import ThreadCluster
from flux.testing.workloads import packet_workload
from thread_runs import paced, reference_by_partition

pytestmark = pytest.mark.timeout(180)


def committed(folder):
    return [wire_form([list(sn), value]) for sn, value in read_file_sink(folder)]


@pytest.mark.parametrize("kill", [None, "node1"])
def test_each_partitions_sink_gets_its_failure_free_output_once(tmp_path, kill):
    records = packet_workload(6000, seed=8, pairs=600, apps=4, sources=30)
    expected = reference_by_partition(paper_dataflow(), records, 4)[1]
    folders = {p: str(tmp_path / f"partition-{p}") for p in range(4)}
    sink = SinkPerPartition(lambda p: FileSink(folders[p]))
    cluster = ThreadCluster(paper_dataflow(), 4, paced(records) if kill else iter(records),
                            standbys=1, sink=sink)
    stages = len(paper_dataflow().stages)
    moved = [p for p in range(4) if cluster.topology.where[Addr(stages, p, P)] == kill]

    def done():
        return all(len(read_file_sink(folders[p])) >= len(expected.get(p, ()))
                   for p in range(4)) and not cluster.recovery.pending()

    with cluster:
        if kill:
            assert moved  # the killed node runs a writer
            total = sum(len(v) for v in expected.values())
            assert cluster.wait_until(lambda: len(cluster.delivered) > total // 3, 60)
            cluster.kill(kill)
            at_kill = {p: len(read_file_sink(folders[p])) for p in moved}
        assert cluster.wait_until(lambda: done() or cluster.errors, 90), (
            {p: len(read_file_sink(folders[p])) for p in range(4)},
            {p: len(v) for p, v in expected.items()})
    assert not cluster.errors, cluster.errors
    for p in range(4):
        assert committed(folders[p]) == expected.get(p, []), f"partition {p}"
    if kill:  # the killed node's writers went on elsewhere, and wrote there
        assert all(cluster.recovery.writers.node[p] != kill for p in moved)
        assert any(len(expected.get(p, ())) > at_kill[p] for p in moved), at_kill
