"""Exact transitions of F-Cons (flux/protocol/flux_consumer.py; paper 5.1, 5.2, Figure 4 action 1).

Consumer partition 0 of stage 2 (replicas CP and CS) takes data from producer
partitions 0 and 1 of stage 1 (replicas A0P/A0S and A1P/A1S).
"""
from __future__ import annotations

import msgpack
import pytest

from flux.addresses import Addr, P, S
from flux.data_messages import Ack, Batch, Reverse
from flux.effects import Send
from flux.errors import RemoteProtocolError
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.ingress import INGRESS
from flux.protocol.producer import ACTIVE, DEAD
from flux.sequence import NO_PROGRESS, NO_SN
from items import inputs, rows

pytestmark = pytest.mark.timeout(60)


# -- views of the per-connection records, for assertions ---------------------------
def _rows(m):
    """Producer: links[i][d]; FluxConsumer: the two replicas of every feed."""
    return m.links if hasattr(m, "links") else [f.replicas for f in m.feeds]


def statuses(m):
    return [[x.status for x in row] for row in _rows(m)]


def data_from(c):
    return [f.data_from for f in c.feeds]


def ack_to(c):
    return [f.ack_to for f in c.feeds]


CP, CS = Addr(2, 0, P), Addr(2, 0, S)
A0P, A0S = Addr(1, 0, P), Addr(1, 0, S)
A1P, A1S = Addr(1, 1, P), Addr(1, 1, S)
PRODUCERS = [(A0P, A0S), (A1P, A1S)]


def make(addr=CP):
    return FluxConsumer(addr, PRODUCERS)


def sub(sn):
    """The sub-item ``sn = (x, p)``: producer partition p's part of item x, one row: the
    first output of input x (so no two producers send parts of one item here)."""
    return sn, rows(((sn[0], 1), f"t{sn}"))


def batch(*sns, bound):
    return Batch(tuple(sub(sn) for sn in sns), bound)


def queued(c, j):
    """What the merge holds from producer partition j: (connection SN, its rows)."""
    return [(sn, part.pairs()) for sn, part in c.merge.queues[j]]


def test_initial_state():
    c = make(CP)
    assert c.dual == CS
    assert data_from(c) == [P, P]
    assert ack_to(c) == [S, S]
    assert statuses(c) == [[ACTIVE, ACTIVE], [ACTIVE, ACTIVE]]
    assert c.p_fail is False
    assert c.idle()
    assert not c.can_release()
    cs = make(CS)
    assert cs.dual == CP
    assert data_from(cs) == [S, S]
    assert ack_to(cs) == [P, P]


# --- normal case (5.1) --------------------------------------------------------------

def test_every_non_empty_batch_is_acked_at_once_to_the_dual_producer():
    c = make(CP)
    assert c.on_batch(A0P, batch((1, 0), (2, 0), bound=(2,))) == [Send(CP, A0S, Ack((2, 0)))]
    assert c.on_batch(A1P, batch((3, 1), bound=(3,))) == [Send(CP, A1S, Ack((3, 1)))]
    assert c.on_batch(A0P, batch((4, 0), bound=(4,))) == [Send(CP, A0S, Ack((4, 0)))]
    assert queued(c, 0) == [((1, 0), [((1, 1), "t(1, 0)")]), ((2, 0), [((2, 1), "t(2, 0)")]),
                            ((4, 0), [((4, 1), "t(4, 0)")])]
    assert c.merge.last == {0: (4, 0), 1: (3, 1)}
    assert c.merge.bounds == {0: (4,), 1: (3,)}
    assert not c.idle()


def test_replica_s_takes_data_from_s_and_acks_to_p():
    c = make(CS)
    assert c.on_batch(A1S, batch((1, 1), bound=(1,))) == [Send(CS, A1P, Ack((1, 1)))]
    with pytest.raises(RemoteProtocolError):
        c.on_batch(A1P, batch((2, 1), bound=(2,)))


def test_bound_only_batches_are_not_acked():
    c = make(CP)
    assert c.on_batch(A0P, Batch((), (5,))) == []
    assert c.merge.bounds[0] == (5,)
    assert c.merge.last[0] == NO_SN
    c.on_batch(A0P, batch((6, 0), bound=(6,)))
    assert c.on_batch(A0P, Batch((), (7,))) == []
    assert c.merge.bounds[0] == (7,)


def test_data_from_a_replica_that_is_not_the_data_source_raises():
    c = make(CP)
    with pytest.raises(RemoteProtocolError):
        c.on_batch(A0S, batch((1, 0), bound=(1,)))
    with pytest.raises(RemoteProtocolError):
        c.on_batch(Addr(1, 7, P), batch((1, 7), bound=(1,)))
    assert c.merge.queued() == 0
    assert c.merge.bounds[0] == NO_PROGRESS


def test_duplicate_data_raises():
    c = make(CP)
    c.on_batch(A0P, batch((1, 0), bound=(1,)))
    with pytest.raises(RemoteProtocolError):
        c.on_batch(A0P, batch((1, 0), bound=(1,)))


# --- the merge: whole items, rows merged by row SN (4.1, DESIGN 11) ---------------------

def test_release_gives_items_in_sn_order_and_counts_each_part_toward_its_feeds_credit():
    c = make(CP)
    c.on_batch(A0P, batch((1, 0), (3, 0), bound=(3,)))
    assert not c.can_release()  # A1 may still send a part of item 1
    c.on_batch(A1P, batch((2, 1), bound=(3,)))
    released = []
    while c.can_release():
        x, part = c.release()
        released.append((x, part.pairs()))
    assert released == [((1,), [((1, 1), "t(1, 0)")]), ((2,), [((2, 1), "t(2, 1)")]),
                        ((3,), [((3, 1), "t(3, 0)")])]
    assert [(f.owed, f.taken) for f in c.feeds] == [(2, (3, 0)), (1, (2, 1))]
    assert c.idle()


def test_an_item_is_held_until_every_producer_proved_it_complete():
    c = make(CP)
    c.on_batch(A0P, batch((4, 0), bound=(4,)))
    c.on_batch(A1P, Batch((), (3,)))  # A1 may still send its part of item 4
    assert not c.can_release()
    c.on_batch(A1P, Batch((), (4, 0)))  # a bound inside item 4: (4, 1) may still come
    assert not c.can_release()
    c.on_batch(A1P, Batch((), (4,)))
    assert c.can_release()
    x, part = c.release()
    assert (x, part.pairs()) == ((4,), [((4, 1), "t(4, 0)")])
    assert [(f.owed, f.taken) for f in c.feeds] == [(1, (4, 0)), (0, NO_SN)]


def test_rows_of_one_input_split_across_producers_are_released_merged_by_row_sn():
    """A stage-3 consumer: input 3's outputs at stage 1, (3, 1) and (3, 2), went to both
    stage-2 partitions, and their outputs come back to one partition from both."""
    c3 = Addr(3, 0, P)
    b0, b1 = (Addr(2, 0, P), Addr(2, 0, S)), (Addr(2, 1, P), Addr(2, 1, S))
    c = FluxConsumer(c3, [b0, b1])
    part0 = rows(((3, 1, 1), "a"), ((3, 1, 2), "b"), ((5, 1, 1), "e"))
    part1 = rows(((3, 2, 1), "c"), ((4, 1, 1), "d"), ((5, 2, 1), "f"))
    assert c.on_batch(b1[P], Batch((((5, 1), part1),), (5,))) == [Send(c3, b1[S], Ack((5, 1)))]
    assert not c.can_release()  # item 5 is whole only with b0's part, or its bound
    c.on_batch(b0[P], Batch((((5, 0), part0),), (5,)))
    x, item = c.release()
    assert x == (5,)
    assert item.pairs() == [((3, 1, 1), "a"), ((3, 1, 2), "b"), ((3, 2, 1), "c"),
                            ((4, 1, 1), "d"), ((5, 1, 1), "e"), ((5, 2, 1), "f")]
    assert [(f.owed, f.taken) for f in c.feeds] == [(1, (5, 0)), (1, (5, 1))]
    assert not c.can_release() and c.idle()


def test_state_round_trip_through_msgpack():
    c = make(CP)
    c.on_batch(A0P, Batch((((2, 0), rows(((1, 1), "a"), ((2, 1), "b"))),
                           ((5, 0), rows(((5, 1), "e")))), (5,)))
    c.on_batch(A1P, Batch((((5, 1), rows(((4, 1), "d"))),), (4,)))
    state = msgpack.unpackb(msgpack.packb(c.get_state(), use_bin_type=True), raw=False)
    copy = make(CP)
    copy.install_state(state)
    held = [queued(c, 0), queued(c, 1)]
    assert held == [[((2, 0), [((1, 1), "a"), ((2, 1), "b")]), ((5, 0), [((5, 1), "e")])],
                    [((5, 1), [((4, 1), "d")])]]
    for consumer in (c, copy):
        assert [queued(consumer, 0), queued(consumer, 1)] == held
        assert consumer.merge.bounds == {0: (5,), 1: (4,)}
        assert consumer.merge.last == {0: (5, 0), 1: (5, 1)}
        assert consumer.frontier() == (2, -1)
        x, item = consumer.release()
        assert (x, item.pairs()) == ((2,), [((1, 1), "a"), ((2, 1), "b")])
        assert not consumer.can_release()  # A1's bound (4,) does not cover item 5
        consumer.merge.bound(1, (5,))
        x, item = consumer.release()
        assert (x, item.pairs()) == ((5,), [((4, 1), "d"), ((5, 1), "e")])
        assert consumer.idle()


# --- take-over (Figure 4 action 1, 5.2) -------------------------------------------------

def test_fail_of_the_data_source_reverses_to_the_survivor_once():
    c = make(CP)
    c.on_batch(A0P, batch((1, 0), (2, 0), bound=(2,)))
    assert c.on_fail({A0P}) == [Send(CP, A0S, Reverse((2, 0)))]
    assert statuses(c)[0] == [DEAD, ACTIVE]
    assert data_from(c) == [S, P]
    assert ack_to(c) == [None, S]
    # The same failure again (or another view) sends nothing more.
    assert c.on_fail({A0P}) == []
    # Data now comes from the survivor and is acked to nobody.
    assert c.on_batch(A0S, batch((3, 0), bound=(3,))) == []
    assert c.merge.last[0] == (3, 0)
    with pytest.raises(RemoteProtocolError):
        c.on_batch(A0P, batch((4, 0), bound=(4,)))
    # The other producer partition is unaffected.
    assert c.on_batch(A1P, batch((5, 1), bound=(5,))) == [Send(CP, A1S, Ack((5, 1)))]
    # What came from the dead replica and from the survivor is one stream, in SN order.
    released = []
    while c.can_release():
        released.append(c.release()[0])
    assert released == [(1,), (2,), (3,)]  # item 5 waits for A0S's bound


def test_reverse_carries_no_sn_when_nothing_was_received():
    c = make(CS)
    assert c.on_fail({A1S}) == [Send(CS, A1P, Reverse(NO_SN))]


def test_reverse_carries_the_last_sn_not_the_bound():
    c = make(CP)
    c.on_batch(A0P, batch((1, 0), bound=(1,)))
    c.on_batch(A0P, Batch((), (9,)))
    assert c.on_fail({A0P}) == [Send(CP, A0S, Reverse((1, 0)))]
    # The dead replica's bound is kept when the survivor's is lower.
    c.on_batch(A0S, Batch((), (4,)))
    assert c.merge.bounds[0] == (9,)


def test_fail_of_the_ack_target_just_stops_acking():
    c = make(CP)
    assert c.on_fail({A0S}) == []
    assert statuses(c)[0] == [ACTIVE, DEAD]
    assert data_from(c) == [P, P]
    assert ack_to(c) == [None, S]
    assert c.on_batch(A0P, batch((1, 0), bound=(1,))) == []
    assert c.merge.last[0] == (1, 0)
    assert c.on_batch(A1P, batch((2, 1), bound=(2,))) == [Send(CP, A1S, Ack((2, 1)))]


def test_fail_of_both_replicas_sends_nothing():
    c = make(CP)
    c.on_batch(A0P, batch((1, 0), bound=(1,)))
    assert c.on_fail({A0P, A0S}) == []
    assert statuses(c)[0] == [DEAD, DEAD]
    assert data_from(c)[0] is None and ack_to(c)[0] is None
    with pytest.raises(RemoteProtocolError):
        c.on_batch(A0S, batch((2, 0), bound=(2,)))
    cs = make(CS)
    assert cs.on_fail({A0P, A0S}) == []
    assert data_from(cs)[0] is None and ack_to(cs)[0] is None


def test_ack_target_then_data_source_dies_sends_nothing():
    c = make(CP)
    assert c.on_fail({A0S}) == []
    assert c.on_fail({A0P}) == []
    assert data_from(c)[0] is None


def test_survivor_of_a_reverse_dies_sends_nothing():
    c = make(CP)
    assert c.on_fail({A0P}) == [Send(CP, A0S, Reverse(NO_SN))]
    assert c.on_fail({A0S}) == []
    assert data_from(c)[0] is None and ack_to(c)[0] is None


def test_failures_of_several_partitions_in_one_view():
    c = make(CP)
    c.on_batch(A1P, batch((3, 1), bound=(3,)))
    assert c.on_fail({A0P, A1P}) == [
        Send(CP, A0S, Reverse(NO_SN)),
        Send(CP, A1S, Reverse((3, 1))),
    ]


def test_p_fail_when_the_consumers_own_dual_dies():
    c = make(CP)
    assert c.on_fail({Addr(2, 1, S)}) == []  # another partition's replica
    assert c.p_fail is False
    assert c.on_fail({CS}) == []
    assert c.p_fail is True
    assert data_from(c) == [P, P] and ack_to(c) == [S, S]


# --- stage 1: the ingress is both replicas of the only producer ------------------------------

def test_stage_one_consumer_acks_to_the_ingress():
    for addr in (Addr(1, 0, P), Addr(1, 0, S)):
        c = FluxConsumer(addr, [(INGRESS, INGRESS)])
        # items 1 (input 1) and 3 (inputs 2 and 3), sent as (x, 0)
        one, three = inputs(1, "a"), inputs(2, "b", "c")
        assert c.on_batch(INGRESS, Batch((((1, 0), one), ((3, 0), three)), (2,))) == [
            Send(addr, INGRESS, Ack((3, 0)))]
        assert c.can_release()
        x, item = c.release()
        assert x == (1,) and item.pairs() == one.pairs() == [((1,), "a")]
        assert not c.can_release()  # the bound (2,) does not cover item 3
        assert c.on_batch(INGRESS, Batch((), (5,))) == []
        x, item = c.release()
        assert x == (3,) and item.pairs() == three.pairs() == [((2,), "b"), ((3,), "c")]
        assert not c.can_release() and c.idle()
