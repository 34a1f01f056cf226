"""Exact transitions of the egress (flux/protocol/egress.py; paper 3.1.2, Figure 4 action 1, DESIGN 4.7)."""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P, S
from flux.data_messages import Ack, Batch, Credit, Reverse
from flux.effects import Deliver, Send
from flux.protocol.egress import Egress, egress_addr
from flux.errors import RemoteProtocolError
from flux.sequence import NO_SN


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


def b(*pairs, bound):
    return Batch(tuple(pairs), bound)


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
    # Partition 0 sends (1,1) and (3,1); partition 1 has said nothing yet.
    assert eg.on_message(L0P, b(((1, 1), "a"), ((3, 1), "c"), bound=(3,))) == [
        Send(EG, L0S, Ack((3, 1)))
    ]
    assert eg.delivered == 0
    assert not eg.idle()
    # Partition 1's (2,1) and bound (3,) release everything: ack first, then deliver,
    # then credit each data source with what was taken from it (back-pressure).
    assert eg.on_message(L1P, b(((2, 1), "b"), bound=(3,))) == [
        Send(EG, L1S, Ack((2, 1))),
        Deliver((((1, 1), "a"), ((2, 1), "b"), ((3, 1), "c"))),
        Send(EG, L0P, Credit((3, 1))),
        Send(EG, L1P, Credit((2, 1))),
    ]
    assert eg.delivered == 3
    assert eg.idle()


def test_holds_output_until_the_other_partitions_bound_covers_it():
    eg = Egress(1, 2)
    assert eg.on_message(L1P, b(((2, 1), "b"), bound=(2,))) == [Send(EG, L1S, Ack((2, 1)))]
    # A bound (1,) from partition 0 covers nothing at (2, 1).
    assert eg.on_message(L0P, Batch((), (1,))) == []
    # Bound (2,): no SN with prefix <= (2,) will come from partition 0.
    assert eg.on_message(L0P, Batch((), (2,))) == [Deliver((((2, 1), "b"),)),
                                                    Send(EG, L1P, Credit((2, 1)))]
    assert eg.on_message(L0P, Batch((), (3,))) == []
    assert eg.delivered == 1


def test_bound_only_batch_releases_earlier_output():
    eg = Egress(1, 2)
    eg.on_message(L0P, b(((1, 1), "a"), ((1, 2), "a2"), bound=(1,)))
    assert eg.on_message(L1P, Batch((), (1,))) == [Deliver((((1, 1), "a"), ((1, 2), "a2"))),
                                                    Send(EG, L0P, Credit((1, 2)))]
    assert eg.delivered == 2


def test_reverse_on_failure_of_a_p_replica():
    eg = Egress(1, 2)
    eg.on_message(L0P, b(((1, 1), "a"), bound=(1,)))
    eg.on_message(L1P, Batch((), (1,)))  # delivers (1,1)
    assert eg.on_fail({L0P}) == [Send(EG, L0S, Reverse((1, 1)))]
    assert data_from(eg.fcons) == [S, P] and ack_to(eg.fcons) == [None, S]
    # The survivor's data is delivered, and not acked.
    assert eg.on_message(L0S, b(((2, 1), "b"), bound=(2,))) == []
    # ... and credited to the survivor, its data source now
    assert eg.on_message(L1P, Batch((), (2,))) == [Deliver((((2, 1), "b"),)),
                                                    Send(EG, L0S, Credit((2, 1)))]
    with pytest.raises(RemoteProtocolError):
        eg.on_message(L0P, b(((3, 1), "c"), bound=(3,)))
    # Partition 1 still takes data from P and acks to S.
    assert eg.on_message(L1P, b(((4, 1), "d"), bound=(4,))) == [Send(EG, L1S, Ack((4, 1)))]
    assert eg.on_message(L0S, Batch((), (4,))) == [Deliver((((4, 1), "d"),)),
                                                    Send(EG, L1P, Credit((4, 1)))]
    assert eg.delivered == 3


def test_reverse_of_a_partition_that_sent_nothing():
    eg = Egress(2, 3)
    assert eg.on_fail({Addr(2, 2, P)}) == [Send(Addr(3, 0, P), Addr(2, 2, S), Reverse(NO_SN))]


def test_failure_of_an_s_replica_stops_acks_only():
    eg = Egress(1, 2)
    assert eg.on_fail({L1S}) == []
    eg.on_message(L0P, b(((1, 1), "a"), bound=(1,)))
    assert eg.on_message(L1P, b(((2, 1), "b"), bound=(2,))) == [Deliver((((1, 1), "a"),)),
                                                                 Send(EG, L0P, Credit((1, 1)))]


@pytest.mark.parametrize("msg", [Ack((1, 1)), Reverse((1, 1)), None])
def test_unexpected_message_raises(msg):
    eg = Egress(1, 2)
    with pytest.raises(RemoteProtocolError):
        eg.on_message(L0S, msg)


def test_data_from_an_s_replica_before_any_failure_raises():
    eg = Egress(1, 2)
    with pytest.raises(RemoteProtocolError):
        eg.on_message(L0S, b(((1, 1), "a"), bound=(1,)))


def test_absent_replicas_are_dead_from_the_start_and_acked_by_nobody():
    eg = Egress(1, 2, absent={L0S, L1S})
    assert ack_to(eg.fcons) == [None, None] and data_from(eg.fcons) == [P, P]
    assert eg.on_message(L0P, b(((1, 1), "a"), bound=(1,))) == []  # no ack to a ghost
    assert eg.on_fail({L0P}) == []  # no survivor to reverse to


def test_finished_once_the_bound_covers_the_last_input_and_nothing_is_queued():
    eg = Egress(1, 2)
    assert eg.finished(0)
    assert not eg.finished(1)
    eg.on_message(L0P, b(((1, 1), "a"), bound=(1,)))
    assert not eg.finished(1)  # partition 1 may still send something below (1,)
    eg.on_message(L1P, b(((2, 1), "b"), bound=(1,)))
    assert eg.delivered == 1
    assert not eg.finished(2)  # (2, 1) is queued: partition 0 said nothing about (2,)
    eg.on_message(L0P, Batch((), (2,)))
    assert eg.delivered == 2 and eg.finished(2)
    assert not eg.finished(3)


def test_settled_names_the_inputs_whose_outputs_were_all_delivered():
    """What lets the driver forget their arrival times (issue 12): inputs before the last
    one delivered, or with nothing queued, before the progress bound."""
    eg = Egress(1, 2)
    assert eg.settled() == 0
    eg.on_message(L0P, b(((1, 1), "a"), ((3, 1), "c"), bound=(3,)))
    assert eg.settled() == 0  # (1, 1) waits for partition 1's bound
    eg.on_message(L1P, b(((2, 1), "b"), bound=(3,)))
    assert eg.settled() == 2  # input 3 may still have outputs for all the bound (3,) says
    eg.on_message(L0P, b(bound=(10,)))
    assert eg.settled() == 2  # partition 1 may still send outputs of inputs 3..9
    eg.on_message(L1P, b(((7, 1), "d"), bound=(12,)))
    assert eg.settled() == 9  # (7, 1) delivered, nothing queued, both bounds past 9
