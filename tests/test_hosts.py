"""No pair on one host: which registered task runs which node, and which
standby replaces a failed node, judged against an exhaustive search."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.hosts import PlacementError, assign_hosts, twin_nodes
from controller.placement import ChainedDeclustering, ClusterPairs
from controller.recovery import Recovery
from flux.addresses import Addr, P, S
from controller.topology import Topology

pytestmark = pytest.mark.timeout(120)


def valid(placement, hosts_of_nodes) -> bool:
    return all(hosts_of_nodes[a] != hosts_of_nodes[b] for a, b in twin_nodes(placement))


def exists(placement, hosts) -> bool:
    """Any choice of len(nodes) candidates, in any order, that keeps pairs apart."""
    n = len(placement.nodes)
    return any(valid(placement, dict(enumerate(pick)))
               for pick in set(itertools.permutations(hosts, n)))


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.sampled_from("abcd"), min_size=n, max_size=n + 2))))
def test_chained_declustering_is_placed_whenever_it_can_be(case):
    n, hosts = case
    placement = ChainedDeclustering(2, n)
    candidates = list(enumerate(hosts))
    if exists(placement, hosts):
        chosen = assign_hosts(placement, candidates)
        assert sorted(chosen) == list(range(n)) and len(set(chosen.values())) == n
        assert valid(placement, {node: hosts[key] for node, key in chosen.items()})
    else:
        with pytest.raises(PlacementError):
            assign_hosts(placement, candidates)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([2, 4, 6]).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.sampled_from("abc"), min_size=n, max_size=n + 1))))
def test_cluster_pairs_are_placed_whenever_they_can_be(case):
    n, hosts = case
    placement = ClusterPairs(1, n, n)
    if exists(placement, hosts):
        chosen = assign_hosts(placement, list(enumerate(hosts)))
        assert valid(placement, {node: hosts[key] for node, key in chosen.items()})
    else:
        with pytest.raises(PlacementError):
            assign_hosts(placement, list(enumerate(hosts)))


def test_too_few_hosts_is_refused_with_what_to_do():
    with pytest.raises(PlacementError) as err:
        assign_hosts(ChainedDeclustering(2, 4), [(k, "10.0.0.1") for k in range(5)])
    msg = str(err.value)
    assert "10.0.0.1: 5" in msg and "distinct_hosts=False" in msg and "at least 2 hosts" in msg


def test_a_large_ring_over_uneven_hosts_is_placed_at_once():
    hosts = ["h0"] * 32 + [f"h{k}" for k in range(1, 5) for _ in range(8)]  # 64 nodes
    chosen = assign_hosts(ChainedDeclustering(2, 64), list(enumerate(hosts)))
    assert valid(ChainedDeclustering(2, 64), {n: hosts[k] for n, k in chosen.items()})
    with pytest.raises(PlacementError):  # 33 of 64 on one host: two neighbours share it
        assign_hosts(ChainedDeclustering(2, 64), list(enumerate(["h0"] * 33 + ["h1"] * 31)))


def test_a_standby_on_a_survivors_host_is_passed_over():
    """node1 fails; its replicas' twins live on node0 (host A) and node2 (host C): the
    standby on host A waits, the one on host D takes over."""
    placement = ChainedDeclustering(1, 4)
    topology = Topology.numbered(placement, 1, 4, standbys=2)
    hosts = {"node0": "A", "node1": "B", "node2": "C", "node3": "D",
             "standby0": "A", "standby1": "D"}
    rec = Recovery(topology, hosts)
    views = rec.node_failed("node1")
    avails = [a for v in views for a in v.avail]
    assert {a.node for a in avails} == {"standby1"}
    assert {a.addr for a in avails} == {Addr(1, 1, P), Addr(1, 0, S)}


def test_with_only_a_survivors_host_free_the_pair_waits_for_another_standby():
    placement = ChainedDeclustering(1, 4)
    topology = Topology.numbered(placement, 1, 4, standbys=1)
    hosts = {"node0": "A", "node1": "B", "node2": "C", "node3": "D", "standby0": "C"}
    rec = Recovery(topology, hosts)
    views = rec.node_failed("node1")
    assert not any(v.avail for v in views)
    assert rec.pair_states()[1, 1] == "degraded"
    views = rec.add_standby("standby9", 99, host="B")  # the machine that failed, restarted
    assert {a.node for v in views for a in v.avail} == {"standby9"}


def test_without_hosts_the_first_free_standby_is_taken_as_before():
    placement = ChainedDeclustering(1, 3)
    rec = Recovery(Topology.numbered(placement, 1, 3, standbys=2))
    views = rec.node_failed("node0")
    assert {a.node for v in views for a in v.avail} == {"standby0"}
