"""Exact transitions of F-Prod (flux/protocol/flux_producer.py; paper 5.1, 5.2, 3.1.2, Figure 3, Figure 4).

Producer partition 0 of stage 1, replicas PP and PS; consumer partitions 0
and 1 of stage 2, replicas C0P/C0S and C1P/C1S. For replica r, the primary
consumers are the replicas r, the secondary consumers the replicas 1-r.
"""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P, S
from flux.protocol.buffer import PRIM, PROD, SEC
from flux.control_messages import TakeoverDone
from flux.data_messages import Ack, Batch, Reverse
from flux.effects import Send
from flux.errors import RemoteProtocolError
from flux.protocol.flux_producer import FluxProducer
from flux.protocol.producer import ACK, ACTIVE, DEAD, NONE, SEND


# -- views of the per-connection records, for assertions ---------------------------
def _rows(m):
    """Producer: links[i][d]; FluxConsumer: the two replicas of every feed."""
    return m.links if hasattr(m, "links") else [f.replicas for f in m.feeds]


def modes(prod):
    return [[link.modes for link in row] for row in prod.links]


def statuses(m):
    return [[x.status for x in row] for row in _rows(m)]


PP, PS = Addr(1, 0, P), Addr(1, 0, S)
C0P, C0S = Addr(2, 0, P), Addr(2, 0, S)
C1P, C1S = Addr(2, 1, P), Addr(2, 1, S)
CONSUMERS = [(C0P, C0S), (C1P, C1S)]


def make(addr=PP, capacity=8, batch_size=16):
    return FluxProducer(addr, CONSUMERS, capacity, batch_size)


def put_all(fp, i, *pairs):
    for sn, x in pairs:
        fp.out.put(i, sn, x)


# --- normal case (5.1) ----------------------------------------------------------

def test_initial_state_of_replica_p():
    fp = make(PP)
    assert fp.dual == PS
    assert fp.out.peers == [(C0P, C0S), (C1P, C1S)]
    assert modes(fp.out) == [[SEND, ACK], [SEND, ACK]]
    assert statuses(fp.out) == [[ACTIVE, ACTIVE], [ACTIVE, ACTIVE]]
    assert [b.delete for b in fp.out.buffers] == [{PRIM, SEC}, {PRIM, SEC}]
    assert fp.p_fail is False and fp.r_done == [False, False]
    assert not fp.takeover_done()


def test_initial_state_of_replica_s_swaps_primary_and_secondary():
    fs = make(PS)
    assert fs.dual == PP
    assert fs.out.peers == [(C0S, C0P), (C1S, C1P)]
    assert modes(fs.out) == [[SEND, ACK], [SEND, ACK]]


def test_replica_p_sends_to_consumer_replicas_p_only():
    fp = make(PP)
    fp.out.put(0, (1, 1), "a")
    fp.out.put(1, (2, 1), "b")
    assert fp.out.flushable((2,)) == [(0, PRIM), (1, PRIM)]
    assert fp.out.flush(0, SEC, (2,)) is None
    assert fp.out.flush(0, PRIM, (2,)) == Send(PP, C0P, Batch((((1, 1), "a"),), (2,)))
    assert fp.out.flush(1, PRIM, (2,)) == Send(PP, C1P, Batch((((2, 1), "b"),), (2,)))
    assert fp.out.flushable((2,)) == []
    # An advancing frontier is announced to the primaries only.
    assert fp.out.flushable((3,)) == [(0, PRIM), (1, PRIM)]
    assert fp.out.flush(1, PRIM, (3,)) == Send(PP, C1P, Batch((), (3,)))


def test_replica_s_sends_to_consumer_replicas_s_only():
    fs = make(PS)
    fs.out.put(0, (1, 1), "a")
    assert fs.out.flushable((1,)) == [(0, PRIM), (1, PRIM)]
    assert fs.out.flush(0, PRIM, (1,)) == Send(PS, C0S, Batch((((1, 1), "a"),), (1,)))
    assert fs.out.flush(1, PRIM, (1,)) == Send(PS, C1S, Batch((), (1,)))
    assert fs.out.flush(0, SEC, (1,)) is None


def test_bound_is_before_the_first_unsent_tuple():
    fp = make(PP, batch_size=1)
    put_all(fp, 0, ((1, 1), "a"), ((1, 2), "b"))
    assert fp.out.flush(0, PRIM, (1,)) == Send(PP, C0P, Batch((((1, 1), "a"),), (1, 1)))
    assert fp.out.flush(0, PRIM, (1,)) == Send(PP, C0P, Batch((((1, 2), "b"),), (1,)))


def test_acks_are_taken_from_secondary_consumers_only():
    fp = make(PP)
    fp.out.put(0, (1, 1), "a")
    with pytest.raises(RemoteProtocolError):
        fp.out.on_ack(C0P, Ack((1, 1)))
    fp.out.on_ack(C0S, Ack((1, 1)))
    assert fp.out.buffers[0].hwm[SEC] == (1, 1)
    fs = make(PS)
    with pytest.raises(RemoteProtocolError):
        fs.out.on_ack(C0S, Ack((1, 1)))
    fs.out.on_ack(C0P, Ack((1, 1)))
    assert fs.out.buffers[0].hwm[SEC] == (1, 1)


def test_eviction_needs_sent_to_prim_and_acked_by_sec_send_first():
    fp = make(PP)
    put_all(fp, 0, ((1, 1), "a"), ((2, 1), "b"))
    buf = fp.out.buffers[0]
    fp.out.flush(0, PRIM, (2,))
    assert buf.marks((1, 1)) == {PROD, PRIM}
    assert len(buf) == 2  # sent but not acked
    fp.out.on_ack(C0S, Ack((1, 1)))
    assert buf.entries() == [((2, 1), "b")]
    fp.out.on_ack(C0S, Ack((2, 1)))
    assert buf.entries() == []
    assert fp.out.idle()


def test_eviction_needs_sent_to_prim_and_acked_by_sec_ack_first():
    fp = make(PP)
    put_all(fp, 0, ((1, 1), "a"), ((2, 1), "b"))
    buf = fp.out.buffers[0]
    fp.out.on_ack(C0S, Ack((3, 1)))  # dangling beyond what was put
    assert buf.marks((1, 1)) == {PROD, SEC}
    assert buf.dangling(SEC)
    assert len(buf) == 2  # acked but not sent
    fp.out.flush(0, PRIM, (3,))
    assert buf.entries() == []
    fp.out.put(0, (3, 1), "c")  # produced after its ack: evicted once sent
    assert buf.entries() == [((3, 1), "c")]


def test_full_reflects_any_destination_buffer():
    fp = make(PP, capacity=2)
    put_all(fp, 1, ((1, 1), "a"), ((2, 1), "b"))
    assert fp.out.full()
    fp.out.flush(1, PRIM, (2,))
    fp.out.on_ack(C1S, Ack((1, 1)))
    assert not fp.out.full()


# --- take-over (5.2) -----------------------------------------------------------------

def test_reverse_from_secondary_sends_after_its_hwm():
    fp = make(PP)
    put_all(fp, 0, ((1, 1), "a"), ((2, 1), "b"), ((3, 1), "c"))
    fp.out.flush(0, PRIM, (3,))
    fp.out.on_ack(C0S, Ack((1, 1)))
    buf = fp.out.buffers[0]
    assert buf.entries() == [((2, 1), "b"), ((3, 1), "c")]
    assert fp.on_fail({PS}) == []
    assert fp.p_fail is True
    assert fp.on_reverse(C0S, Reverse((2, 1))) == []  # consumer 1 not reversed yet
    assert modes(fp.out)[0] == [SEND, SEND]
    assert fp.r_done == [True, False]
    assert buf.delete == {PRIM, SEC}
    assert buf.hwm[SEC] == (2, 1)
    assert buf.entries() == [((3, 1), "c")]
    assert fp.out.flushable((3,)) == [(0, SEC), (1, PRIM)]  # 1: bound (3,) never announced
    assert fp.out.flush(0, SEC, (3,)) == Send(PP, C0S, Batch((((3, 1), "c"),), (3,)))
    assert buf.entries() == []  # sent to both, no ACK on either connection
    # From now on, new tuples go to both consumer replicas.
    fp.out.put(0, (4, 1), "d")
    assert fp.out.flushable((4,)) == [(0, PRIM), (0, SEC), (1, PRIM)]
    assert fp.out.flush(0, SEC, (4,)) == Send(PP, C0S, Batch((((4, 1), "d"),), (4,)))
    assert buf.entries() == [((4, 1), "d")]  # not yet sent to PRIM
    assert fp.out.flush(0, PRIM, (4,)) == Send(PP, C0P, Batch((((4, 1), "d"),), (4,)))
    assert buf.entries() == []


def test_reverse_then_sends_are_exact_per_destination():
    fp = make(PP)
    put_all(fp, 0, ((1, 1), "a"), ((2, 1), "b"))
    fp.out.flush(0, PRIM, (2,))
    fp.on_fail({PS})
    fp.on_reverse(C0S, Reverse((1, 1)))
    fp.out.put(0, (3, 1), "c")
    assert fp.out.flush(0, PRIM, (3,)) == Send(PP, C0P, Batch((((3, 1), "c"),), (3,)))
    assert fp.out.flush(0, SEC, (3,)) == Send(
        PP, C0S, Batch((((2, 1), "b"), ((3, 1), "c")), (3,))
    )
    assert fp.out.buffers[0].entries() == []


def test_reverse_with_dangling_hwm_filters_tuples_produced_later():
    fp = make(PP)
    put_all(fp, 0, ((1, 1), "a"), ((3, 1), "c"))
    fp.out.flush(0, PRIM, (3,))
    fp.on_fail({PS})
    # The secondary consumer already holds everything up to (5, 1) from PS.
    fp.on_reverse(C0S, Reverse((5, 1)))
    buf = fp.out.buffers[0]
    assert buf.entries() == []
    fp.out.put(0, (4, 1), "d")  # SEC holds it: never sent there
    fp.out.put(0, (6, 1), "f")
    assert buf.marks((4, 1)) == {PROD, SEC}
    assert fp.out.flush(0, SEC, (6,)) == Send(PP, C0S, Batch((((6, 1), "f"),), (6,)))
    assert fp.out.flush(0, SEC, (6,)) is None
    assert fp.out.flush(0, PRIM, (6,)) == Send(
        PP, C0P, Batch((((4, 1), "d"), ((6, 1), "f")), (6,))
    )
    assert buf.entries() == []


def test_bound_toward_sec_skips_filtered_tuples():
    fp = make(PP)
    fp.on_fail({PS})
    fp.on_reverse(C0S, Reverse((2, 1)))
    put_all(fp, 0, ((1, 1), "a"), ((2, 1), "b"), ((3, 1), "c"))
    assert fp.out.flush(0, SEC, (3,)) == Send(PP, C0S, Batch((((3, 1), "c"),), (3,)))


def test_after_reverse_the_current_bound_is_announced():
    fp = make(PP)
    fp.on_fail({PS})
    fp.on_reverse(C0S, Reverse(()))
    assert (0, SEC) in fp.out.flushable((2,))
    assert fp.out.flush(0, SEC, (2,)) == Send(PP, C0S, Batch((), (2,)))


def test_reverse_from_primary_consumer_raises():
    fp = make(PP)
    fp.on_fail({PS})
    with pytest.raises(RemoteProtocolError):
        fp.on_reverse(C0P, Reverse(()))
    assert modes(fp.out)[0] == [SEND, ACK]
    assert fp.r_done == [False, False]


def test_second_reverse_on_the_same_connection_raises():
    fp = make(PP)
    fp.on_fail({PS})
    fp.on_reverse(C0S, Reverse(()))
    with pytest.raises(RemoteProtocolError):
        fp.on_reverse(C0S, Reverse(()))


def test_reverse_from_unknown_endpoint_raises():
    fp = make(PP)
    with pytest.raises(RemoteProtocolError):
        fp.on_reverse(Addr(3, 0, P), Reverse(()))


def test_fail_of_primary_consumer():
    fp = make(PP)
    put_all(fp, 0, ((1, 1), "a"), ((2, 1), "b"), ((3, 1), "c"))
    fp.out.flush(0, PRIM, (3,))
    fp.out.on_ack(C0S, Ack((1, 1)))
    assert fp.on_fail({C0P}) == []
    buf = fp.out.buffers[0]
    assert statuses(fp.out)[0] == [DEAD, ACTIVE]
    assert modes(fp.out)[0] == [NONE, ACK]
    assert buf.delete == {SEC}
    assert buf.hwm[PRIM] == (3, 1)
    assert buf.entries() == [((2, 1), "b"), ((3, 1), "c")]
    assert fp.p_fail is False
    # Nothing is sent any more for partition 0; SEC's acks alone evict.
    fp.out.put(0, (4, 1), "d")
    assert fp.out.flushable((4,)) == [(1, PRIM)]
    assert fp.out.flush(0, PRIM, (4,)) is None
    fp.out.on_ack(C0S, Ack((4, 1)))
    assert buf.entries() == []
    with pytest.raises(RemoteProtocolError):
        fp.out.on_ack(C0P, Ack((4, 1)))
    # Partition 1 is untouched.
    assert statuses(fp.out)[1] == [ACTIVE, ACTIVE]
    assert fp.out.buffers[1].delete == {PRIM, SEC}


def test_fail_of_primary_consumer_before_send_waits_for_sec_only():
    fp = make(PP)
    fp.out.put(0, (1, 1), "a")
    fp.on_fail({C0P})
    assert fp.out.buffers[0].entries() == [((1, 1), "a")]
    fp.out.on_ack(C0S, Ack((1, 1)))
    assert fp.out.buffers[0].entries() == []


def test_fail_of_secondary_consumer_drops_its_dangling_acks():
    fp = make(PP)
    put_all(fp, 0, ((1, 1), "a"), ((2, 1), "b"))
    fp.out.on_ack(C0S, Ack((5, 1)))
    fp.out.flush(0, PRIM, (2,))
    buf = fp.out.buffers[0]
    assert buf.entries() == []
    assert fp.on_fail({C0S}) == []
    assert buf.hwm[SEC] == (2, 1)  # ack_all assigns: the dangling (5, 1) is gone
    assert buf.delete == {PRIM}
    assert modes(fp.out)[0] == [SEND, NONE]
    fp.out.put(0, (3, 1), "c")
    assert buf.marks((3, 1)) == {PROD}
    assert fp.out.flush(0, PRIM, (3,)) == Send(PP, C0P, Batch((((3, 1), "c"),), (3,)))
    assert buf.entries() == []


def test_reverse_after_primary_consumer_died_sends_to_sec_only():
    # F-Cons^P and F-Prod^S fail: F-Prod^P feeds only the secondary consumer.
    fp = make(PP)
    put_all(fp, 0, ((1, 1), "a"), ((2, 1), "b"))
    fp.out.flush(0, PRIM, (2,))
    assert fp.on_fail({C0P, PS}) == []
    fp.on_reverse(C0S, Reverse((1, 1)))
    buf = fp.out.buffers[0]
    assert buf.delete == {SEC}
    assert fp.out.flushable((2,)) == [(0, SEC), (1, PRIM)]
    assert fp.out.flush(0, SEC, (2,)) == Send(PP, C0S, Batch((((2, 1), "b"),), (2,)))
    assert buf.entries() == []


# --- take-over done (DESIGN 4.5) -------------------------------------------------------

def test_takeover_done_after_the_last_reverse_exactly_once():
    fp = make(PP)
    assert fp.on_fail({PS}) == []
    assert fp.on_reverse(C0S, Reverse(())) == []
    assert not fp.takeover_done()
    assert fp.on_reverse(C1S, Reverse(())) == [TakeoverDone(PP)]
    assert fp.takeover_done()
    assert fp.on_fail({C0P}) == []
    assert fp.on_fail({C1P}) == []


def test_takeover_done_when_dual_and_all_secondaries_die_together():
    fp = make(PP)
    assert fp.on_fail({PS, C0S, C1S}) == [TakeoverDone(PP)]
    assert fp.on_fail({C0P}) == []


def test_takeover_done_mixing_dead_and_reversed_secondaries():
    fp = make(PP)
    assert fp.on_fail({PS}) == []
    assert fp.on_fail({C1S}) == []
    assert fp.on_reverse(C0S, Reverse(())) == [TakeoverDone(PP)]


def test_takeover_done_waits_for_the_dual_to_die():
    fp = make(PS)
    assert fp.on_fail({C0P}) == []
    assert fp.on_reverse(C1P, Reverse(())) == []  # r_done, but p_fail is False
    assert fp.r_done == [False, True]
    assert not fp.takeover_done()
    assert fp.on_fail({Addr(1, 1, P)}) == []  # another partition's replica
    assert fp.p_fail is False
    assert fp.on_fail({PP}) == [TakeoverDone(PS)]


def test_no_takeover_when_only_consumers_die():
    fp = make(PP)
    assert fp.on_fail({C0S, C1S}) == []
    assert not fp.takeover_done()
    assert fp.p_fail is False


def test_dead_primaries_do_not_complete_takeover():
    fp = make(PP)
    assert fp.on_fail({PS, C0P, C1P}) == []
    assert not fp.takeover_done()


# --- last stage toward the egress (S-Prod of 3.1.2) ---------------------------------------

EG, GHOST = Addr(3, 0, P), Addr(3, 0, S)
LP, LS = Addr(2, 0, P), Addr(2, 0, S)


def last_stage(addr):
    return FluxProducer(addr, [(EG, GHOST)], 8, 16, absent={GHOST})


def test_last_stage_replica_p_evicts_after_send():
    lp = last_stage(LP)
    assert lp.out.peers == [(EG, GHOST)]
    assert statuses(lp.out) == [[ACTIVE, DEAD]]
    assert modes(lp.out) == [[SEND, NONE]]
    assert lp.out.buffers[0].delete == {PRIM}
    lp.out.put(0, (1, 1, 1), "x")
    lp.out.put(0, (2, 1, 1), "y")
    assert lp.out.flushable((2, 1)) == [(0, PRIM)]
    assert lp.out.flush(0, PRIM, (2, 1)) == Send(
        LP, EG, Batch((((1, 1, 1), "x"), ((2, 1, 1), "y")), (2, 1))
    )
    assert lp.out.buffers[0].entries() == []
    assert lp.out.flushable((2, 1)) == []
    with pytest.raises(RemoteProtocolError):
        lp.out.on_ack(EG, Ack((2, 1, 1)))
    # Its dual dies: the egress's replica S never existed, so take-over is done.
    assert lp.on_fail({LS}) == [TakeoverDone(LP)]


def test_last_stage_replica_s_evicts_after_the_egress_ack():
    ls = last_stage(LS)
    assert ls.out.peers == [(GHOST, EG)]
    assert statuses(ls.out) == [[DEAD, ACTIVE]]
    assert modes(ls.out) == [[NONE, ACK]]
    buf = ls.out.buffers[0]
    assert buf.delete == {SEC}
    ls.out.put(0, (1, 1, 1), "x")
    assert ls.out.flushable((1, 1)) == []
    assert buf.entries() == [((1, 1, 1), "x")]
    ls.out.on_ack(EG, Ack((1, 1, 1)))
    assert buf.entries() == []
    ls.out.on_ack(EG, Ack((3, 1, 1)))  # dangling
    ls.out.put(0, (2, 1, 1), "y")
    ls.out.put(0, (3, 1, 1), "z")
    assert buf.entries() == []
    ls.out.put(0, (4, 1, 1), "w")
    assert buf.entries() == [((4, 1, 1), "w")]


def test_last_stage_replica_s_sends_after_a_reverse():
    ls = last_stage(LS)
    put_all(ls, 0, ((1, 1, 1), "x"), ((2, 1, 1), "y"), ((3, 1, 1), "z"))
    ls.out.on_ack(EG, Ack((1, 1, 1)))
    assert ls.on_fail({LP}) == []  # waits for the egress's reverse
    assert ls.on_reverse(EG, Reverse((2, 1, 1))) == [TakeoverDone(LS)]
    assert modes(ls.out) == [[NONE, SEND]]
    assert ls.out.buffers[0].delete == {SEC}
    assert ls.out.flushable((3, 1)) == [(0, SEC)]
    assert ls.out.flush(0, SEC, (3, 1)) == Send(LS, EG, Batch((((3, 1, 1), "z"),), (3, 1)))
    assert ls.out.buffers[0].entries() == []
    ls.out.put(0, (4, 1, 1), "w")
    assert ls.out.flush(0, SEC, (4, 1)) == Send(LS, EG, Batch((((4, 1, 1), "w"),), (4, 1)))
    assert ls.out.buffers[0].entries() == []
