"""Topology: the one map from processes to endpoints (DESIGN 2)."""
from __future__ import annotations

from controller.placement import ChainedDeclustering, ClusterPairs
from flux.addresses import Addr, P, S
from controller.topology import Topology, node_name, standby_name


def test_numbered_knows_every_process_and_where_every_endpoint_starts():
    t = Topology.numbered(ChainedDeclustering(2, 3), stages=2, partitions=3, standbys=2)
    assert t.nodes == ("node0", "node1", "node2") and t.standbys == ("standby0", "standby1")
    assert t.processes == ("controller", "ingress", "egress", *t.nodes, *t.standbys)
    assert sorted(t.incarnations.values()) == list(range(1, 9))  # all distinct
    assert t.where[Addr(1, 1, P)] == "node1" and t.where[Addr(1, 0, S)] == "node1"
    assert t.where[t.ingress] == "ingress" and t.where[t.egress] == "egress"
    assert t.egress == Addr(3, 0, P) and t.endpoints_of("standby0") == ()
    assert t.is_worker("standby1") and t.is_worker("node2") and not t.is_worker("egress")


def test_peer_incarnations_follow_where_endpoints_live():
    t = Topology(ChainedDeclustering(1, 2), 1, 2, {"node0": 10, "node1": 11, "standby7": 17,
                                                    "ingress": -1, "egress": -2}, ["standby7"])
    assert t.peer_incs()[Addr(1, 0, P)] == 10
    moved = {**t.where, Addr(1, 0, P): "standby7"}  # after a catch-up
    assert t.peer_incs(moved)[Addr(1, 0, P)] == 17


def test_unknown_incarnations_are_left_out_not_guessed():
    t = Topology(ChainedDeclustering(1, 2), 1, 2, {"node0": 10})
    assert set(t.peer_incs()) == {a for a in t.endpoints_of("node0")}


def test_failure_groups_come_from_the_placement_by_name():
    chained = Topology.numbered(ChainedDeclustering(1, 4), 1, 4, standbys=1)
    assert chained.failure_group("node2") == ["node2"]
    assert chained.failure_group("standby0") == ["standby0"]
    pairs = Topology.numbered(ClusterPairs(1, 4, 4), 1, 4)
    assert pairs.failure_group("node3") == ["node2", "node3"]


def test_names_are_made_in_one_place():
    assert node_name(3) == "node3" and standby_name(12) == "standby12"
