"""Exact views of the controller (controller/recovery.py; paper 3.2.1, 3.3, 3.4, 5.3;
DESIGN 4.4, 4.6; docs/design/catchup.md): failures, standbys, bottom-up catch-up."""
from __future__ import annotations

import pytest

from controller.placement import ChainedDeclustering, OneSegmentPerNode
from controller.recovery import Recovery
from flux.addresses import Addr, MoverAddr, P, S
from flux.control_messages import Avail, View
from flux.errors import PairLost
from flux.protocol.ingress import INGRESS
from controller.topology import Topology

EGRESS = Addr(3, 0, P)  # 2 stages


def incs(placement, standbys):
    names = [f"node{n}" for n in placement.nodes] + list(standbys)
    return {name: 100 + k for k, name in enumerate(names)}


def make(placement, standbys=("standby0", "standby1", "standby2")):
    inc = incs(placement, standbys)
    partitions = len({a.partition for a in placement.node_of})
    rec = Recovery(Topology(placement, 2, partitions, inc, list(standbys)))
    return rec, inc


def stage_neighbours(stage, partitions):
    below = {INGRESS} if stage == 1 else {Addr(1, j, r) for j in range(partitions) for r in (P, S)}
    above = {EGRESS} if stage == 2 else {Addr(2, j, r) for j in range(partitions) for r in (P, S)}
    return below | above


def report_all(rec, addr, version, reporters):
    views = []
    for r in sorted(reporters):
        views += rec.folded_in(r, addr, version)
    return views


def all_versions(views):
    return [a.version for v in views for a in v.avail]


# --- one segment per node: 2 stages x 2 partitions --------------------------------------
# node0 1.0P, node1 1.0S, node2 1.1P, node3 1.1S, node4 2.0P, node5 2.0S, node6 2.1P, node7 2.1S

def single():
    return make(OneSegmentPerNode(2, 2))


def test_node_failed_returns_the_fail_view_then_an_avail_view():
    rec, inc = single()
    views = rec.node_failed("node1")
    assert views == [
        View(1, failed=frozenset({Addr(1, 0, S), MoverAddr("node1")}),
             failed_incs=frozenset({inc["node1"]})),
        View(2, avail=(Avail(Addr(1, 0, S), inc["standby0"], 1, "standby0", "node0"),)),
    ]
    assert rec.pending()
    assert rec.node_failed("node1") == []  # declared once


def test_no_standby_no_avail_until_one_registers():
    rec, inc = make(OneSegmentPerNode(2, 2), standbys=())
    views = rec.node_failed("node5")
    assert views == [View(1, failed=frozenset({Addr(2, 0, S), MoverAddr("node5")}),
                          failed_incs=frozenset({inc["node5"]}))]
    assert rec.attempts == {}
    assert rec.folded_in(INGRESS, Addr(2, 0, S), 1) == []
    assert rec.add_standby("late0", 77) == [
        View(2, avail=(Avail(Addr(2, 0, S), 77, 1, "late0", "node4"),))]


def test_folded_in_from_every_live_neighbour_completes_the_attempt():
    rec, _ = single()
    x = Addr(1, 0, S)
    rec.node_failed("node1")
    reporters = sorted(stage_neighbours(1, 2))
    for r in reporters[:-1]:
        assert rec.folded_in(r, x, 1) == []
        assert rec.pending() and x in rec.attempts
    assert rec.folded_in(reporters[-1], x, 1) == []  # nothing else to schedule
    assert not rec.pending() and rec.completed == [x] and rec.attempts == {}


def test_folded_in_for_an_old_version_is_ignored():
    rec, _ = single()
    x = Addr(1, 0, S)
    rec.node_failed("node1")
    assert report_all(rec, x, 2, stage_neighbours(1, 2)) == []
    assert rec.attempts[x].reported == set()
    assert rec.pending() and rec.completed == []
    assert rec.folded_in(INGRESS, Addr(1, 1, P), 1) == []  # no attempt for it


def test_a_failed_neighbour_aborts_the_attempt_and_it_restarts_bottom_up():
    rec, inc = single()
    x = Addr(1, 0, S)
    rec.node_failed("node1")  # 1.0S on standby0, v1
    rec.folded_in(INGRESS, x, 1)
    views = rec.node_failed("node4")  # 2.0P: a consumer of 1.0S
    assert views == [
        View(3, failed=frozenset({Addr(2, 0, P), x, MoverAddr("node4")}),
             failed_incs=frozenset({inc["node4"]})),
        View(4, avail=(Avail(x, inc["standby0"], 2, "standby0", "node0"),)),
    ]
    assert set(rec.attempts) == {x}
    # v1's reports are void; the dead neighbour is not waited for
    live = stage_neighbours(1, 2) - {Addr(2, 0, P)}
    assert report_all(rec, x, 1, live) == []
    assert x in rec.attempts
    views = report_all(rec, x, 2, live)
    assert views == [View(5, avail=(Avail(Addr(2, 0, P), inc["standby1"], 3, "standby1", "node5"),))]
    assert rec.completed == [x]


def test_a_lower_stage_failure_aborts_an_upper_attempt():
    rec, inc = single()
    rec.node_failed("node4")  # 2.0P on standby0, v1
    views = rec.node_failed("node1")  # 1.0S: a producer of 2.0P
    assert views == [
        View(3, failed=frozenset({Addr(1, 0, S), Addr(2, 0, P), MoverAddr("node1")}),
             failed_incs=frozenset({inc["node1"]})),
        View(4, avail=(Avail(Addr(1, 0, S), inc["standby1"], 2, "standby1", "node0"),)),
    ]
    assert set(rec.attempts) == {Addr(1, 0, S)}


def test_a_standby_failing_mid_attempt_hands_its_replicas_to_the_next():
    rec, inc = single()
    x = Addr(1, 0, S)
    rec.node_failed("node1")
    views = rec.node_failed("standby0")
    assert views == [
        View(3, failed=frozenset({x, MoverAddr("standby0")}),
             failed_incs=frozenset({inc["standby0"]})),
        View(4, avail=(Avail(x, inc["standby1"], 2, "standby1", "node0"),)),
    ]
    assert report_all(rec, x, 1, stage_neighbours(1, 2)) == []  # the old attempt
    report_all(rec, x, 2, stage_neighbours(1, 2))
    assert rec.completed == [x]


def test_a_free_standby_failing_is_only_fenced():
    rec, inc = single()
    assert rec.node_failed("standby0") == [
        View(1, failed=frozenset({MoverAddr("standby0")}),
             failed_incs=frozenset({inc["standby0"]}))]
    assert rec.node_failed("node1")[1].avail[0].node == "standby1"


def test_pair_lost_names_stage_and_partition():
    rec, _ = single()
    rec.node_failed("node6")
    with pytest.raises(PairLost) as info:
        rec.node_failed("node7")
    assert (info.value.stage, info.value.partition) == (2, 1)
    assert "stage 2 partition 1" in str(info.value)


def test_losing_the_active_during_its_pairs_catch_up_is_pair_lost():
    rec, _ = single()
    rec.node_failed("node3")  # 1.1S rebuilt from 1.1P on node2
    with pytest.raises(PairLost) as info:
        rec.node_failed("node2")
    assert (info.value.stage, info.value.partition) == (1, 1)


# --- chained declustering: 2 stages x 4 partitions ------------------------------------
# node k: 1.kP, 2.kP, 1.(k-1)S, 2.(k-1)S

def chained():
    return make(ChainedDeclustering(2, 4))


def test_a_whole_node_is_rebuilt_bottom_up_with_unique_increasing_versions():
    rec, inc = chained()
    sb = inc["standby0"]
    views = rec.node_failed("node1")
    lost = {Addr(1, 1, P), Addr(2, 1, P), Addr(1, 0, S), Addr(2, 0, S)}
    assert views[0] == View(1, failed=frozenset(lost | {MoverAddr("node1")}),
                            failed_incs=frozenset({inc["node1"]}))
    # the lowest stage only; active_node names the node of each twin
    assert views[1:] == [View(2, avail=(Avail(Addr(1, 0, S), sb, 1, "standby0", "node0"),
                                        Avail(Addr(1, 1, P), sb, 2, "standby0", "node2")))]
    live = stage_neighbours(1, 4) - {Addr(2, 1, P), Addr(2, 0, S)}
    assert report_all(rec, Addr(1, 0, S), 1, live) == []  # 1.1P is still catching up
    assert rec.completed == [Addr(1, 0, S)]
    rest = sorted(live)
    for r in rest[:-1]:
        assert rec.folded_in(r, Addr(1, 1, P), 2) == []
    views = rec.folded_in(rest[-1], Addr(1, 1, P), 2)
    assert views == [View(3, avail=(Avail(Addr(2, 0, S), sb, 3, "standby0", "node0"),
                                    Avail(Addr(2, 1, P), sb, 4, "standby0", "node2")))]
    report_all(rec, Addr(2, 0, S), 3, stage_neighbours(2, 4))
    report_all(rec, Addr(2, 1, P), 4, stage_neighbours(2, 4))
    assert not rec.pending()
    assert rec.completed == [Addr(1, 0, S), Addr(1, 1, P), Addr(2, 0, S), Addr(2, 1, P)]


def test_a_standby_dying_mid_attempt_with_upper_replicas_waiting():
    rec, inc = chained()
    rec.node_failed("node1")
    views = rec.node_failed("standby0")
    assert views[0] == View(3, failed=frozenset({Addr(1, 0, S), Addr(1, 1, P), MoverAddr("standby0")}),
                            failed_incs=frozenset({inc["standby0"]}))
    sb1 = inc["standby1"]
    assert views[1:] == [View(4, avail=(Avail(Addr(1, 0, S), sb1, 3, "standby1", "node0"),
                                        Avail(Addr(1, 1, P), sb1, 4, "standby1", "node2")))]
    live = stage_neighbours(1, 4) - {Addr(2, 1, P), Addr(2, 0, S)}
    assert report_all(rec, Addr(1, 0, S), 1, live) == []
    report_all(rec, Addr(1, 0, S), 3, live)
    views = report_all(rec, Addr(1, 1, P), 4, live)
    # stage 2 of node1 goes to the same new standby, with new versions
    assert views == [View(5, avail=(Avail(Addr(2, 0, S), sb1, 5, "standby1", "node0"),
                                    Avail(Addr(2, 1, P), sb1, 6, "standby1", "node2")))]


def test_versions_never_repeat_over_aborts():
    rec, _ = chained()
    views = rec.node_failed("node1") + rec.node_failed("standby0") + rec.node_failed("standby1")
    assert all_versions(views) == [1, 2, 3, 4, 5, 6]


def test_a_failed_transfer_aborts_its_attempt_and_retries_with_a_new_version():
    # A checksum mismatch with both ends alive: the new replica is declared failed alone
    # (so its producers stop waiting for it) and the catch-up starts again.
    from controller.placement import ChainedDeclustering
    from controller.recovery import Recovery

    placement = ChainedDeclustering(1, 2)
    incs = {"node0": 1, "node1": 2, "standby0": 3}
    rec = Recovery(Topology(placement, 1, 2, incs, ["standby0"]))
    views = rec.node_failed("node1")
    first = {a.addr: a.version for v in views for a in v.avail}
    (a1, v1), (a2, v2) = sorted(first.items())
    abort1 = rec.transfer_failed(a1.stage, a1.partition, v1)
    assert abort1[0].failed == frozenset({a1}) and abort1[0].failed_incs == frozenset()
    assert len(abort1) == 1  # the rest of this wave is still running: no retry yet
    abort2 = rec.transfer_failed(a2.stage, a2.partition, v2)
    assert abort2[0].failed == frozenset({a2})
    again = {a.addr: a.version for v in abort2[1:] for a in v.avail}
    assert set(again) == {a1, a2} and min(again.values()) > max(first.values())
    assert rec.transfer_failed(a1.stage, a1.partition, v1) == []  # old news


def test_under_cluster_pairs_one_node_fails_its_whole_replica_set_and_nothing_is_rebuilt():
    from controller.placement import ClusterPairs

    rec, inc = make(ClusterPairs(2, 4, 4))  # set P: node0, node1; set S: node2, node3
    views = rec.node_failed("node1")
    assert len(views) == 1  # no avail: a set is not rebuilt segment by segment
    assert rec.dead == {"node0", "node1"}
    assert views[0].failed_incs == frozenset({inc["node0"], inc["node1"]})
    assert {a for a in views[0].failed if isinstance(a, Addr)} == {
        Addr(s, i, P) for s in (1, 2) for i in range(4)}
    assert rec.node_failed("node0") == []  # already failed with its set
    assert rec.lost_set() == P  # rebuilt by a restart from a checkpoint (DESIGN 7)
    with pytest.raises(PairLost, match="stage 1 partition 0"):
        rec.node_failed("node2")


def test_only_a_whole_lost_set_is_a_lost_set():
    from controller.placement import ClusterPairs

    rec, _ = make(ClusterPairs(2, 4, 4))
    assert rec.lost_set() is None
    rec.node_failed("node3")
    assert rec.lost_set() == S
    chained, _ = make(ChainedDeclustering(2, 4), standbys=("standby0",))
    chained.node_failed("node1")
    assert chained.lost_set() is None  # Flux rebuilds replica by replica


def test_a_node_holds_the_last_replica_of_a_pair_while_its_twin_is_being_rebuilt():
    rec, _ = make(ChainedDeclustering(2, 4), standbys=("standby0",))
    assert not any(rec.holds_last_replica(f"node{k}") for k in range(4))
    rec.node_failed("node1")  # partitions 1 (P) and 0 (S) now have one replica each
    assert rec.holds_last_replica("node0") and rec.holds_last_replica("node2")
    assert not rec.holds_last_replica("node3")
    for addr in sorted(rec.attempts):  # catch-up completes: the pairs are whole again
        report_all(rec, addr, rec.attempts[addr].version, rec.attempts[addr].expected)
    for addr in sorted(rec.attempts):
        report_all(rec, addr, rec.attempts[addr].version, rec.attempts[addr].expected)
    assert not rec.pending()
    assert not any(rec.holds_last_replica(n) for n in ("node0", "node2", "node3", "standby0"))
