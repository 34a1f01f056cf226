"""Exact transitions of the ingress (flux/protocol/ingress.py; paper 3.1.2, 3.1.3, Figure 3,
Figure 4 action 3; DESIGN 11: inputs are cut into items, each sent as one sub-item per
stage-1 partition that gets rows, with the connection SN ``(item, 0)``)."""
from __future__ import annotations

import pytest

from exchange.partitioner import HashPartitioner
from flux.addresses import Addr, P, S
from flux.protocol.buffer import PRIM, SEC
from flux.data_messages import Ack, Batch, Reverse
from flux.effects import CutChosen, Send
from flux.errors import LocalProtocolError, OperatorError, RemoteProtocolError
from flux.protocol.ingress import INGRESS, Ingress
from flux.protocol.producer import ACK, ACTIVE, DEAD, NONE, SEND
from flux.sequence import NO_PROGRESS, covers
from items import by, pairs, plain


# -- views of the per-connection records, for assertions ---------------------------
def _rows(m):
    """Producer: links[i][d]; FluxConsumer: the two replicas of every feed."""
    return m.links if hasattr(m, "links") else [f.replicas for f in m.feeds]


def modes(prod):
    return [[link.modes for link in row] for row in prod.links]


def statuses(m):
    return [[x.status for x in row] for row in _rows(m)]


def entries(ing, i):
    """Partition i's buffer: (connection SN, the sub-item's pairs) per sub-item."""
    return plain(ing.out.buffers[i].entries())


def sub(*numbered):
    """A sub-item of the ingress as ``plain`` shows it: ``(n, record)`` per input n."""
    return tuple(((n,), record) for n, record in numbered)


P0, S0 = Addr(1, 0, P), Addr(1, 0, S)
P1, S1 = Addr(1, 1, P), Addr(1, 1, S)
P2, S2 = Addr(1, 2, P), Addr(1, 2, S)

# Records are (key, payload); the key names its partition directly.
ROUTE = {"k0": 0, "k1": 1, "k2": 2}


def route(record):
    return ROUTE[record[0]]


def make(capacity=8, batch_size=16, partitions=2, batch_rows=1024):
    return Ingress(partitions, by(route), capacity, batch_size, batch_rows=batch_rows)


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
    assert ing.accepted == 0 and ing.pending.records == [] and ing.last_item == 0
    assert ing.batch_rows == 1024
    assert not ing.can_cut() and ing.cut_item() == 0  # nothing pending: no item
    assert ing.frontier() == NO_PROGRESS
    assert ing.flushable() == []
    assert ing.idle()
    with pytest.raises(ValueError):
        make(batch_rows=0)


# --- accept (Figure 3 action 1) and items (DESIGN 11) -------------------------------

def test_accept_numbers_inputs_and_routes_by_key():
    ing = make()
    a, b, c = rec("k0", "a"), rec("k1", "b"), rec("k0", "c")
    assert ing.accept(a) == (1,)
    assert ing.accept(b) == (2,)
    assert ing.accept(c) == (3,)
    assert ing.accepted == 3 and ing.pending.records == [a, b, c]
    # no item yet: nothing buffered, nothing promised
    assert ing.frontier() == NO_PROGRESS
    assert all(len(buf) == 0 for buf in ing.out.buffers)
    assert ing.can_cut()
    assert ing.cut_item() == 3  # an item is numbered by its last input
    assert ing.pending.records == [] and ing.last_item == 3
    assert ing.frontier() == (3,)
    # one sub-item per partition, its rows routed by key, in input order, row SN (n,)
    assert entries(ing, 0) == [((3, 0), sub((1, a), (3, c)))]
    assert entries(ing, 1) == [((3, 0), sub((2, b)))]
    assert not ing.idle()


def test_accept_with_the_stable_hash_partitioner():
    part = HashPartitioner(4, key_groups=None)  # the known values of test_partitioner
    ing = Ingress(4, by(lambda r: part(r[0])), 8, 8)
    # Known values: "alice" -> 0, 1 -> 3, 3.5 -> 2 for 4 partitions.
    assert ing.accept(("alice", 1)) == (1,)
    assert ing.accept((1, 2)) == (2,)
    assert ing.accept((3.5, 3)) == (3,)
    assert ing.cut_item() == 3
    assert [entries(ing, i) for i in range(4)] == [
        [((3, 0), sub((1, ("alice", 1))))], [], [((3, 0), sub((3, (3.5, 3))))],
        [((3, 0), sub((2, (1, 2))))],
    ]


def test_an_item_is_cut_after_batch_rows_inputs_and_goes_only_where_it_has_rows():
    ing = make(partitions=3, batch_rows=3)
    x, y, z = rec("k0", "x"), rec("k2", "y"), rec("k0", "z")
    assert ing.accept(x) == (1,) and ing.accept(y) == (2,)
    assert ing.last_item == 0 and ing.pending.records == [x, y]
    assert ing.frontier() == NO_PROGRESS and ing.flushable() == []
    assert ing.accept(z) == (3,)  # the third input fills the item: it leaves at once
    assert ing.pending.records == [] and ing.last_item == 3 and ing.frontier() == (3,)
    # sub-items only for the partitions that got rows; partition 1 gets none
    assert [entries(ing, i) for i in range(3)] == [
        [((3, 0), sub((1, x), (3, z)))], [], [((3, 0), sub((2, y)))]]
    assert ing.flushable() == [(0, PRIM), (0, SEC), (1, PRIM), (1, SEC), (2, PRIM), (2, SEC)]
    # partition 1 learns only the bound: nothing of item 3 will come to it
    assert plain(ing.flush(1, PRIM)) == [Send(INGRESS, P1, Batch((), (3,)))]
    assert plain(ing.flush(1, SEC)) == [Send(INGRESS, S1, Batch((), (3,)))]
    for i, (p, s) in ((0, (P0, S0)), (2, (P2, S2))):
        want = Batch(tuple(entries(ing, i)), (3,))
        assert plain(ing.flush(i, PRIM)) == [Send(INGRESS, p, want)]
        assert plain(ing.flush(i, SEC)) == [Send(INGRESS, s, want)]
    assert ing.flushable() == []
    # the next input starts the next item and moves no bound
    assert ing.accept(rec("k1", "w")) == (4,)
    assert ing.pending.records == [rec("k1", "w")] and ing.frontier() == (3,) and ing.flushable() == []


def test_full_partition_buffer_refuses_and_numbers_nothing():
    ing = make(capacity=2, batch_rows=1)
    assert ing.accept(rec("k0", 1)) == (1,)
    assert ing.accept(rec("k0", 2)) == (2,)
    assert ing.out.buffers[0].full()  # two items of one input each
    before = entries(ing, 0)
    # the next input fills the pending item, which cannot leave
    assert ing.accept(rec("k0", 3)) == (3,)
    assert ing.pending.records == [rec("k0", 3)] and not ing.can_cut() and ing.cut_item() == 0
    # back-pressure: the item is full and cannot leave, whatever partition the next
    # input would go to; the refused input gets no number
    assert not ing.can_accept(rec("k1", 4))
    assert ing.accept(rec("k1", 4)) is None
    assert ing.accept(rec("k0", 4)) is None
    assert ing.accepted == 3
    assert ing.frontier() == (2,)
    assert entries(ing, 0) == before and entries(ing, 1) == []
    assert ing.pending.records == [rec("k0", 3)]  # held, not dropped


def test_refused_partition_accepts_again_once_both_replicas_acked():
    ing = make(capacity=2, batch_rows=1)
    for n in (1, 2, 3):  # items 1 and 2 fill partition 0's buffer; input 3 waits
        assert ing.accept(rec("k0", n)) == (n,)
    ing.flush(0, PRIM)
    ing.flush(0, SEC)
    ing.on_message(P0, Ack((1, 0)))
    assert ing.accept(rec("k0", 4)) is None  # S0 has not acked yet
    ing.on_message(S0, Ack((1, 0)))
    assert ing.accept(rec("k0", 4)) == (4,)
    # item 3 left first, with input 3; input 4 waits for the next room
    assert entries(ing, 0) == [((2, 0), sub((2, rec("k0", 2)))), ((3, 0), sub((3, rec("k0", 3))))]
    assert ing.pending.records == [rec("k0", 4)] and ing.last_item == 3


def test_a_full_buffer_stops_the_cut_then_the_source_and_loses_no_pending_input():
    ing = make(capacity=1, batch_rows=3)
    assert ing.accept_many([rec("k0", n) for n in (1, 2, 3)]) == 3
    assert ing.last_item == 3 and ing.out.buffers[0].full()
    more = [rec("k1", 4), rec("k0", 5), rec("k1", 6), rec("k0", 7)]
    assert ing.accept(more[0]) == (4,) and ing.accept(more[1]) == (5,)
    # partition 0's buffer has no room: no item can be cut (partition 1's has room)
    assert not ing.can_cut() and ing.cut_item() == 0
    assert ing.pending.records == more[:2] and ing.last_item == 3
    assert ing.accept(more[2]) == (6,)  # the item is full now, and cannot leave
    assert not ing.can_accept(more[3])
    assert ing.accept(more[3]) is None and ing.accept_many(more[3:]) == 0
    assert (ing.accepted, ing.last_item, ing.frontier()) == (6, 3, (3,))
    assert ing.pending.records == more[:3]
    # both replicas of partition 0 hold item 3: there is room, the item leaves whole
    for d, replica in ((PRIM, P0), (SEC, S0)):
        ing.flush(0, d)
        ing.on_message(replica, Ack((3, 0)))
    assert ing.can_accept(more[3])
    assert ing.accept(more[3]) == (7,)
    assert ing.last_item == 6 and ing.pending.records == [more[3]]
    assert entries(ing, 0) == [((6, 0), sub((5, more[1])))]
    assert entries(ing, 1) == [((6, 0), sub((4, more[0]), (6, more[2])))]
    # every input accepted while the buffer was full is in item 6, once
    got = sorted(pairs(ing.out.buffers[0].entries() + ing.out.buffers[1].entries()))
    assert got == [((4,), more[0]), ((5,), more[1]), ((6,), more[2])]


def test_choose_cut_cuts_the_pending_item_and_covers_every_accepted_input():
    ing = make(capacity=1)
    assert ing.accept_many([rec("k0", 1), rec("k1", 2)]) == 2
    assert ing.cut_item() == 2
    assert ing.accept_many([rec("k0", 3), rec("k0", 4), rec("k1", 5)]) == 3
    assert not ing.can_cut()  # both buffers hold item 2
    # checkpoint 1 covers the 5 accepted inputs: the pending ones are cut into item 5
    # even without room (the checkpoint's cut lies between two items)
    assert ing.choose_cut(1) == [CutChosen(1, 5)]
    assert ing.out.cut == (1, ing.accepted) == (1, 5)
    assert ing.pending.records == [] and ing.last_item == 5 and ing.frontier() == (5,)
    assert entries(ing, 0) == [((2, 0), sub((1, rec("k0", 1)))),
                               ((5, 0), sub((3, rec("k0", 3)), (4, rec("k0", 4))))]
    assert entries(ing, 1) == [((2, 0), sub((2, rec("k1", 2)))), ((5, 0), sub((5, rec("k1", 5))))]
    # the cut travels on every batch from here on
    assert plain(ing.flush(1, SEC)) == [Send(INGRESS, S1, Batch(tuple(entries(ing, 1)), (5,),
                                                                (1, 5)))]
    # nothing pending: the next checkpoint makes no item
    assert ing.choose_cut(2) == [CutChosen(2, 5)]
    assert ing.last_item == 5 and len(ing.out.buffers[0]) == 2
    with pytest.raises(LocalProtocolError):
        ing.choose_cut(2)  # checkpoint numbers increase


def test_the_input_log_holds_items_until_logged():
    ing = Ingress(2, by(route), 8, 16, log_inputs=True, batch_rows=2)
    inputs = [rec("k0", 1), rec("k1", 2), rec("k0", 3), rec("k0", 4), rec("k1", 5)]
    assert ing.accept_many(inputs) == 5  # items 2 and 4 cut; input 5 pending
    assert ing.last_item == 4 and ing.log_due()
    # nothing leaves before it is logged, and no bound covers a held item
    assert all(len(buf) == 0 for buf in ing.out.buffers)
    assert not covers(ing.frontier(), (2, 0))
    assert all(not send.msg.items for i, d in ing.flushable() for send in ing.flush(i, d))
    assert ing.inputs_logged(3) == []  # covers item 2, not item 4
    assert entries(ing, 0) == [((2, 0), sub((1, inputs[0])))]
    assert entries(ing, 1) == [((2, 0), sub((2, inputs[1])))]
    assert covers(ing.frontier(), (2, 0)) and not covers(ing.frontier(), (4, 0))
    assert ing.log_due()
    assert ing.inputs_logged(5) == []  # item 4, and input 5 ahead of its item
    assert entries(ing, 0)[-1] == ((4, 0), sub((3, inputs[2]), (4, inputs[3])))
    assert ing.frontier() == (4,) and not ing.log_due()
    # input 5 is logged already: its item leaves when it is cut
    assert ing.cut_item() == 5
    assert entries(ing, 1)[-1] == ((5, 0), sub((5, inputs[4])))
    assert ing.frontier() == (5,) and not ing.log_due()
    with pytest.raises(LocalProtocolError):
        ing.inputs_logged(6)  # more than was accepted
    with pytest.raises(LocalProtocolError):
        make().inputs_logged(1)  # no input log


def test_resume_after_numbers_on_from_the_checkpoint():
    ing = make(batch_rows=2)
    ing.resume_after(7)
    assert (ing.accepted, ing.last_item, ing.frontier()) == (7, 7, (7,))
    assert ing.accept(rec("k1", "a")) == (8,) and ing.accept(rec("k1", "b")) == (9,)
    assert entries(ing, 1) == [((9, 0), sub((8, rec("k1", "a")), (9, rec("k1", "b"))))]
    with pytest.raises(LocalProtocolError):
        ing.resume_after(9)  # only before any input


# --- flush (Figure 3 action 2) ------------------------------------------------------

def test_flush_sends_batches_to_both_replicas():
    ing = make(batch_rows=3)
    a, b, c = rec("k0", "a"), rec("k1", "b"), rec("k0", "c")
    for r in (a, b, c):
        ing.accept(r)
    assert ing.flushable() == [(0, PRIM), (0, SEC), (1, PRIM), (1, SEC)]
    to_0 = Batch((((3, 0), sub((1, a), (3, c))),), (3,))
    assert plain(ing.flush(0, PRIM)) == [Send(INGRESS, P0, to_0)]
    assert plain(ing.flush(0, SEC)) == [Send(INGRESS, S0, to_0)]
    # Partition 1 learns that every item up to (3,) was sent.
    to_1 = Batch((((3, 0), sub((2, b))),), (3,))
    assert plain(ing.flush(1, PRIM)) == [Send(INGRESS, P1, to_1)]
    assert plain(ing.flush(1, SEC)) == [Send(INGRESS, S1, to_1)]
    assert ing.flushable() == []
    assert ing.flush(0, PRIM) == []
    # Sending marks nothing on an ACK connection: the sub-items stay until acked.
    assert len(ing.out.buffers[0]) == 1 and len(ing.out.buffers[1]) == 1


def test_both_replicas_get_the_same_sub_items():
    ing = make(batch_rows=2, batch_size=2)
    for n in range(1, 10):
        ing.accept(rec(("k0", "k1")[n % 3 == 0], n))
    ing.cut_item()
    for i in (0, 1):
        got = {PRIM: [], SEC: []}
        for d in (PRIM, SEC):
            while (i, d) in ing.flushable():
                [send] = ing.flush(i, d)
                got[d].append(plain(send.msg))
        assert got[PRIM] == got[SEC] and got[PRIM]
        assert [x for batch in got[PRIM] for x in batch.items] == entries(ing, i)


def test_flush_respects_batch_size_and_bounds_by_first_unsent():
    ing = make(batch_size=2, batch_rows=2)
    for n in range(1, 7):  # items 2, 4 and 6, all to partition 0
        ing.accept(rec("k0", n))
    [first] = plain(ing.flush(0, PRIM))
    assert first == Send(INGRESS, P0, Batch(
        (((2, 0), sub((1, rec("k0", 1)), (2, rec("k0", 2)))),
         ((4, 0), sub((3, rec("k0", 3)), (4, rec("k0", 4))))), (6, -1)))
    # the bound lets item 6's sub-item (6, 0) still come
    assert not covers(first.msg.bound, (6, 0)) and covers(first.msg.bound, (5, 9))
    assert plain(ing.flush(0, PRIM)) == [Send(INGRESS, P0, Batch(
        (((6, 0), sub((5, rec("k0", 5)), (6, rec("k0", 6)))),), (6,)))]
    assert ing.flush(0, PRIM) == []


def test_idle_partition_gets_bound_only_batches():
    ing = make(batch_rows=2)
    ing.accept(rec("k0", 1))
    ing.accept(rec("k0", 2))
    assert plain(ing.flush(1, SEC)) == [Send(INGRESS, S1, Batch((), (2,)))]
    assert ing.flush(1, SEC) == []  # bound unchanged
    ing.accept(rec("k0", 3))
    assert (1, SEC) not in ing.flushable()  # a pending input moves no bound
    assert ing.cut_item() == 3
    assert (1, SEC) in ing.flushable()
    assert plain(ing.flush(1, SEC)) == [Send(INGRESS, S1, Batch((), (3,)))]


def test_bound_never_covers_an_unsent_tuple():
    ing = make(batch_size=1, batch_rows=1)
    ing.accept(rec("k1", 1))
    ing.accept(rec("k0", 2))
    ing.accept(rec("k1", 3))
    # Partition 1 still has (3, 0) unsent after this batch: bound before((3, 0)).
    [send] = plain(ing.flush(1, PRIM))
    assert send == Send(INGRESS, P1, Batch((((1, 0), sub((1, rec("k1", 1)))),), (3, -1)))
    assert not covers(send.msg.bound, (3, 0))
    assert plain(ing.flush(1, PRIM)) == [
        Send(INGRESS, P1, Batch((((3, 0), sub((3, rec("k1", 3)))),), (3,)))]


# --- acks (Figure 3 action 3) -------------------------------------------------------

def test_acks_from_both_replicas_evict():
    ing = make(batch_rows=1)
    for n in range(1, 4):
        ing.accept(rec("k0", n))
    ing.flush(0, PRIM)
    ing.flush(0, SEC)
    buf = ing.out.buffers[0]
    assert ing.on_message(P0, Ack((3, 0))) == []
    assert len(buf) == 3  # SEC has not acked
    assert buf.hwm == [(3, 0), ()]
    assert ing.on_message(S0, Ack((2, 0))) == []
    assert entries(ing, 0) == [((3, 0), sub((3, rec("k0", 3))))]
    assert ing.on_message(S0, Ack((3, 0))) == []
    assert buf.entries() == []
    assert ing.idle()


def test_cumulative_acks_never_move_back():
    ing = make(batch_rows=1)
    for n in range(1, 3):
        ing.accept(rec("k0", n))
    ing.flush(0, PRIM)
    ing.on_message(P0, Ack((2, 0)))
    ing.on_message(P0, Ack((1, 0)))
    assert ing.out.buffers[0].hwm[PRIM] == (2, 0)


# --- fail (Figure 4 action 3) -------------------------------------------------------

def test_fail_of_one_replica_acks_all_and_drops_it_from_delete():
    ing = make(batch_rows=1)
    for n in range(1, 4):
        ing.accept(rec("k0", n))
    ing.accept(rec("k1", 4))
    ing.flush(0, PRIM)
    ing.on_message(P0, Ack((1, 0)))
    buf = ing.out.buffers[0]
    assert ing.on_fail({S0}) == []
    assert statuses(ing.out)[0] == [ACTIVE, DEAD]
    assert modes(ing.out)[0][SEC] == NONE
    assert buf.delete == {PRIM}
    assert buf.hwm[SEC] == (3, 0)  # ack_all: everything put is treated as held
    # (1, 0) was acked by P0 and is now evicted at once.
    assert entries(ing, 0) == [((2, 0), sub((2, rec("k0", 2)))), ((3, 0), sub((3, rec("k0", 3))))]
    # Partition 1 is untouched.
    assert statuses(ing.out)[1] == [ACTIVE, ACTIVE]
    assert ing.out.buffers[1].delete == {PRIM, SEC}
    # Acks of the survivor alone now evict.
    assert ing.on_message(P0, Ack((3, 0))) == []
    assert buf.entries() == []
    # Later items go to the survivor only and are evicted by its ack alone.
    assert ing.accept(rec("k0", 5)) == (5,)
    assert (0, SEC) not in ing.flushable()
    assert ing.flush(0, SEC) == []
    assert plain(ing.flush(0, PRIM)) == [
        Send(INGRESS, P0, Batch((((5, 0), sub((5, rec("k0", 5)))),), (5,)))]
    ing.on_message(P0, Ack((5, 0)))
    assert buf.entries() == []


def test_fail_of_primary_replica_keeps_secondary_going():
    ing = make(batch_rows=1)
    ing.accept(rec("k0", 1))
    ing.accept(rec("k0", 2))
    ing.flush(0, SEC)
    assert ing.on_fail({P0}) == []
    buf = ing.out.buffers[0]
    assert buf.delete == {SEC}
    assert statuses(ing.out)[0] == [DEAD, ACTIVE]
    assert len(buf) == 2
    ing.on_message(S0, Ack((2, 0)))
    assert buf.entries() == []


def test_fail_is_applied_once():
    ing = make(batch_rows=1)
    ing.accept(rec("k0", 1))
    ing.on_fail({S0})
    ing.accept(rec("k0", 2))
    ing.on_fail({S0})  # guard not(status = DEAD): no second ack_all
    assert ing.out.buffers[0].hwm[SEC] == (1, 0)


def test_ack_from_a_dead_replica_is_a_protocol_error():
    ing = make(batch_rows=1)
    ing.accept(rec("k0", 1))
    ing.on_fail({S0})
    with pytest.raises(RemoteProtocolError):
        ing.on_message(S0, Ack((1, 0)))


# --- unexpected messages -----------------------------------------------------------

@pytest.mark.parametrize("msg", [Batch((), (1,)), Reverse((1,)), "hello"])
def test_unexpected_message_raises(msg):
    ing = make()
    with pytest.raises(RemoteProtocolError):
        ing.on_message(P0, msg)


def test_ack_from_unknown_endpoint_raises():
    ing = make()
    with pytest.raises(RemoteProtocolError):
        ing.on_message(Addr(2, 0, P), Ack((1, 0)))


def test_absent_replicas_are_dead_from_the_start():
    ing = Ingress(2, by(route), 8, 16, absent={S0}, batch_rows=1)
    assert statuses(ing.out) == [[ACTIVE, DEAD], [ACTIVE, ACTIVE]]
    assert modes(ing.out)[0] == [SEND | ACK, NONE]
    assert ing.out.buffers[0].delete == {PRIM}
    ing.accept(rec("k0", 1))
    assert len(ing.out.buffers[0]) == 1
    assert (0, PRIM) in ing.flushable() and (0, SEC) not in ing.flushable()


# --- a run of inputs in one call -----------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_accept_many_is_accept_one_by_one_until_back_pressure(seed):
    import random

    rng = random.Random(seed)
    records = [rec(rng.choice(("k0", "k1")), n) for n in range(40)]
    batch_rows = rng.randint(1, 5)
    one = make(capacity=rng.randint(1, 12), batch_rows=batch_rows)
    many = make(capacity=one.capacity, batch_rows=batch_rows)
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
        if rng.random() < 0.3:  # the driver cuts what is pending now and then
            assert many.cut_item() == one.cut_item()
    assert many.accepted == one.accepted and many.frontier() == one.frontier()
    assert many.pending.records == one.pending.records
    assert [entries(many, i) for i in (0, 1)] == [entries(one, i) for i in (0, 1)]
    # nothing lost: every accepted input is pending or in exactly one item
    for ing in (one, many):
        got = sorted(pairs(ing.out.buffers[0].entries() + ing.out.buffers[1].entries()))
        got += [((ing.accepted - len(ing.pending) + k + 1,), r) for k, r in enumerate(ing.pending.records)]
        assert got == [((k + 1,), r) for k, r in enumerate(records[:ing.accepted])]


def test_a_key_that_raises_names_its_input_and_nothing_of_its_item_leaves():
    """Stage 1's key is applied when an item is cut, a run at a time; the error names
    the input it raised on, and no sub-item of that item is buffered."""
    ing = make(capacity=8)
    assert ing.accept_many([rec("k0", 1), rec("k1", 2)]) == 2
    assert ing.cut_item() == 2
    assert ing.accept_many([rec("k0", 3), rec("nope", 4), rec("k0", 5)]) == 3
    with pytest.raises(OperatorError, match=r"the partition key of the next stage failed in "
                                            r"stage 0, partition 0, on the record with sequence "
                                            r"number \(4,\): KeyError: 'nope'"):
        ing.cut_item()
    assert entries(ing, 0) == [((2, 0), sub((1, rec("k0", 1))))]
    assert entries(ing, 1) == [((2, 0), sub((2, rec("k1", 2))))]


def test_accept_many_blames_the_key_only_for_what_the_key_raised():
    ing = make(capacity=8, batch_rows=1)

    def broken_put(i, sn, record):
        raise LocalProtocolError("a buffer bug")

    ing.out.put = broken_put
    with pytest.raises(LocalProtocolError, match="a buffer bug"):
        ing.accept_many([rec("k0", 1)])


# --- does stage 1 keep up? (when the runtime lets items and batches go, DESIGN 11) ----

def test_stage_1_keeps_up_once_it_took_every_sub_item_sent_on_an_open_connection():
    """``all_taken``: the runtime cuts an item not full only then, so items grow while
    stage 1 is busy; ``keeps_up(i, d)``: a batch to such a consumer need not wait. A
    consumer that paused (a catch-up) holds back no other partition's items."""
    from flux.data_messages import Credit, Pause

    ing = make(partitions=2, batch_rows=1)
    assert ing.all_taken() and ing.keeps_up(0, PRIM)  # nothing sent yet
    ing.accept(rec("k0", "x"))
    ing.accept(rec("k1", "y"))
    for i in (0, 1):
        for d in (PRIM, SEC):
            ing.flush(i, d)
    assert not ing.all_taken() and not ing.keeps_up(0, PRIM)
    ing.on_message(P0, Credit((1, 0)))
    assert ing.keeps_up(0, PRIM) and not ing.keeps_up(0, SEC) and not ing.all_taken()
    ing.on_message(S0, Credit((1, 0)))
    ing.on_message(P1, Credit((2, 0)))
    assert not ing.all_taken()  # S1 holds item 2 untaken
    ing.on_message(S1, Pause(1))  # S1 pauses its data sources (a catch-up, 5.3.1)
    assert ing.all_taken()
