import pytest

from controller.placement import (
    ChainedDeclustering,
    ClusterPairs,
    OneSegmentPerNode,
    Placement,
)
from flux.addresses import Addr, P, S


def test_chained_declustering_puts_p_on_k_and_s_of_k_minus_1():
    c = ChainedDeclustering(2, 4)
    assert set(c.nodes[0]) == {Addr(1, 0, P), Addr(2, 0, P), Addr(1, 3, S), Addr(2, 3, S)}
    assert c.node_of[Addr(2, 1, S)] == 2


def test_losing_adjacent_chained_nodes_loses_a_pair_and_names_it():
    c = ChainedDeclustering(2, 4)
    assert c.lost_pairs([0, 2]) == []
    assert c.lost_pairs([0, 1]) == [Addr(1, 0, P), Addr(2, 0, P)]


def test_cluster_pairs_split_the_nodes_into_two_whole_replica_sets():
    c = ClusterPairs(2, 4, 4)
    first = {a for n in (0, 1) for a in c.nodes[n]}
    second = {a for n in (2, 3) for a in c.nodes[n]}
    assert {a.replica for a in first} == {P} and {a.replica for a in second} == {S}
    assert len(first) == len(second) == 2 * 4  # every partition of every stage, once
    assert [c.replica_set(n) for n in range(4)] == [P, P, S, S]


def test_cluster_pairs_survive_any_failures_within_one_set_only():
    c = ClusterPairs(2, 4, 4)
    assert c.lost_pairs([0, 1]) == []
    assert c.lost_pairs([0, 2]) != []


@pytest.mark.parametrize("make,message", [
    (lambda: ChainedDeclustering(2, 1), "needs >= 2 partitions"),
    (lambda: ClusterPairs(2, 4, 3), "even number of nodes"),
    (lambda: Placement({0: [Addr(1, 0, P), Addr(1, 0, S)]}), "both replicas of 1.0 on node 0"),
    (lambda: Placement({0: [Addr(1, 0, P)], 1: [Addr(1, 0, P)]}), "placed twice"),
])
def test_bad_placements_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_one_segment_per_node_gives_every_replica_its_own_node():
    o = OneSegmentPerNode(2, 3)
    assert len(o.nodes) == 12 and all(len(a) == 1 for a in o.nodes.values())
