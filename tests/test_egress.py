"""Exact transitions of the egress (flux/protocol/egress.py; paper 3.1.2, Figure 4 action 1, DESIGN 4.7, 11).

The last stage's partition j sends its part of item x as one sub-item with the connection
SN ``(x, j)``; the egress delivers an item's rows only once the item is whole, merged by
row SN, and acks and credits by connection SN."""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P, S
from flux.data_messages import Ack, Batch, Credit, Reverse
from flux.effects import Deliver, Send
from flux.protocol.egress import Egress, egress_addr
from flux.errors import RemoteProtocolError
from flux.sequence import NO_SN
from items import rows

pytestmark = pytest.mark.timeout(60)


# -- views of the per-connection records, for assertions ---------------------------
def data_from(c):
    return [f.data_from for f in c.feeds]


def ack_to(c):
    return [f.ack_to for f in c.feeds]


def sources(c):
    return [tuple(x.addr for x in f.replicas) for f in c.feeds]


# A dataflow of one stage with two partitions: the egress is stage 2.
EG = Addr(2, 0, P)
L0P, L0S = Addr(1, 0, P), Addr(1, 0, S)
L1P, L1S = Addr(1, 1, P), Addr(1, 1, S)


def b(*subs, bound):
    """A batch of sub-items, each ``(connection SN, (row SN, record), ...)``."""
    return Batch(tuple((sub[0], rows(*sub[1:])) for sub in subs), bound)


def test_address_and_initial_state():
    eg = Egress(1, 2)
    assert egress_addr(1) == EG == eg.addr
    assert egress_addr(3) == Addr(4, 0, P)
    assert sources(eg.fcons) == [(L0P, L0S), (L1P, L1S)]
    assert data_from(eg.fcons) == [P, P] and ack_to(eg.fcons) == [S, S]
    assert eg.delivered == 0
    assert eg.idle()


def test_delivers_in_global_sn_order_across_partitions():
    eg = Egress(1, 2)
    # Partition 0 sends its parts of items 1 and 3; partition 1 has said nothing yet.
    assert eg.on_message(L0P, b(((1, 0), ((1, 1), "a")), ((3, 0), ((3, 1), "c")),
                                bound=(3,))) == [Send(EG, L0S, Ack((3, 0), None))]
    assert eg.delivered == 0
    assert not eg.idle()
    # Partition 1's part of item 2 and bound (3,) release everything: ack first, then
    # deliver, then credit each data source with what was taken from it (back-pressure).
    assert eg.on_message(L1P, b(((2, 1), ((2, 1), "b")), bound=(3,))) == [
        Send(EG, L1S, Ack((2, 1), None)),
        Deliver((((1, 1), "a"), ((2, 1), "b"), ((3, 1), "c"))),
        Send(EG, L0P, Credit((3, 0), None)),
        Send(EG, L1P, Credit((2, 1), None)),
    ]
    assert eg.delivered == 3
    assert eg.idle()


def test_delivers_an_item_only_whole_its_rows_merged_by_row_sn():
    """Two stages: input 3's outputs at stage 1 went to both stage-2 partitions, so the
    rows of item 4 (inputs 3 and 4) reach the egress from both, interleaved."""
    eg = Egress(2, 2, batch_rows=2)
    M0P, M0S, M1P, M1S = Addr(2, 0, P), Addr(2, 0, S), Addr(2, 1, P), Addr(2, 1, S)
    item4_0 = ((4, 0), ((3, 1, 1), "a"), ((4, 1, 1), "c"))
    item4_1 = ((4, 1), ((3, 2, 1), "b"), ((4, 2, 1), "d"))
    assert eg.on_message(M0P, b(item4_0, bound=(4,))) == [Send(eg.addr, M0S, Ack((4, 0), None))]
    # partition 1's bound (3,), then one inside item 4: its part may still come
    assert eg.on_message(M1P, b(bound=(3,))) == []
    assert eg.on_message(M1P, b(bound=(4, 0))) == []
    # items up to 3 are out, but input 3 is in item 4: only what lies a whole item back
    assert eg.delivered == 0 and eg.settled() == 1
    # its part, with no bound covering item 4: it might still send more of it
    assert eg.on_message(M1P, b(item4_1, bound=(4, 0))) == [Send(eg.addr, M1S, Ack((4, 1), None))]
    assert eg.delivered == 0 and eg.settled() == 1
    # a later item from partition 1 proves item 4 whole: its rows leave merged
    assert eg.on_message(M1P, b(((6, 1), ((6, 1, 1), "f")), bound=(5,))) == [
        Send(eg.addr, M1S, Ack((6, 1), None)),
        Deliver((((3, 1, 1), "a"), ((3, 2, 1), "b"), ((4, 1, 1), "c"), ((4, 2, 1), "d"))),
        Send(eg.addr, M0P, Credit((4, 0), None)),  # one credit per part taken, by connection SN
        Send(eg.addr, M1P, Credit((4, 1), None)),
    ]
    assert eg.delivered == 4 and eg.settled() == 4
    # item 6 is held until both partitions cover it, the one that sent it too
    assert eg.on_message(M0P, b(bound=(6,))) == []
    # items up to 5 are out, but item 6 may hold input 5: the last item released says more
    assert eg.delivered == 4 and eg.settled() == 4
    assert eg.on_message(M1P, b(bound=(6,))) == [Deliver((((6, 1, 1), "f"),)),
                                                  Send(eg.addr, M1P, Credit((6, 1), None))]
    assert eg.delivered == 5 and eg.settled() == 6 and eg.idle()


def test_holds_output_until_the_other_partitions_bound_covers_it():
    eg = Egress(1, 2)
    assert eg.on_message(L1P, b(((2, 1), ((2, 1), "b")), bound=(2,))) == [
        Send(EG, L1S, Ack((2, 1), None))]
    # A bound (1,) from partition 0 covers nothing of item 2.
    assert eg.on_message(L0P, Batch((), (1,))) == []
    # Bound (2,): no SN with prefix <= (2,) will come from partition 0.
    assert eg.on_message(L0P, Batch((), (2,))) == [Deliver((((2, 1), "b"),)),
                                                    Send(EG, L1P, Credit((2, 1), None))]
    assert eg.on_message(L0P, Batch((), (3,))) == []
    assert eg.delivered == 1


def test_bound_only_batch_releases_earlier_output():
    eg = Egress(1, 2)
    eg.on_message(L0P, b(((1, 0), ((1, 1), "a"), ((1, 2), "a2")), bound=(1,)))
    assert eg.on_message(L1P, Batch((), (1,))) == [Deliver((((1, 1), "a"), ((1, 2), "a2"))),
                                                    Send(EG, L0P, Credit((1, 0), None))]
    assert eg.delivered == 2


def test_reverse_on_failure_of_a_p_replica():
    eg = Egress(1, 2)
    eg.on_message(L0P, b(((1, 0), ((1, 1), "a")), bound=(1,)))
    eg.on_message(L1P, Batch((), (1,)))  # delivers item 1
    assert eg.on_fail({L0P}) == [Send(EG, L0S, Reverse((1, 0)))]
    assert data_from(eg.fcons) == [S, P] and ack_to(eg.fcons) == [None, S]
    # The survivor's data is delivered, and not acked.
    assert eg.on_message(L0S, b(((2, 0), ((2, 1), "b")), bound=(2,))) == []
    # ... and credited to the survivor, its data source now
    assert eg.on_message(L1P, Batch((), (2,))) == [Deliver((((2, 1), "b"),)),
                                                    Send(EG, L0S, Credit((2, 0), None))]
    with pytest.raises(RemoteProtocolError):
        eg.on_message(L0P, b(((3, 0), ((3, 1), "c")), bound=(3,)))
    # Partition 1 still takes data from P and acks to S.
    assert eg.on_message(L1P, b(((4, 1), ((4, 1), "d")), bound=(4,))) == [
        Send(EG, L1S, Ack((4, 1), None))]
    assert eg.on_message(L0S, Batch((), (4,))) == [Deliver((((4, 1), "d"),)),
                                                    Send(EG, L1P, Credit((4, 1), None))]
    assert eg.delivered == 3


def test_an_item_split_across_a_take_over_is_delivered_once_whole():
    """Partition 0's part of item 2 reached the egress from P before P died; the survivor
    S resends from after the reverse's SN, and the item leaves once, whole."""
    eg = Egress(1, 2)
    eg.on_message(L0P, b(((2, 0), ((1, 1), "a"), ((2, 1), "b")), bound=(2,)))
    assert eg.on_fail({L0P}) == [Send(EG, L0S, Reverse((2, 0)))]
    # the survivor resending what we hold is a broken protocol, not a second delivery
    with pytest.raises(RemoteProtocolError):
        eg.on_message(L0S, b(((2, 0), ((1, 1), "a"), ((2, 1), "b")), bound=(2,)))
    assert eg.on_message(L0S, b(((3, 0), ((3, 1), "c")), bound=(3,))) == []
    assert eg.delivered == 0  # partition 1 still may send its parts of items 2 and 3
    assert eg.on_message(L1P, b(((2, 1), ((2, 2), "b2")), bound=(3,))) == [
        Send(EG, L1S, Ack((2, 1), None)),
        Deliver((((1, 1), "a"), ((2, 1), "b"), ((2, 2), "b2"), ((3, 1), "c"))),
        Send(EG, L0S, Credit((3, 0), None)),
        Send(EG, L1P, Credit((2, 1), None)),
    ]
    assert eg.delivered == 4 and eg.idle()


def test_reverse_of_a_partition_that_sent_nothing():
    eg = Egress(2, 3)
    assert eg.on_fail({Addr(2, 2, P)}) == [Send(Addr(3, 0, P), Addr(2, 2, S), Reverse(NO_SN))]


def test_failure_of_an_s_replica_stops_acks_only():
    eg = Egress(1, 2)
    assert eg.on_fail({L1S}) == []
    assert eg.on_message(L0P, b(((1, 0), ((1, 1), "a")), bound=(1,))) == [
        Send(EG, L0S, Ack((1, 0), None))]
    assert eg.on_message(L1P, b(((2, 1), ((2, 1), "b")), bound=(2,))) == [
        Deliver((((1, 1), "a"),)), Send(EG, L0P, Credit((1, 0), None))]


@pytest.mark.parametrize("msg", [Ack((1, 0)), Reverse((1, 0)), None])
def test_unexpected_message_raises(msg):
    eg = Egress(1, 2)
    with pytest.raises(RemoteProtocolError):
        eg.on_message(L0S, msg)


def test_data_from_an_s_replica_before_any_failure_raises():
    eg = Egress(1, 2)
    with pytest.raises(RemoteProtocolError):
        eg.on_message(L0S, b(((1, 0), ((1, 1), "a")), bound=(1,)))


def test_absent_replicas_are_dead_from_the_start_and_acked_by_nobody():
    eg = Egress(1, 2, absent={L0S, L1S})
    assert ack_to(eg.fcons) == [None, None] and data_from(eg.fcons) == [P, P]
    assert eg.on_message(L0P, b(((1, 0), ((1, 1), "a")), bound=(1,))) == []  # no ack to a ghost
    assert eg.on_fail({L0P}) == []  # no survivor to reverse to


def test_finished_once_the_bound_covers_the_last_item_and_nothing_is_queued():
    eg = Egress(1, 2)
    assert eg.finished(0)
    assert not eg.finished(1)
    eg.on_message(L0P, b(((1, 0), ((1, 1), "a")), bound=(1,)))
    assert not eg.finished(1)  # partition 1 may still send its part of item 1
    eg.on_message(L1P, b(((2, 1), ((2, 1), "b")), bound=(2,)))
    assert eg.delivered == 1 and eg.finished(1)
    assert not eg.finished(2)  # (2, 1) is queued: partition 0 said nothing about item 2
    eg.on_message(L0P, Batch((), (2,)))
    assert eg.delivered == 2 and eg.finished(2)
    assert not eg.finished(3)


def test_settled_names_the_inputs_whose_outputs_were_all_delivered():
    """What lets the driver forget their arrival times: an item is numbered by
    its last input and delivered whole, so every input of an item the frontier covers
    whole (``item_bound``) had all its outputs delivered."""
    eg = Egress(1, 2, batch_rows=3)
    assert eg.settled() == 0
    # item 3: inputs 1..3
    eg.on_message(L0P, b(((3, 0), ((1, 1), "a"), ((3, 1), "c")), bound=(3,)))
    assert eg.settled() == 0  # item 3 waits for partition 1's bound
    eg.on_message(L1P, b(((3, 1), ((2, 1), "b")), bound=(3,)))
    assert eg.delivered == 3
    assert eg.settled() == 3  # both bounds cover item 3 whole
    eg.on_message(L0P, b(bound=(10,)))
    assert eg.settled() == 3  # partition 1 may still send parts of items 4..
    eg.on_message(L1P, b(((7, 1), ((5, 1), "d")), bound=(7,)))
    assert eg.settled() == 7  # item 7 delivered, nothing queued, both bounds past 7
    eg.on_message(L1P, b(((9, 1), ((9, 1), "e")), bound=(8,)))
    # item 9 is queued and partition 1 may send more of it: the frontier (9, 0) covers
    # items up to 8, but item 9 holds inputs 8 and 9 (items of at most 3 inputs: from 7
    # on, the frontier alone proves only inputs up to 8 - 3)
    assert eg.fcons.frontier() == (9, 0) and eg.delivered == 4
    assert eg.settled() == 7 and not eg.finished(9)
    eg.on_message(L1P, b(bound=(12,)))
    assert eg.delivered == 5 and eg.finished(9)
    assert eg.settled() == 9  # item 9 released; the bound (10,) proves inputs up to 7
    eg.on_message(L1P, b(bound=(15,)))
    eg.on_message(L0P, b(bound=(16,)))
    assert eg.settled() == 12  # no item since 9: the frontier (15,) proves up to 15 - 3


# -- a live move of the last stage with a sink per partition (docs/design/rescaling.md) --
def moving(k, n, *moves):
    """A batch stamp: checkpoint cut ``(k, n)`` carrying move cut ``k`` with ``moves``
    (each ``(stage, first, last, source, dest)``)."""
    return (k, n, ((k, n, tuple(list(m) for m in moves)),))


def one_partition(partition):
    """The egress of last-stage partition ``partition`` of a one-stage dataflow of 3."""
    return Egress(1, 3, partition=partition)


def delivered(effects):
    return [row[0][0] for e in effects if isinstance(e, Deliver) for row in e.items]


@pytest.mark.parametrize("partition", [0, 1])
def test_the_output_past_a_move_of_its_partitions_groups_waits_for_a_complete_checkpoint(
        partition):
    """Groups 0..40 go from partition 0 to 1 at cut 10: both partitions' egresses deliver
    nothing numbered past 10 until a complete checkpoint covers it, and say they crossed
    no move cut before it (their producers keep telling it: a writer started again
    learns it again)."""
    eg = one_partition(partition)
    src = Addr(1, partition, P)
    effects = eg.on_message(src, Batch((((8, partition), rows(((8, 1), "a"))),
                                        ((12, partition), rows(((12, 1), "b")))), (12,),
                                       cut=moving(2, 10, (1, 0, 40, 0, 1))))
    assert delivered(effects) == [8] and eg.holds == {2: 10}
    told = [e.msg.moves for e in effects if isinstance(e, Send)]
    assert told and max(told) == 1  # crossed 1 at most: 2 is held
    assert delivered(eg.checkpoint_complete(1, 6)) == []  # an older cut: still held
    assert delivered(eg.checkpoint_complete(2, 10)) == [12] and eg.holds == {}
    assert eg.fcons.moves_crossed == 2


def test_an_egress_the_move_does_not_touch_holds_nothing_and_a_covered_cut_neither():
    eg = one_partition(2)
    effects = eg.on_message(Addr(1, 2, P), Batch((((12, 2), rows(((12, 1), "b"))),), (12,),
                                                  cut=moving(2, 10, (1, 0, 40, 0, 1))))
    assert delivered(effects) == [12] and eg.holds == {}
    eg = one_partition(1)
    eg.checkpoint_complete(3, 11)  # made after a checkpoint past the move completed
    effects = eg.on_message(Addr(1, 1, P), Batch((((12, 1), rows(((12, 1), "b"))),), (12,),
                                                  cut=moving(2, 10, (1, 0, 40, 0, 1))))
    assert delivered(effects) == [12] and eg.holds == {}


def test_a_prepare_or_a_move_of_an_earlier_stage_holds_nothing():
    eg = Egress(2, 3, partition=1)
    effects = eg.on_message(Addr(2, 1, P), Batch((((12, 1), rows(((12, 1, 1), "b"))),),
                                                 (12,), cut=moving(2, 10, (1, 0, 40, 0, 1),
                                                                   (2, 0, 40, 2, 1, 1))))
    assert delivered(effects) == [12] and eg.holds == {}
