"""Failures over real sockets: a node dies mid-stream, the controller detects its
silence, the survivors take over, a standby is rebuilt, and the output is exactly
the failure-free output."""
from __future__ import annotations

import time

import pytest

from flux.examples import paper_dataflow
from flux.testing.dataflows import counting_dataflow
from flux.operator import wire_form
from flux.reference import reference_output
from flux.testing.threads import ThreadCluster
from flux.testing.workloads import keyed_workload, packet_workload

pytestmark = pytest.mark.timeout(120)


def paced(records, every=50, pause=0.003):
    """A source that keeps the stream going long enough for a kill to land mid-stream."""
    for k, r in enumerate(records):
        if k % every == 0:
            time.sleep(pause)
        yield r


def check_same_output(cluster, expected):
    assert not cluster.errors, cluster.errors
    assert [wire_form(x) for x in cluster.delivered] == [wire_form(x) for x in expected]


@pytest.mark.parametrize("victim", ["node1", "node2"])
def test_a_node_killed_mid_stream_changes_nothing_in_the_output(victim):
    records = packet_workload(6000, seed=8, pairs=600, apps=4, sources=30)
    expected = reference_output(paper_dataflow(), records, 4)
    cluster = ThreadCluster(paper_dataflow(), 4, paced(records), standbys=1)
    with cluster:
        assert cluster.wait_until(lambda: len(cluster.delivered) > len(expected) // 3, 60)
        cluster.kill(victim)
        done = cluster.wait_until(lambda: len(cluster.delivered) == len(expected)
                                  and not cluster.recovery.pending(), 60)
        assert not cluster.controller.error, cluster.controller.error
        assert done, (len(cluster.delivered), len(expected), cluster.recovery.missing)
    check_same_output(cluster, expected)
    kinds = [what for _, what, _ in cluster.controller.events]
    assert "detected" in kinds and "take-over done" in kinds and "catch-up done" in kinds
    moves = [d for _, what, d in cluster.controller.events if what == "state moved"]
    assert {addr for addr, _, _ in moves} == set(cluster.recovery.completed)
    assert all(nbytes > 0 and seconds >= 0 for _, nbytes, seconds in moves)
    # the state went through the StateMover services (their own threads and sockets)
    assert cluster.movers["standby0"].relayed > 0
    # found by its dropped connection, not by the (slower) heartbeat timeout
    assert cluster.controller.why_dead == {victim: "its connection dropped"}
    assert sorted(cluster.recovery.completed) == sorted(
        a for a in cluster.recovery.hosted["standby0"])


def test_a_second_failure_after_catch_up_is_survived_too():
    records = keyed_workload(8000, seed=2, keys=40)
    expected = reference_output(counting_dataflow(2), records, 4)
    cluster = ThreadCluster(counting_dataflow(2), 4, paced(records, pause=0.004), standbys=2)
    with cluster:
        assert cluster.wait_until(lambda: len(cluster.delivered) > len(expected) // 4, 60)
        cluster.kill("node0")
        assert cluster.wait_until(lambda: cluster.recovery.completed
                                  and not cluster.recovery.pending(), 60)
        cluster.kill("node2")
        assert cluster.wait_until(lambda: len(cluster.delivered) == len(expected)
                                  and not cluster.recovery.pending(), 60), (
            len(cluster.delivered), len(expected), cluster.recovery.missing)
    check_same_output(cluster, expected)


def test_under_cluster_pairs_a_node_failure_fails_its_set_and_the_other_set_carries_on():
    """DESIGN 7: plain exchanges inside a set, so the whole set is fenced; the ingress and
    the egress take over to the other set, and the output is unchanged."""
    records = packet_workload(6000, seed=8, pairs=600, apps=4, sources=30)
    expected = reference_output(paper_dataflow(), records, 4)
    cluster = ThreadCluster(paper_dataflow(), 4, paced(records), standbys=1,
                            replication="cluster-pairs")
    with cluster:
        assert cluster.wait_until(lambda: len(cluster.delivered) > len(expected) // 3, 60)
        cluster.kill("node1")
        done = cluster.wait_until(lambda: len(cluster.delivered) == len(expected), 60)
        assert not cluster.controller.error, cluster.controller.error
        assert done, (len(cluster.delivered), len(expected))
    check_same_output(cluster, expected)
    assert cluster.controller.why_dead == {"node1": "its connection dropped",
                                           "node0": "its replica set failed with node1"}
