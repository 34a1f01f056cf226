"""Pairs a live rescale to fewer takes out (docs/design/rescaling.md): once both
replicas of each crossed the cut that took their groups and hold nothing, a view makes
them leave; their producers drop what waits only for acks in flight, their consumers
wait for no bound of them, and a pair started again later starts fresh, routing by the
maps in force."""
from __future__ import annotations

import pytest

from controller.placement import ChainedDeclustering
from controller.recovery import Recovery
from controller.topology import Topology
from exchange.group_map import GroupMap, GroupMove
from exchange.merge import DORMANT, OrderedMerge
from exchange.partitioner import KEY_GROUPS
from flux.addresses import Addr, P, S
from flux.control_messages import Avail, View
from flux.data_messages import Batch
from flux.envelope import Envelope
from flux.errors import LocalProtocolError
from flux.protocol.builder import MachineBuilder
from flux.protocol.cuts import Cuts
from flux.protocol.egress import Egress
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.host import Host
from flux.protocol.links import ACK, ACTIVE, DEAD, SEND
from flux.protocol.producer import Producer
from flux.testing.dataflows import regrouping_dataflow
from items import rows

pytestmark = pytest.mark.timeout(60)


def test_a_merge_releases_what_a_left_producer_sent_and_waits_for_nothing_more_of_it():
    merge = OrderedMerge([0, 1])
    merge.push(1, [((2, 1), rows(((2,), "b")))], (2,))
    merge.push(0, [((3, 0), rows(((3,), "a")))], (3,))
    merge.leave(1)
    assert merge.bounds[1] == DORMANT
    assert [sn for _, (sn, _) in merge.pop_item()] == [(2, 1)]  # its queue goes in order
    assert merge.ready() and [sn for _, (sn, _) in merge.pop_item()] == [(3, 0)]


def _producer():
    peers = [(Addr(2, i, P), Addr(2, i, S)) for i in range(3)]
    return Producer(Addr(1, 0, P), peers, capacity=4, batch_size=2,
                    normal_modes=(SEND, ACK))


def test_a_producer_drops_what_a_left_partition_was_sent_and_links_it_as_absent():
    out = _producer()
    out.put(2, (5, 0), rows(((5,), "a")))
    out.flush(2, 0, (5,))  # sent to replica P, its ack (from replica S) still in flight
    out.leave(2)
    assert len(out.buffers[2]) == 0 and 2 in out.dormant
    assert [out.status(2, d) for d in (0, 1)] == [DEAD, DEAD]
    out.check_invariants()
    out.leave(2)  # told again (a replica made later): nothing
    out.join(2)  # started again later: fresh links
    assert [out.status(2, d) for d in (0, 1)] == [ACTIVE, ACTIVE]


def test_a_producer_refuses_to_drop_an_entry_it_never_sent_to_a_left_partition():
    out = _producer()
    out.put(1, (5, 0), rows(((5,), "a")))
    with pytest.raises(LocalProtocolError, match="partition 1 left"):
        out.leave(1)


def test_a_last_stage_producer_has_no_partitions_to_leave():
    """Its one consumer is the egress: a leave of partition 0 is not its link's."""
    out = Producer(Addr(2, 1, P), [(Addr(3, 0, P), Addr(3, 0, S))], capacity=4,
                   batch_size=2, normal_modes=(SEND, ACK), partitioned=False)
    out.leave(0)
    assert out.status(0, 0) is ACTIVE


def test_a_consumer_takes_nothing_more_from_a_left_partition_and_waits_for_no_bound():
    producers = [(Addr(1, j, P), Addr(1, j, S)) for j in range(2)]
    fcons = FluxConsumer(Addr(2, 0, P), producers)
    fcons.on_batch(Addr(1, 0, P), Batch((((4, 0), rows(((4,), "a"))),), (4,)))
    assert not fcons.can_release()  # partition 1 has told no bound
    fcons.leave(1)
    assert fcons.can_release() and fcons.feeds[1].data_source() is None


def test_an_egress_releases_what_waited_for_a_left_partition_at_once():
    egress = Egress(2, 2)
    got = egress.on_message(Addr(2, 0, P), Batch((((4, 0), rows(((4,), "a"))),), (4,)))
    assert not any(type(e).__name__ == "Deliver" for e in got)
    got = egress.on_leave(frozenset({1}))
    assert [type(e).__name__ for e in got if type(e).__name__ == "Deliver"] == ["Deliver"]


def _builder():
    builder = MachineBuilder(regrouping_dataflow(2), 3, capacity=4, batch_size=2)
    return builder


def test_a_host_stops_the_left_replicas_drops_their_mail_and_tells_later_replicas():
    builder = _builder()
    node = Host("node0", {a: builder.segment(a) for a in (Addr(1, 0, P), Addr(2, 2, S))},
                segment_factory=builder.standby_segment, peer_incs={Addr(1, 2, P): 9,
                                                                   Addr(2, 2, S): 0})
    left = tuple(Addr(s, 2, r) for s in (1, 2) for r in (P, S))
    node.on_view(View(1, left=left))
    assert set(node.machines) == {Addr(1, 0, P)}
    assert node.machines[Addr(1, 0, P)].fprod.out.status(2, 0) is DEAD
    # what a left replica sent before it stopped, and what is sent to it, is dropped
    late = Envelope(Addr(1, 2, P), Addr(1, 0, P), 0, Batch((), (9,)), 9, None)
    assert node.fenced(late)
    assert node.on_envelope(Envelope(Addr(1, 0, S), Addr(2, 2, S), 0, Batch((), (9,)),
                                     3, None)) == ([], [])
    # a replica made here later, built as the job started, is told the leave at once
    node.on_view(View(2, failed=frozenset({Addr(2, 0, S)}), failed_incs=frozenset({5})))
    node.on_view(View(3, avail=(Avail(Addr(2, 0, S), 0, 1, "node0", "node1"),)))
    new = node.machines[Addr(2, 0, S)]
    assert new.fcons.feeds[2].dormant and new.fcons.merge.bounds[2] == DORMANT


def _recovery():
    placement = ChainedDeclustering(2, 4)
    standbys = ["standby0", "standby1"]
    names = [f"node{n}" for n in placement.nodes] + standbys
    inc = {name: 100 + k for k, name in enumerate(names)}
    return Recovery(Topology(placement, 2, 4, inc, standbys))


def test_the_controller_takes_the_left_replicas_out_and_frees_nodes_holding_nothing():
    rec = _recovery()
    [view] = rec.leave([2, 3])
    assert {a.partition for a in view.left} == {2, 3} and len(view.left) == 8
    assert not any(a.partition in (2, 3) for a in rec.placed())
    # chained: node2 held P of 2 and S of 1; node3 P of 3 and S of 2; node0 S of 3
    assert "node3" in rec.free and "node2" not in rec.free and "node0" not in rec.free
    assert rec.left == {2, 3}
    # a later join starts them again on free nodes, the freed one among them
    [again] = rec.join([2, 3])
    assert {j.node for j in again.joined} <= {"standby0", "standby1", "node3"}
    assert rec.left == set()


def test_the_controller_takes_no_pair_out_while_a_replica_is_missing():
    rec = _recovery()
    rec.node_failed("node1")
    assert rec.leave([3]) == []


def test_a_joined_replica_tells_the_moves_in_its_maps_on_but_crosses_them_not_again():
    cuts = Cuts()
    cuts.seen_up_to(4, (5, 20))
    move = GroupMove(1, 0, 9, 0, 1)
    cuts.learn((5, 20, ((4, 18, (move.to_wire(),)),)))
    assert cuts.moves == {} and [m[0] for m in cuts.move_cuts] == [4]  # told on
    assert cuts.pending == {}  # cut 5 was chosen before it started: not its snapshot
    cuts.learn((6, 25, ((6, 25, (move.to_wire(),)),)))
    assert cuts.pending == {6: 25} and list(cuts.moves) == [6]
    again = Cuts()
    again.install_state(cuts.to_state())  # a catch-up's copy keeps where it started
    assert (again.applied, again.skipped) == (4, 5)


def test_a_joined_replica_routes_by_the_maps_it_is_given():
    builder = _builder()
    moved = GroupMap.even(3, KEY_GROUPS).moved([GroupMove(2, 0, 40, 0, 2)])
    seg = builder.joined_segment(Addr(1, 2, P), ((2, tuple(moved.owners.tolist())),), 3)
    assert seg.router.groups == moved and seg.cuts.moves_crossed == 3


def test_an_egress_of_a_partition_that_left_commits_the_cut_that_took_its_groups():
    """With a sink per partition, no stamp of the leaving replicas may bring the cut that
    took their groups to their egress: the leave's view does, and with its feed ended
    the egress crosses it at once, so its sink commits there (else that checkpoint would
    wait for the commit for good: the simulator's seed 33097 of 5,2,4)."""
    from flux.effects import SinkCommit

    egress = Egress(2, 4, partition=3)
    assert [e for e in egress.on_leave(frozenset({1}), (5, 50))
            if isinstance(e, SinkCommit)] == []  # another partition's leave: nothing
    commits = [e for e in egress.on_leave(frozenset({3}), (5, 50))
               if isinstance(e, SinkCommit)]
    assert commits == [SinkCommit(5, 50, 3)]
