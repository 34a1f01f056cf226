"""Exact transitions of F-Cons (flux/protocol/flux_consumer.py; paper 5.1, 5.2, Figure 4 action 1).

Consumer partition 0 of stage 2 (replicas CP and CS) takes data from producer
partitions 0 and 1 of stage 1 (replicas A0P/A0S and A1P/A1S).
"""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P, S
from flux.data_messages import Ack, Batch, Reverse
from flux.effects import Send
from flux.errors import RemoteProtocolError
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.ingress import INGRESS
from flux.protocol.producer import ACTIVE, DEAD
from flux.sequence import NO_PROGRESS, NO_SN


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


def batch(*sns, bound):
    return Batch(tuple((sn, f"t{sn}") for sn in sns), bound)


def test_initial_state():
    c = make(CP)
    assert c.dual == CS
    assert data_from(c) == [P, P]
    assert ack_to(c) == [S, S]
    assert statuses(c) == [[ACTIVE, ACTIVE], [ACTIVE, ACTIVE]]
    assert c.p_fail is False
    assert c.idle()
    cs = make(CS)
    assert cs.dual == CP
    assert data_from(cs) == [S, S]
    assert ack_to(cs) == [P, P]


# --- normal case (5.1) --------------------------------------------------------------

def test_every_non_empty_batch_is_acked_at_once_to_the_dual_producer():
    c = make(CP)
    assert c.on_batch(A0P, batch((1, 1), (2, 1), bound=(2,))) == [Send(CP, A0S, Ack((2, 1)))]
    assert c.on_batch(A1P, batch((3, 1), bound=(3,))) == [Send(CP, A1S, Ack((3, 1)))]
    assert c.on_batch(A0P, batch((4, 1), bound=(4,))) == [Send(CP, A0S, Ack((4, 1)))]
    assert list(c.merge.queues[0]) == [((1, 1), "t(1, 1)"), ((2, 1), "t(2, 1)"), ((4, 1), "t(4, 1)")]
    assert c.merge.last == {0: (4, 1), 1: (3, 1)}
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
    c.on_batch(A0P, batch((6, 1), bound=(6,)))
    assert c.on_batch(A0P, Batch((), (7,))) == []
    assert c.merge.bounds[0] == (7,)


def test_data_from_a_replica_that_is_not_the_data_source_raises():
    c = make(CP)
    with pytest.raises(RemoteProtocolError):
        c.on_batch(A0S, batch((1, 1), bound=(1,)))
    with pytest.raises(RemoteProtocolError):
        c.on_batch(Addr(1, 7, P), batch((1, 1), bound=(1,)))
    assert c.merge.queued() == 0
    assert c.merge.bounds[0] == NO_PROGRESS


def test_duplicate_data_raises():
    c = make(CP)
    c.on_batch(A0P, batch((1, 1), bound=(1,)))
    with pytest.raises(RemoteProtocolError):
        c.on_batch(A0P, batch((1, 1), bound=(1,)))


# --- take-over (Figure 4 action 1, 5.2) -------------------------------------------------

def test_fail_of_the_data_source_reverses_to_the_survivor_once():
    c = make(CP)
    c.on_batch(A0P, batch((1, 1), (2, 1), bound=(2,)))
    assert c.on_fail({A0P}) == [Send(CP, A0S, Reverse((2, 1)))]
    assert statuses(c)[0] == [DEAD, ACTIVE]
    assert data_from(c) == [S, P]
    assert ack_to(c) == [None, S]
    # The same failure again (or another view) sends nothing more.
    assert c.on_fail({A0P}) == []
    # Data now comes from the survivor and is acked to nobody.
    assert c.on_batch(A0S, batch((3, 1), bound=(3,))) == []
    assert c.merge.last[0] == (3, 1)
    with pytest.raises(RemoteProtocolError):
        c.on_batch(A0P, batch((4, 1), bound=(4,)))
    # The other producer partition is unaffected.
    assert c.on_batch(A1P, batch((5, 1), bound=(5,))) == [Send(CP, A1S, Ack((5, 1)))]


def test_reverse_carries_no_sn_when_nothing_was_received():
    c = make(CS)
    assert c.on_fail({A1S}) == [Send(CS, A1P, Reverse(NO_SN))]


def test_reverse_carries_the_last_sn_not_the_bound():
    c = make(CP)
    c.on_batch(A0P, batch((1, 1), bound=(1,)))
    c.on_batch(A0P, Batch((), (9,)))
    assert c.on_fail({A0P}) == [Send(CP, A0S, Reverse((1, 1)))]
    # The dead replica's bound is kept when the survivor's is lower.
    c.on_batch(A0S, Batch((), (4,)))
    assert c.merge.bounds[0] == (9,)


def test_fail_of_the_ack_target_just_stops_acking():
    c = make(CP)
    assert c.on_fail({A0S}) == []
    assert statuses(c)[0] == [ACTIVE, DEAD]
    assert data_from(c) == [P, P]
    assert ack_to(c) == [None, S]
    assert c.on_batch(A0P, batch((1, 1), bound=(1,))) == []
    assert c.merge.last[0] == (1, 1)
    assert c.on_batch(A1P, batch((2, 1), bound=(2,))) == [Send(CP, A1S, Ack((2, 1)))]


def test_fail_of_both_replicas_sends_nothing():
    c = make(CP)
    c.on_batch(A0P, batch((1, 1), bound=(1,)))
    assert c.on_fail({A0P, A0S}) == []
    assert statuses(c)[0] == [DEAD, DEAD]
    assert data_from(c)[0] is None and ack_to(c)[0] is None
    with pytest.raises(RemoteProtocolError):
        c.on_batch(A0S, batch((2, 1), bound=(2,)))
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
        assert c.on_batch(INGRESS, batch((1,), (3,), bound=(4,))) == [Send(addr, INGRESS, Ack((3,)))]
        assert c.on_batch(INGRESS, Batch((), (5,))) == []
        assert c.merge.pop_ready() == [((1,), "t(1,)"), ((3,), "t(3,)")]
