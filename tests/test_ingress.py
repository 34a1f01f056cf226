"""Exact transitions of the ingress (flux/protocol/ingress.py; paper 3.1.2, 3.1.3, Figure 3, Figure 4 action 3)."""
from __future__ import annotations

import pytest

from exchange.partitioner import HashPartitioner
from flux.addresses import Addr, P, S
from flux.protocol.buffer import PRIM, SEC
from flux.data_messages import Ack, Batch, Reverse
from flux.effects import Send
from flux.errors import LocalProtocolError, OperatorError, RemoteProtocolError
from flux.protocol.ingress import INGRESS, Ingress
from flux.protocol.producer import ACK, ACTIVE, DEAD, NONE, SEND
from flux.sequence import NO_PROGRESS


# -- views of the per-connection records, for assertions ---------------------------
def _rows(m):
    """Producer: links[i][d]; FluxConsumer: the two replicas of every feed."""
    return m.links if hasattr(m, "links") else [f.replicas for f in m.feeds]


def modes(prod):
    return [[link.modes for link in row] for row in prod.links]


def statuses(m):
    return [[x.status for x in row] for row in _rows(m)]


P0, S0 = Addr(1, 0, P), Addr(1, 0, S)
P1, S1 = Addr(1, 1, P), Addr(1, 1, S)

# Records are (key, payload); the key names its partition directly.
ROUTE = {"k0": 0, "k1": 1}


def route(record):
    return ROUTE[record[0]]


def make(capacity=8, batch_size=16, partitions=2):
    return Ingress(partitions, route, capacity, batch_size)


def rec(key, n):
    return (key, n)


# --- construction ----------------------------------------------------------------

def test_initial_state():
    ing = make()
    assert ing.addr == INGRESS == Addr(0, 0, P)
    assert ing.out.peers == [(P0, S0), (P1, S1)]
    assert modes(ing.out) == [[SEND | ACK, SEND | ACK], [SEND | ACK, SEND | ACK]]
    assert statuses(ing.out) == [[ACTIVE, ACTIVE], [ACTIVE, ACTIVE]]
    assert all(b.delete == {PRIM, SEC} for b in ing.out.buffers)
    assert ing.accepted == 0
    assert ing.frontier() == NO_PROGRESS
    assert ing.flushable() == []
    assert ing.idle()


# --- accept (Figure 3 action 1) ----------------------------------------------------

def test_accept_numbers_inputs_and_routes_by_key():
    ing = make()
    a, b, c = rec("k0", "a"), rec("k1", "b"), rec("k0", "c")
    assert ing.accept(a) == (1,)
    assert ing.accept(b) == (2,)
    assert ing.accept(c) == (3,)
    assert ing.accepted == 3
    assert ing.frontier() == (3,)
    assert ing.out.buffers[0].entries() == [((1,), a), ((3,), c)]
    assert ing.out.buffers[1].entries() == [((2,), b)]
    assert not ing.idle()


def test_accept_with_the_stable_hash_partitioner():
    part = HashPartitioner(4)
    ing = Ingress(4, lambda r: part(r[0]), 8, 8)
    # Known values: "alice" -> 0, 1 -> 3, 3.5 -> 2 for 4 partitions.
    assert ing.accept(("alice", 1)) == (1,)
    assert ing.accept((1, 2)) == (2,)
    assert ing.accept((3.5, 3)) == (3,)
    assert [b.entries() for b in ing.out.buffers] == [
        [((1,), ("alice", 1))], [], [((3,), (3.5, 3))], [((2,), (1, 2))],
    ]


def test_full_partition_buffer_refuses_and_numbers_nothing():
    ing = make(capacity=2)
    assert ing.accept(rec("k0", 1)) == (1,)
    assert ing.accept(rec("k0", 2)) == (2,)
    before = ing.out.buffers[0].entries()
    assert not ing.can_accept(rec("k0", 3))
    assert ing.accept(rec("k0", 3)) is None
    assert ing.accepted == 2
    assert ing.frontier() == (2,)
    assert ing.out.buffers[0].entries() == before
    # The other partition's buffer is independent and the next SN is (3,).
    assert ing.can_accept(rec("k1", 4))
    assert ing.accept(rec("k1", 4)) == (3,)
    assert ing.out.buffers[1].entries() == [((3,), rec("k1", 4))]


def test_refused_partition_accepts_again_once_both_replicas_acked():
    ing = make(capacity=2)
    ing.accept(rec("k0", 1))
    ing.accept(rec("k0", 2))
    ing.flush(0, PRIM)
    ing.flush(0, SEC)
    ing.on_message(P0, Ack((1,)))
    assert ing.accept(rec("k0", 3)) is None  # S0 has not acked yet
    ing.on_message(S0, Ack((1,)))
    assert ing.accept(rec("k0", 3)) == (3,)


# --- flush (Figure 3 action 2) ------------------------------------------------------

def test_flush_sends_batches_to_both_replicas():
    ing = make()
    a, b, c = rec("k0", "a"), rec("k1", "b"), rec("k0", "c")
    for r in (a, b, c):
        ing.accept(r)
    assert ing.flushable() == [(0, PRIM), (0, SEC), (1, PRIM), (1, SEC)]
    assert ing.flush(0, PRIM) == [Send(INGRESS, P0, Batch((((1,), a), ((3,), c)), (3,)))]
    assert ing.flush(0, SEC) == [Send(INGRESS, S0, Batch((((1,), a), ((3,), c)), (3,)))]
    # Partition 1 learns that every input up to (3,) was sent.
    assert ing.flush(1, PRIM) == [Send(INGRESS, P1, Batch((((2,), b),), (3,)))]
    assert ing.flush(1, SEC) == [Send(INGRESS, S1, Batch((((2,), b),), (3,)))]
    assert ing.flushable() == []
    assert ing.flush(0, PRIM) == []
    # Sending marks nothing on an ACK connection: the tuples stay until acked.
    assert len(ing.out.buffers[0]) == 2 and len(ing.out.buffers[1]) == 1


def test_flush_respects_batch_size_and_bounds_by_first_unsent():
    ing = make(batch_size=2)
    for n in range(1, 4):
        ing.accept(rec("k0", n))
    assert ing.flush(0, PRIM) == [
        Send(INGRESS, P0, Batch((((1,), rec("k0", 1)), ((2,), rec("k0", 2))), (2,)))
    ]
    assert ing.flush(0, PRIM) == [Send(INGRESS, P0, Batch((((3,), rec("k0", 3)),), (3,)))]
    assert ing.flush(0, PRIM) == []


def test_idle_partition_gets_bound_only_batches():
    ing = make()
    ing.accept(rec("k0", 1))
    ing.accept(rec("k0", 2))
    assert ing.flush(1, SEC) == [Send(INGRESS, S1, Batch((), (2,)))]
    assert ing.flush(1, SEC) == []  # bound unchanged
    ing.accept(rec("k0", 3))
    assert (1, SEC) in ing.flushable()
    assert ing.flush(1, SEC) == [Send(INGRESS, S1, Batch((), (3,)))]


def test_bound_never_covers_an_unsent_tuple():
    ing = make(batch_size=1)
    ing.accept(rec("k1", 1))
    ing.accept(rec("k0", 2))
    ing.accept(rec("k1", 3))
    # Partition 1 still has (3,) unsent after this batch: bound before((3,)).
    assert ing.flush(1, PRIM) == [Send(INGRESS, P1, Batch((((1,), rec("k1", 1)),), (2,)))]
    assert ing.flush(1, PRIM) == [Send(INGRESS, P1, Batch((((3,), rec("k1", 3)),), (3,)))]


# --- acks (Figure 3 action 3) -------------------------------------------------------

def test_acks_from_both_replicas_evict():
    ing = make()
    for n in range(1, 4):
        ing.accept(rec("k0", n))
    ing.flush(0, PRIM)
    ing.flush(0, SEC)
    buf = ing.out.buffers[0]
    assert ing.on_message(P0, Ack((3,))) == []
    assert len(buf) == 3  # SEC has not acked
    assert buf.hwm == [(3,), ()]
    assert ing.on_message(S0, Ack((2,))) == []
    assert buf.entries() == [((3,), rec("k0", 3))]
    assert ing.on_message(S0, Ack((3,))) == []
    assert buf.entries() == []
    assert ing.idle()


def test_cumulative_acks_never_move_back():
    ing = make()
    for n in range(1, 3):
        ing.accept(rec("k0", n))
    ing.flush(0, PRIM)
    ing.on_message(P0, Ack((2,)))
    ing.on_message(P0, Ack((1,)))
    assert ing.out.buffers[0].hwm[PRIM] == (2,)


# --- fail (Figure 4 action 3) -------------------------------------------------------

def test_fail_of_one_replica_acks_all_and_drops_it_from_delete():
    ing = make()
    for n in range(1, 4):
        ing.accept(rec("k0", n))
    ing.accept(rec("k1", 4))
    ing.flush(0, PRIM)
    ing.on_message(P0, Ack((1,)))
    buf = ing.out.buffers[0]
    assert ing.on_fail({S0}) == []
    assert statuses(ing.out)[0] == [ACTIVE, DEAD]
    assert modes(ing.out)[0][SEC] == NONE
    assert buf.delete == {PRIM}
    assert buf.hwm[SEC] == (3,)  # ack_all: everything put is treated as held
    # (1,) was acked by P0 and is now evicted at once.
    assert buf.entries() == [((2,), rec("k0", 2)), ((3,), rec("k0", 3))]
    # Partition 1 is untouched.
    assert statuses(ing.out)[1] == [ACTIVE, ACTIVE]
    assert ing.out.buffers[1].delete == {PRIM, SEC}
    # Acks of the survivor alone now evict.
    assert ing.on_message(P0, Ack((3,))) == []
    assert buf.entries() == []
    # Later inputs go to the survivor only and are evicted by its ack alone.
    assert ing.accept(rec("k0", 5)) == (5,)
    assert (0, SEC) not in ing.flushable()
    assert ing.flush(0, SEC) == []
    assert ing.flush(0, PRIM) == [Send(INGRESS, P0, Batch((((5,), rec("k0", 5)),), (5,)))]
    ing.on_message(P0, Ack((5,)))
    assert buf.entries() == []


def test_fail_of_primary_replica_keeps_secondary_going():
    ing = make()
    ing.accept(rec("k0", 1))
    ing.accept(rec("k0", 2))
    ing.flush(0, SEC)
    assert ing.on_fail({P0}) == []
    buf = ing.out.buffers[0]
    assert buf.delete == {SEC}
    assert statuses(ing.out)[0] == [DEAD, ACTIVE]
    ing.on_message(S0, Ack((2,)))
    assert buf.entries() == []


def test_fail_is_applied_once():
    ing = make()
    ing.accept(rec("k0", 1))
    ing.on_fail({S0})
    ing.accept(rec("k0", 2))
    ing.on_fail({S0})  # guard not(status = DEAD): no second ack_all
    assert ing.out.buffers[0].hwm[SEC] == (1,)


def test_ack_from_a_dead_replica_is_a_protocol_error():
    ing = make()
    ing.accept(rec("k0", 1))
    ing.on_fail({S0})
    with pytest.raises(RemoteProtocolError):
        ing.on_message(S0, Ack((1,)))


# --- unexpected messages -----------------------------------------------------------

@pytest.mark.parametrize("msg", [Batch((), (1,)), Reverse((1,)), "hello"])
def test_unexpected_message_raises(msg):
    ing = make()
    with pytest.raises(RemoteProtocolError):
        ing.on_message(P0, msg)


def test_ack_from_unknown_endpoint_raises():
    ing = make()
    with pytest.raises(RemoteProtocolError):
        ing.on_message(Addr(2, 0, P), Ack((1,)))


def test_absent_replicas_are_dead_from_the_start():
    ing = Ingress(2, route, 8, 16, absent={S0})
    assert statuses(ing.out) == [[ACTIVE, DEAD], [ACTIVE, ACTIVE]]
    assert modes(ing.out)[0] == [SEND | ACK, NONE]
    assert ing.out.buffers[0].delete == {PRIM}
    ing.accept(rec("k0", 1))
    assert (0, PRIM) in ing.flushable() and (0, SEC) not in ing.flushable()


# --- a run of inputs in one call (issue 16) -----------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_accept_many_is_accept_one_by_one_until_back_pressure(seed):
    import random

    rng = random.Random(seed)
    records = [rec(rng.choice(("k0", "k1")), n) for n in range(40)]
    one = make(capacity=rng.randint(1, 12))
    many = make(capacity=one.capacity)
    taken = 0
    while taken < len(records):
        size = rng.randint(1, 9)
        run = records[taken:taken + size]
        n = many.accept_many(run)
        for r in run[:n]:
            assert one.accept(r) is not None
        if n < len(run):
            assert one.accept(run[n]) is None  # the same input meets back-pressure
            break
        taken += n
    assert many.accepted == one.accepted and many.frontier() == one.frontier()
    assert [b.entries() for b in many.out.buffers] == [b.entries() for b in one.out.buffers]


def test_accept_many_keeps_what_went_before_a_key_that_raises():
    ing = make(capacity=8)
    with pytest.raises(OperatorError, match=r"the partition key of the next stage failed in "
                                            r"stage 0, partition 0, on the record with sequence "
                                            r"number \(3,\): KeyError: 'nope'"):
        ing.accept_many([rec("k0", 1), rec("k1", 2), rec("nope", 3), rec("k0", 4)])
    assert ing.accepted == 2
    assert ing.accept(rec("k0", 5)) == (3,)
    with pytest.raises(OperatorError, match=r"sequence number \(4,\): KeyError"):
        ing.accept(rec("nope", 6))
    assert ing.accepted == 3


def test_accept_many_blames_the_key_only_for_what_the_key_raised():
    ing = make(capacity=8)

    def broken_put(i, sn, record):
        raise LocalProtocolError("a buffer bug")

    ing.out.put = broken_put
    with pytest.raises(LocalProtocolError, match="a buffer bug"):
        ing.accept_many([rec("k0", 1)])
