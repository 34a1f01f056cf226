"""Dormant pairs and their join (docs/design/rescaling.md): a partition past the running
count has no process, its producers send it nothing, its consumers wait for nothing of
it; a view starts it on standbys, and from then on it is a pair as any other."""
from __future__ import annotations

from controller.placement import ChainedDeclustering
from controller.recovery import Recovery
from controller.topology import Topology
from exchange.merge import DORMANT, OrderedMerge
from flux.addresses import Addr, P, S
from flux.control_messages import Avail, Joined, View
from flux.data_messages import Batch
from flux.protocol.builder import MachineBuilder
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.host import Host
from flux.protocol.links import ACK, ACTIVE, DEAD, SEND
from flux.protocol.producer import Producer
from flux.protocol.segment import AWAITING_STATE
from flux.testing.dataflows import regrouping_dataflow
from flux.sequence import NO_PROGRESS
from items import rows


def test_a_merge_waits_for_no_bound_of_a_dormant_producer_and_for_one_again_once_it_joins():
    merge = OrderedMerge([0, 1])
    merge.sleep(1)
    merge.push(0, [((3, 0), rows(((3,), "a")))], (3,))
    assert merge.ready()  # producer 1 sends nothing while dormant
    merge.rejoin(1)
    assert merge.bounds[1] == NO_PROGRESS and not merge.ready()
    merge.bound(1, (3,))
    assert merge.ready()
    merge.rejoin(1)  # a join told again moves no live bound back
    assert merge.bounds[1] == (3,)


def test_a_producer_with_something_queued_cannot_be_made_dormant():
    merge = OrderedMerge([0, 1])
    merge.push(1, [((3, 1), rows(((3,), "a")))])
    try:
        merge.sleep(1)
    except ValueError as exc:
        assert "queued" in str(exc)
    else:
        raise AssertionError("a producer with items queued slept")


def _producer(dormant=(2,)):
    """Replica P of a stage-1 partition, sending to the P replicas of stage 2 (5.1)."""
    peers = [(Addr(2, i, P), Addr(2, i, S)) for i in range(3)]
    return Producer(Addr(1, 0, P), peers, capacity=4, batch_size=2,
                    normal_modes=(SEND, ACK), dormant=dormant)


def test_a_producer_sends_nothing_to_a_dormant_partition_until_it_joins():
    out = _producer()
    assert [out.status(2, d) for d in (0, 1)] == [DEAD, DEAD]
    assert all(i != 2 for i, _ in out.flushable((5,)))
    out.join(2)
    assert [out.status(2, d) for d in (0, 1)] == [ACTIVE, ACTIVE]
    assert (2, 0) in out.flushable((5,))  # a bound to tell, and the newest cut
    sent = out.flush(2, 0, (5,))
    assert isinstance(sent.msg, Batch) and sent.msg.items == () and sent.msg.bound == (5,)


def test_a_join_over_a_state_that_had_it_already_keeps_the_links_as_they_are():
    # a new replica built as the job started installs its twin's state, taken after the
    # join, then replays the join it saw while waiting for that state
    twin = _producer(dormant=())
    twin.put(2, (7, 0), rows(((7,), "a")))
    out = _producer()
    out.install_state(twin.to_state(), reverse=False)
    out.join(2)
    assert len(out.buffers[2]) == 1 and not out.dormant
    assert [out.status(2, d) for d in (0, 1)] == [ACTIVE, ACTIVE]


def test_a_consumer_takes_data_from_a_joined_partition_and_waits_for_its_bound():
    producers = [(Addr(1, j, P), Addr(1, j, S)) for j in range(2)]
    fcons = FluxConsumer(Addr(2, 0, S), producers, dormant=[1])
    assert fcons.feeds[1].data_source() is None and fcons.merge.bounds[1] == DORMANT
    fcons.on_batch(Addr(1, 0, S), Batch((((4, 0), rows(((4,), "a"))),), (4,)))
    assert fcons.can_release()
    fcons.join(1)
    assert fcons.feeds[1].data_source() == Addr(1, 1, S)
    assert fcons.feeds[1].ack_to == P
    assert not fcons.can_release()  # until the joined partition says where it stands
    fcons.on_batch(Addr(1, 1, S), Batch((), (4,)))
    assert fcons.can_release()


def _recovery(standbys=("standby0", "standby1", "standby2")):
    placement = ChainedDeclustering(2, 2)
    names = [f"node{n}" for n in placement.nodes] + list(standbys)
    inc = {name: 100 + k for k, name in enumerate(names)}
    return Recovery(Topology(placement, 2, 4, inc, list(standbys))), inc


def test_the_controller_starts_joined_pairs_in_a_chain_of_standbys():
    rec, inc = _recovery()
    [view] = rec.join([2, 3])
    where = {j.addr: j.node for j in view.joined}
    assert where[Addr(1, 2, P)] == "standby0" and where[Addr(1, 2, S)] == "standby1"
    assert where[Addr(2, 3, P)] == "standby1" and where[Addr(2, 3, S)] == "standby0"
    assert all(j.inc == inc[j.node] for j in view.joined)
    assert rec.free == ["standby2"] and rec.placed()[Addr(2, 2, S)] == "standby1"
    # and a joined node's failure is a failure as any other: rebuilt on the standby left
    views = rec.node_failed("standby1")
    assert Addr(1, 2, S) in views[0].failed
    assert {a.node for v in views[1:] for a in v.avail} == {"standby2"}


def test_one_joined_pair_takes_two_standbys_and_none_starts_while_a_replica_is_missing():
    rec, _ = _recovery()
    rec.node_failed("node0")
    assert rec.join([2]) == []  # a fresh machine would take the missing replica for live
    rec2, _ = _recovery(("standby0",))
    assert rec2.join([2]) == []  # two replicas need two processes
    rec3, _ = _recovery()
    [view] = rec3.join([2])
    assert {j.node for j in view.joined} == {"standby0", "standby1"}


def test_a_host_makes_the_replicas_placed_on_it_and_tells_every_machine_of_the_join():
    builder = MachineBuilder(regrouping_dataflow(2), 3, capacity=4, batch_size=2)
    builder.dormant = frozenset({2})
    node = Host("node0", {a: builder.segment(a) for a in (Addr(1, 0, P), Addr(2, 0, P))},
                segment_factory=builder.standby_segment, joined_factory=builder.joined_segment)
    standby = Host("standby0", {}, segment_factory=builder.standby_segment,
                   joined_factory=builder.joined_segment)
    view = View(1, joined=(Joined(Addr(1, 2, P), 7, "standby0"),
                           Joined(Addr(2, 2, P), 7, "standby0")))
    node.on_view(view)
    standby.on_view(view)
    assert set(standby.machines) == {Addr(1, 2, P), Addr(2, 2, P)}
    feeds = node.machines[Addr(2, 0, P)].fcons.feeds
    assert feeds[2].data_source() == Addr(1, 2, P)
    assert node.machines[Addr(1, 0, P)].fprod.out.status(2, 0) is ACTIVE
    # a replica made here later (a catch-up's), built as the job started, is told the
    # join at once
    assert builder.standby_segment(Addr(2, 1, S)).fcons.feeds[2].dormant
    node.on_view(View(2, failed=frozenset({Addr(2, 1, S)}), failed_incs=frozenset({9})))
    node.on_view(View(3, avail=(Avail(Addr(2, 1, S), 5, 1, "node0", "node1"),)))
    fresh = node.machines[Addr(2, 1, S)]
    assert fresh.mode is AWAITING_STATE and not fresh.fcons.feeds[2].dormant
