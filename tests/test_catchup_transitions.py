"""Exact effects of the catch-up transitions (paper 3.3, 3.4, 5.3, Figure 5; DESIGN 4.6;
docs/design/catchup.md): producers, F-Prod, F-Cons, segments and hosts.

Names: stage 1 producer partitions 0 and 1 (A0P/A0S, A1P/A1S); stage 2 consumer
partitions 0 and 1 (C0P/C0S, C1P/C1S); for segments, a middle stage 2 segment
M (replica P) and its dual MX (replica S), fed by stage 1 and feeding stage 3
(D0P/D0S, D1P/D1S).

Tuples are sub-items (DESIGN 11): a producer of partition p sends the rows it made of
item x under the connection SN ``(x, p)``; their payload is a ``Rows``.
"""
from __future__ import annotations

import copy

import msgpack
import pytest

from exchange.rows import Rows
from flux.addresses import Addr, MoverAddr, P, S
from flux.protocol.buffer import PRIM, SEC
from flux.control_messages import Avail, FoldedIn, TakeoverDone, View
from flux.data_messages import (Ack, Batch, Credit, CSync, Pause, PauseAck, PSync, Restore,
                                Restored, Reverse, Stay)
from flux.effects import Send, SourcesPaused, SourcesResumed
from flux.envelope import Envelope
from flux.errors import LocalProtocolError, RemoteProtocolError
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.flux_producer import FluxProducer
from flux.protocol.host import Host
from flux.protocol.ingress import INGRESS, Ingress
from flux.operator import wire_form
from flux.protocol.producer import ACK, ACTIVE, DEAD, NONE, PAUSE_ROOM, SEND, STDBY
from flux.protocol.segment import AWAITING_STATE, DRAINING, MOVING, PROCESSING, STREAMING, CatchUp, Segment
from flux.sequence import NO_SN
from statemover.messages import (CancelTransfer, Handshake, RequestRecv, RequestSend, Role, SendPart,
                                 SendState)
from items import by, plain, rows


# -- views of the per-connection records, for assertions ---------------------------
def _rows(m):
    """Producer: links[i][d]; FluxConsumer: the two replicas of every feed."""
    return m.links if hasattr(m, "links") else [f.replicas for f in m.feeds]


def modes(prod):
    return [[link.modes for link in row] for row in prod.links]


def statuses(m):
    return [[x.status for x in row] for row in _rows(m)]


def vers(m):
    return [[x.ver for x in row] for row in _rows(m)]


def expected(m):
    return [[x.expected for x in row] for row in _rows(m)]


def paused(prod):
    return [[link.paused for link in row] for row in prod.links]


def data_from(c):
    return [f.data_from for f in c.feeds]


def ack_to(c):
    return [f.ack_to for f in c.feeds]


def awaiting(c):
    return {j for j, f in enumerate(c.feeds) if f.awaiting_pause_ack}


A0P, A0S = Addr(1, 0, P), Addr(1, 0, S)
A1P, A1S = Addr(1, 1, P), Addr(1, 1, S)
C0P, C0S = Addr(2, 0, P), Addr(2, 0, S)
C1P, C1S = Addr(2, 1, P), Addr(2, 1, S)
CONSUMERS = [(C0P, C0S), (C1P, C1S)]
PRODUCERS = [(A0P, A0S), (A1P, A1S)]


def items(*sns):
    """Sub-items with connection SNs ``sns``; item x's has one row, SN (x, 1)."""
    return tuple((sn, rows(((sn[0], 1), f"t{sn}"))) for sn in sns)


def sub(k):
    """Producer A0's sub-item of item k (connection SN (k, 0)): one row, SN (k, 1)."""
    return rows(((k, 1), f"t{k}"))


def t(k):
    """``sub(k)`` as ``plain`` shows it."""
    return (((k, 1), f"t{k}"),)


def producer_state(prod):
    """Everything a sync may change in a Producer, for 'changes nothing' checks."""
    return copy.deepcopy((prod.links, [b.to_state(Rows.to_state) for b in prod.buffers]))


# =====================================================================================
# Producer (flux/protocol/producer.py) through F-Prod and the ingress
# =====================================================================================

def test_avail_turns_a_dead_destination_stdby_with_its_version():
    fp = FluxProducer(A0P, CONSUMERS, 8, 4)
    fp.on_fail({C0S})
    assert statuses(fp.out) == [[ACTIVE, DEAD], [ACTIVE, ACTIVE]]
    fp.out.on_avail(C0S, 5)
    assert statuses(fp.out) == [[ACTIVE, STDBY], [ACTIVE, ACTIVE]]
    assert expected(fp.out) == [[0, 5], [0, 0]]
    assert modes(fp.out)[0][SEC] == NONE  # a standby gets nothing yet
    assert vers(fp.out) == [[0, 0], [0, 0]]


def test_avail_for_a_destination_that_is_not_dead_raises():
    fp = FluxProducer(A0P, CONSUMERS, 8, 4)
    with pytest.raises(RemoteProtocolError):
        fp.out.on_avail(C1S, 3)  # ACTIVE
    fp.on_fail({C0S})
    fp.out.on_avail(C0S, 5)
    with pytest.raises(RemoteProtocolError):
        fp.out.on_avail(C0S, 6)  # already STDBY
    # only_if_dead (the replay at a new replica) skips instead of raising
    fp.out.on_avail(C1S, 3, only_if_dead=True)
    assert statuses(fp.out)[1] == [ACTIVE, ACTIVE] and expected(fp.out)[1] == [0, 0]


def test_pause_from_a_send_destination_pauses_it_and_answers_one_pause_ack():
    fp = FluxProducer(A0P, CONSUMERS, 8, 4)
    fp.out.put(0, (1, 0), rows(((1, 1), "a")))
    fp.out.put(1, (1, 0), rows(((1, 2), "b")))
    assert fp.out.flushable((1,)) == [(0, PRIM), (1, PRIM)]
    assert fp.out.on_pause(C0P, Pause(7)) == [Send(A0P, C0P, PauseAck(7))]
    assert paused(fp.out) == [[True, False], [False, False]]
    # No data to the paused destination, no flush at all ...
    assert fp.out.flushable((1,)) == [(1, PRIM)]
    assert fp.out.flush(0, PRIM, (1,)) is None
    assert fp.out.buffers[0].sent[PRIM] == NO_SN
    # ... not even a bound, however far the frontier moves.
    fp.out.flush(1, PRIM, (1,))
    assert fp.out.flushable((9,)) == [(1, PRIM)]
    assert fp.out.flush(0, PRIM, (9,)) is None


def test_pause_from_an_ack_only_destination_raises():
    fp = FluxProducer(A0P, CONSUMERS, 8, 4)
    with pytest.raises(RemoteProtocolError):
        fp.out.on_pause(C0S, Pause(7))
    assert paused(fp.out) == [[False, False], [False, False]]


def test_ingress_pause_also_stops_bounds():
    ing = Ingress(2, by(lambda r: r % 2), 8, 4, batch_rows=1)
    assert ing.accept(0) == (1,) and len(ing.out.buffers[0]) == 1  # item 1, to partition 0
    X = Addr(1, 0, P)
    assert ing.on_message(X, Pause(3)) == [Send(INGRESS, X, PauseAck(3))]
    # partition 1 gets a bound, partition 0's other replica data: not the paused one
    assert ing.flushable() == [(0, SEC), (1, PRIM), (1, SEC)]
    assert ing.flush(0, PRIM) == []


def paused_with_backlog(backlog: int):
    """F-Prod A0P (capacity 2) whose consumer partition 0 pauses for C0S's catch-up with
    ``backlog`` tuples put meanwhile; C0S is the new replica."""
    fp = FluxProducer(A0P, CONSUMERS, 2, 4)
    fp.on_fail({C0S})
    fp.out.on_avail(C0S, 7)
    fp.out.on_pause(C0P, Pause(7))
    for k in range(1, backlog + 1):
        assert not fp.out.full()  # a segment would process its next input
        fp.out.put(0, (k, 0), sub(k))
    return fp


def test_a_paused_partition_does_not_hold_the_others_at_its_capacity():
    """While consumer partition 0 pauses for its catch-up, its buffer may grow past the
    capacity (PAUSE_ROOM), so partition 1's tuples keep going; bounded all the same
    (5.3.1, back-pressure)."""
    fp = paused_with_backlog(2 * PAUSE_ROOM)
    assert fp.out.full() and len(fp.out.buffers[0]) == 2 * PAUSE_ROOM > 2


def test_the_room_lasts_until_the_new_replica_worked_off_the_pauses_backlog():
    """The new replica installs the state before it takes anything: at the resume its
    buffer holds the whole pause's backlog. The room lasts until it is back within the
    capacity (the active runs ahead of it meanwhile), then the buffer is as before."""
    fp = paused_with_backlog(2 * PAUSE_ROOM - 2)
    buf = fp.out.buffers[0]
    fp.out.on_csync(C0P, CSync(7))
    assert fp.out.can_accept_csync(C0S, CSync(7))
    fp.out.on_csync(C0S, CSync(7))
    assert not fp.out.full() and buf.capacity == 2 * PAUSE_ROOM  # the active keeps going
    fp.out.put(0, (2 * PAUSE_ROOM - 1, 0), sub(2 * PAUSE_ROOM - 1))
    fp.out.put(0, (2 * PAUSE_ROOM, 0), sub(2 * PAUSE_ROOM))
    assert fp.out.full()  # bounded by the pause's room all the same
    while fp.out.flush(0, PRIM, (2 * PAUSE_ROOM,)):  # the active takes them all (F-Prod^P:
        fp.out.on_credit(C0P, Credit(buf.sent[PRIM]))  # sending marks them held); evicted only
    assert len(buf) == 2 * PAUSE_ROOM  # once the new replica (acking, SEC) holds them too
    for k in range(1, 2 * PAUSE_ROOM - 2):  # it works them off: the room stays ...
        fp.out.on_ack(C0S, Ack((k, 0)))
        assert buf.capacity == 2 * PAUSE_ROOM and len(buf) == 2 * PAUSE_ROOM - k
    fp.out.on_ack(C0S, Ack((2 * PAUSE_ROOM - 2, 0)))  # ... until it is within the capacity
    assert len(buf) == 2 and buf.capacity == 2 and fp.out.full()
    fp.out.check_invariants()
    fp.out.on_ack(C0S, Ack((2 * PAUSE_ROOM, 0)))
    assert len(buf) == 0 and not fp.out.full()


def test_the_room_ends_when_the_new_replica_dies():
    fp = paused_with_backlog(PAUSE_ROOM)
    fp.out.on_csync(C0P, CSync(7))
    assert fp.out.buffers[0].capacity == 2 * PAUSE_ROOM
    fp.out.fail_addresses({C0S})
    assert fp.out.buffers[0].capacity == 2
    fp.out.check_invariants()


def test_the_ingress_cuts_items_while_one_partition_pauses():
    ing = Ingress(2, by(lambda r: r % 2), 1, 4, batch_rows=1)
    X = Addr(1, 0, P)
    ing.on_message(X, Pause(3))
    for r in range(0, 2 * PAUSE_ROOM, 2):  # every input to the paused partition 0
        assert ing.accept(r) is not None
        assert ing.cut_item() or not ing.pending
    assert len(ing.out.buffers[0]) == PAUSE_ROOM > 1
    assert ing.accept(2 * PAUSE_ROOM) is None or not ing.can_cut()  # its room is used up


def fprod_with_standby_consumer(me):
    """F-Prod ``me`` of partition 0 (stage 1) whose consumer C0S died (X, to be rebuilt);
    C0P is the active consumer A. Buffer 0 holds (1,0), (2,0), (3,0)."""
    fp = FluxProducer(me, CONSUMERS, 8, 2)
    fp.on_fail({C0S})
    for k in (1, 2, 3):
        fp.out.put(0, (k, 0), sub(k))
    return fp


def test_csync_from_the_active_records_unpauses_and_resets_the_standby_to_its_marks():
    # F-Prod^P: C0P (A) is PRIM with SEND, C0S (X) is SEC.
    fp = fprod_with_standby_consumer(A0P)
    assert plain(fp.out.flush(0, PRIM, (3,))) == Send(
        A0P, C0P, Batch((((1, 0), t(1)), ((2, 0), t(2))), (3, -1)))
    buf = fp.out.buffers[0]
    assert buf.delete == {PRIM}
    fp.out.on_avail(C0S, 7)
    fp.out.on_pause(C0P, Pause(7))
    assert fp.out.can_accept_csync(C0P, CSync(7))
    assert fp.out.on_csync(C0P, CSync(7)) == []
    assert vers(fp.out)[0] == [7, 0]
    assert paused(fp.out)[0] == [False, False]
    assert buf.delete == {PRIM, SEC}
    assert buf.hwm == [(2, 0), (2, 0)]
    assert buf.sent[SEC] == NO_SN
    assert plain(buf.peek(SEC)) == ((3, 0), t(3))
    # X is still a standby: no role and no connection until its own csync
    assert statuses(fp.out)[0] == [ACTIVE, STDBY]
    assert modes(fp.out)[0][SEC] == NONE
    assert plain(fp.out.flush(0, PRIM, (3,)).msg.items) == (((3, 0), t(3)),)  # A's runs again


def test_csync_from_the_active_on_its_ack_connection_resets_the_primary_standby():
    # F-Prod^S: C0S (X) is PRIM, C0P (A) is SEC with ACK. A acked (2,1).
    fp = fprod_with_standby_consumer(A0S)
    fp.out.on_ack(C0P, Ack((2, 0)))
    buf = fp.out.buffers[0]
    assert buf.delete == {SEC} and plain(buf.entries()) == [((3, 0), t(3))]
    fp.out.on_avail(C0S, 7)
    assert fp.out.on_csync(C0P, CSync(7)) == []
    assert buf.delete == {PRIM, SEC}
    assert buf.hwm == [(2, 0), (2, 0)]
    assert plain(buf.peek(PRIM)) == ((3, 0), t(3))
    assert plain(buf.entries()) == [((3, 0), t(3))]


def test_standby_csync_waits_for_the_actives_then_x_is_active_as_primary():
    fp = fprod_with_standby_consumer(A0S)  # X = C0S is this producer's PRIM
    fp.out.on_ack(C0P, Ack((1, 0)))
    fp.out.on_avail(C0S, 7)
    assert not fp.out.can_accept_csync(C0S, CSync(7))
    with pytest.raises(LocalProtocolError):
        fp.out.on_csync(C0S, CSync(7))
    # an active csync of another version does not release it
    fp.out.on_csync(C0P, CSync(6))
    assert not fp.out.can_accept_csync(C0S, CSync(7))
    fp.out.on_csync(C0P, CSync(7))
    assert fp.out.can_accept_csync(C0S, CSync(7))
    assert fp.out.on_csync(C0S, CSync(7)) == [FoldedIn(A0S, C0S, 7)]
    assert statuses(fp.out)[0] == [ACTIVE, ACTIVE]
    assert modes(fp.out)[0] == [SEND, ACK]
    assert vers(fp.out)[0] == [7, 7]
    # X gets what A did not ack, from after A's marks
    assert plain(fp.out.flush(0, PRIM, (3,))) == Send(
        A0S, C0S, Batch((((2, 0), t(2)), ((3, 0), t(3))), (3,)))


def test_standby_csync_as_secondary_gets_ack_mode():
    fp = fprod_with_standby_consumer(A0P)  # X = C0S is this producer's SEC
    fp.out.on_avail(C0S, 7)
    fp.out.on_csync(C0P, CSync(7))
    assert fp.out.on_csync(C0S, CSync(7)) == [FoldedIn(A0P, C0S, 7)]
    assert statuses(fp.out)[0] == [ACTIVE, ACTIVE]
    assert modes(fp.out)[0] == [SEND, ACK]
    fp.out.on_ack(C0S, Ack((3, 0)))  # acks from X are taken now
    assert fp.out.buffers[0].hwm[SEC] == (3, 0)


def test_ingress_standby_csync_gets_send_and_ack():
    ing = Ingress(2, by(lambda r: r % 2), 8, 4)
    XP, XS = Addr(1, 0, P), Addr(1, 0, S)
    ing.on_fail({XS})
    ing.on_avail(Avail(XS, 40, 3, "standby0", "node0"))
    assert not ing.ready_for(XS, CSync(3))
    assert ing.on_message(XP, CSync(3)) == []
    assert ing.ready_for(XS, CSync(3))
    assert ing.on_message(XS, CSync(3)) == [FoldedIn(INGRESS, XS, 3)]
    assert statuses(ing.out)[0] == [ACTIVE, ACTIVE]
    assert modes(ing.out)[0] == [SEND | ACK, SEND | ACK]


def test_a_stale_standby_csync_changes_nothing():
    fp = fprod_with_standby_consumer(A0S)
    fp.out.on_avail(C0S, 7)
    fp.out.on_csync(C0P, CSync(7))
    before = producer_state(fp.out)
    assert fp.out.can_accept_csync(C0S, CSync(6))  # not held: it is dropped
    assert fp.out.on_csync(C0S, CSync(6)) == []
    assert producer_state(fp.out) == before
    assert statuses(fp.out)[0] == [STDBY, ACTIVE]


def test_psyncs_go_to_every_active_destination_only():
    fp = FluxProducer(A0P, CONSUMERS, 8, 4)
    fp.on_fail({C0S, C1S})
    fp.out.on_avail(C1S, 4)  # STDBY: no psync either
    assert fp.out.psyncs(4) == [Send(A0P, C0P, PSync(4)), Send(A0P, C1P, PSync(4))]
    fp2 = FluxProducer(A0S, CONSUMERS, 8, 4)
    assert fp2.out.psyncs(2) == [Send(A0S, C0S, PSync(2)), Send(A0S, C0P, PSync(2)),
                                 Send(A0S, C1S, PSync(2)), Send(A0S, C1P, PSync(2))]


# =====================================================================================
# FluxProducer: end_catchup, get_state, install_state
# =====================================================================================

def test_end_catchup_psyncs_keeps_forwarding_until_each_restore():
    fp = FluxProducer(A0P, CONSUMERS, 8, 4)
    assert fp.on_fail({A0S}) == []
    assert fp.on_reverse(C0S, Reverse(NO_SN)) == []
    assert fp.on_reverse(C1S, Reverse(NO_SN)) == [TakeoverDone(A0P)]
    assert modes(fp.out) == [[SEND, SEND], [SEND, SEND]]
    # the reversed secondaries hear that we go on sending to them (the hand-back)
    assert fp.end_catchup(5) == [Send(A0P, C0P, PSync(5)), Send(A0P, C0S, PSync(5, True)),
                                 Send(A0P, C1P, PSync(5)), Send(A0P, C1S, PSync(5, True))]
    assert modes(fp.out) == [[SEND, SEND], [SEND, SEND]]
    assert fp.p_fail is False and fp.r_done == [False, False]
    # C0S's own side caught up: we stop sending to it, and say so after our last data
    assert fp.on_restore(C0S, Restore(5)) == [Send(A0P, C0S, Restored(5))]
    assert modes(fp.out) == [[SEND, ACK], [SEND, SEND]]
    # Acks from the restored secondary are taken again (a forwarding connection takes none)
    fp.out.put(0, (1, 0), rows(((1, 1), "a")))
    fp.out.on_ack(C0S, Ack((1, 0)))
    # a Restore that crossed a failure (we no longer send to it) is answered all the same
    assert fp.on_restore(C0S, Restore(5)) == [Send(A0P, C0S, Restored(5))]
    assert not fp.takeover_done()
    # The new replica dies: C0S, restored, reverses; C1S, never handed back, stays
    assert fp.on_fail({A0S}) == []
    assert fp.on_reverse(C0S, Reverse((1, 0))) == []
    with pytest.raises(RemoteProtocolError):
        fp.on_stay(C0P, Stay(5))  # a stay from a consumer we send to as its primary
    assert fp.on_stay(C1S, Stay(5)) == [TakeoverDone(A0P)]
    assert modes(fp.out) == [[SEND, SEND], [SEND, SEND]]


def test_end_catchup_stops_forwarding_to_a_sinks_writer_at_once():
    # A writer acks at its sink's commits: no hand-back, the paper's rule (5.3.2).
    fp = FluxProducer(A0P, CONSUMERS, 8, 4, to_writer=True)
    fp.on_fail({A0S})
    fp.on_reverse(C0S, Reverse(NO_SN, ()))
    fp.on_reverse(C1S, Reverse(NO_SN, ()))
    assert fp.end_catchup(5) == [Send(A0P, C0P, PSync(5)), Send(A0P, C0S, PSync(5)),
                                 Send(A0P, C1P, PSync(5)), Send(A0P, C1S, PSync(5))]
    assert fp.r_done == [False, False]
    assert all(SEND not in row[SEC].modes for row in fp.out.links)


def test_install_state_reversed_swaps_marks_cursors_and_statuses():
    a = FluxProducer(A0P, CONSUMERS, 8, 2)
    a.on_fail({C1S})
    for k in (1, 2, 3):
        a.out.put(0, (k, 0), sub(k))
    a.out.flush(0, PRIM, (3,))  # (1,0), (2,0) to C0P: held by 2a
    a.out.on_ack(C0S, Ack((1, 0)))
    assert a.out.buffers[0].hwm == [(2, 0), (1, 0)]
    assert a.out.buffers[0].sent == [(2, 0), NO_SN]
    state = msgpack.unpackb(msgpack.packb(a.get_state(), use_bin_type=True), raw=False)

    x = FluxProducer(A0S, CONSUMERS, 8, 2)
    x.p_fail, x.r_done = True, [True, True]
    x.install_state(state, reverse=True)
    buf = x.out.buffers[0]
    assert plain(buf.entries()) == [((2, 0), t(2)), ((3, 0), t(3))]  # the rows too
    assert buf.hwm == [(1, 0), (2, 0)]
    assert buf.sent == [NO_SN, (2, 0)]
    assert buf.delete == {PRIM, SEC}
    assert plain(buf.peek(PRIM)) == ((2, 0), t(2))  # X's primary C0S holds only (1,0)
    assert plain(buf.peek(SEC)) == ((3, 0), t(3))
    # a's partition 1: [C1P ACTIVE, C1S DEAD]; x's peers are (C1S, C1P)
    assert statuses(x.out) == [[ACTIVE, ACTIVE], [DEAD, ACTIVE]]
    assert modes(x.out) == [[SEND, ACK], [NONE, ACK]]
    assert x.out.buffers[1].delete == {SEC}
    assert x.p_fail is False and x.r_done == [False, False]
    x.out.check_invariants()


def test_install_state_reversed_keeps_the_egress_ghost_dead():
    eg, ghost = Addr(3, 0, P), Addr(3, 0, S)
    a = FluxProducer(Addr(2, 0, S), [(eg, ghost)], 8, 2, absent={ghost})
    assert a.out.peers == [(ghost, eg)] and statuses(a.out) == [[DEAD, ACTIVE]]
    a.out.put(0, (1, 0), rows(((1, 1, 1), "x")))
    a.out.put(0, (2, 0), rows(((2, 1, 1), "y")))
    a.out.on_ack(eg, Ack((1, 0)))
    x = FluxProducer(Addr(2, 0, P), [(eg, ghost)], 8, 2, absent={ghost})
    x.install_state(a.get_state(), reverse=True)
    assert plain(x.out.buffers[0].entries()) == [((2, 0), (((2, 1, 1), "y"),))]
    assert statuses(x.out) == [[ACTIVE, DEAD]]
    assert modes(x.out) == [[SEND, NONE]]
    assert x.out.buffers[0].delete == {PRIM}
    x.out.check_invariants()
    with pytest.raises(RemoteProtocolError):
        x.out.on_ack(ghost, Ack((1, 0)))
    with pytest.raises(RemoteProtocolError):
        x.install_state(a.get_state() * 2, reverse=True)


# =====================================================================================
# FluxConsumer
# =====================================================================================

def test_pause_asks_every_data_source_and_drains_to_the_last_pause_ack():
    c = FluxConsumer(C0P, PRODUCERS)
    assert c.pause(4) == [Send(C0P, A0P, Pause(4)), Send(C0P, A1P, Pause(4))]
    assert awaiting(c) == {0, 1}
    # drained data is still taken and acked while waiting
    assert c.on_batch(A1P, Batch(items((1, 1)), (1,))) == [Send(C0P, A1S, Ack((1, 1)))]
    assert c.on_pause_ack(A1P, PauseAck(4)) is False
    with pytest.raises(RemoteProtocolError):
        c.on_pause_ack(A1P, PauseAck(4))  # twice
    with pytest.raises(RemoteProtocolError):
        c.on_pause_ack(A0S, PauseAck(4))  # not the data source
    assert c.on_pause_ack(A0P, PauseAck(4)) is True
    assert awaiting(c) == set()


def consumer_with_standby_source(me, version=4):
    """Consumer ``me`` (stage 2, partition 0) after A0S died and was made STDBY.
    A0P is the survivor A; A0S is the new replica X."""
    c = FluxConsumer(me, PRODUCERS)
    if me.replica == S:
        c.on_batch(A0S, Batch(items((1, 0)), (1,)))
    else:
        c.on_batch(A0P, Batch(items((1, 0)), (1,)))
    effects = c.on_fail({A0S})
    c.on_avail(A0S, version)
    return c, effects


def count_folded(effects):
    return sum(isinstance(e, FoldedIn) for e in effects)


def test_consumer_on_the_actives_side_standby_psync_first():
    c, eff = consumer_with_standby_source(C0P)
    assert eff == []
    assert statuses(c)[0] == [ACTIVE, STDBY] and data_from(c)[0] == P and ack_to(c)[0] is None
    assert not c.ready_for(A0P, PSync(4))
    assert c.ready_for(A0S, PSync(4))
    effects = c.on_psync(A0S, PSync(4))
    assert effects == []
    assert vers(c)[0] == [0, 4]
    assert data_from(c)[0] == P and ack_to(c)[0] is None  # no acks to X yet
    assert c.ready_for(A0P, PSync(4))
    second = c.on_psync(A0P, PSync(4))
    assert second == [FoldedIn(C0P, A0S, 4)]
    assert statuses(c)[0] == [ACTIVE, ACTIVE]
    assert data_from(c) == [P, P] and ack_to(c) == [S, S]
    assert c.on_batch(A0P, Batch(items((2, 0)), (2,))) == [Send(C0P, A0S, Ack((2, 0)))]
    # a repeated psync does not fold in again
    assert c.on_psync(A0P, PSync(4)) == []
    assert count_folded(effects + second) == 1


def test_consumer_on_the_actives_side_active_psync_first_waits():
    c, _ = consumer_with_standby_source(C0P)
    # A's psync is at the head of its connection first: it is held
    assert not c.ready_for(A0P, PSync(4))
    with pytest.raises(LocalProtocolError):
        c.on_psync(A0P, PSync(4))
    assert vers(c)[0] == [0, 0] and data_from(c)[0] == P
    # X's psync, on another connection, is taken; then A's may go
    assert c.ready_for(A0S, PSync(4))
    assert c.on_psync(A0S, PSync(4)) == []
    assert c.ready_for(A0P, PSync(4))
    assert c.on_psync(A0P, PSync(4)) == [FoldedIn(C0P, A0S, 4)]
    assert data_from(c)[0] == P and ack_to(c)[0] == S


def test_consumer_on_the_standbys_side_active_psync_first():
    c, eff = consumer_with_standby_source(C0S)
    assert eff == [Send(C0S, A0P, Reverse((1, 0)))]  # take-over: reversed to A
    assert data_from(c)[0] == P and ack_to(c)[0] is None
    c.on_batch(A0P, Batch(items((2, 0)), (2,)))
    assert not c.ready_for(A0S, PSync(4))
    assert c.ready_for(A0P, PSync(4))
    assert c.on_psync(A0P, PSync(4)) == []
    assert vers(c)[0] == [4, 0]
    assert data_from(c)[0] is None  # A stopped forwarding to us
    assert c.ready_for(A0S, PSync(4))
    assert c.on_psync(A0S, PSync(4)) == [FoldedIn(C0S, A0S, 4)]
    assert statuses(c)[0] == [ACTIVE, ACTIVE]
    assert data_from(c) == [S, S] and ack_to(c) == [P, P]
    assert c.on_batch(A0S, Batch(items((3, 0)), (3,))) == [Send(C0S, A0P, Ack((3, 0)))]
    with pytest.raises(RemoteProtocolError):
        c.on_batch(A0P, Batch(items((4, 0)), (4,)))


def test_consumer_on_the_standbys_side_standby_psync_first_waits():
    c, _ = consumer_with_standby_source(C0S)
    assert not c.ready_for(A0S, PSync(4))
    with pytest.raises(LocalProtocolError):
        c.on_psync(A0S, PSync(4))
    assert vers(c)[0] == [0, 0] and data_from(c)[0] == P
    assert c.ready_for(A0P, PSync(4))
    first = c.on_psync(A0P, PSync(4))
    assert c.ready_for(A0S, PSync(4))
    second = c.on_psync(A0S, PSync(4))
    assert first == [] and second == [FoldedIn(C0S, A0S, 4)]
    assert data_from(c)[0] == S and ack_to(c)[0] == P


def test_a_stale_psync_from_a_reversed_source_answers_reverse():
    c, _ = consumer_with_standby_source(C0S)
    c.on_batch(A0P, Batch(items((2, 0)), (2,)))
    # X dies before A's psync is taken: nothing to do yet, A is our source
    assert c.on_fail({A0S}) == []
    assert statuses(c)[0] == [ACTIVE, DEAD] and data_from(c)[0] == P
    assert c.ready_for(A0P, PSync(4))
    assert c.on_psync(A0P, PSync(4)) == [Send(C0S, A0P, Reverse((2, 0)))]
    assert data_from(c)[0] == P and ack_to(c)[0] is None
    assert vers(c)[0] == [0, 0]


def test_a_stale_psync_from_a_same_side_source_changes_nothing():
    c, _ = consumer_with_standby_source(C0P)
    c.on_fail({A0S})
    assert c.on_psync(A0P, PSync(4)) == []
    assert data_from(c)[0] == P and ack_to(c)[0] is None and statuses(c)[0] == [ACTIVE, DEAD]


def test_a_standby_dying_after_the_actives_psync_reverses_to_the_active():
    c, _ = consumer_with_standby_source(C0S)
    c.on_batch(A0P, Batch(items((2, 0)), (2,)))
    c.on_psync(A0P, PSync(4))
    assert data_from(c)[0] is None
    assert c.on_fail({A0S}) == [Send(C0S, A0P, Reverse((2, 0)))]
    assert data_from(c)[0] == P and ack_to(c)[0] is None and statuses(c)[0] == [ACTIVE, DEAD]
    # The guard that waited for X is gone; X's late psync would be fenced by its host.
    assert c.on_batch(A0P, Batch(items((3, 0)), (3,))) == []


def test_a_standby_dying_after_its_psync_releases_the_actives_psync():
    c, _ = consumer_with_standby_source(C0P)
    c.on_psync(A0S, PSync(4))
    assert c.on_fail({A0S}) == []
    assert c.ready_for(A0P, PSync(4))
    assert c.on_psync(A0P, PSync(4)) == []
    assert data_from(c)[0] == P and ack_to(c)[0] is None


def test_mark_dead_notes_failures_without_effects():
    c = FluxConsumer(C0S, PRODUCERS)
    assert c.mark_dead({A1P, C1P}) is None
    assert statuses(c) == [[ACTIVE, ACTIVE], [DEAD, ACTIVE]]
    assert data_from(c) == [S, S] and ack_to(c) == [P, P]
    assert c.p_fail is False
    ing = FluxConsumer(Addr(1, 0, S), [(INGRESS, INGRESS)])
    ing.mark_dead({INGRESS})
    assert statuses(ing) == [[ACTIVE, ACTIVE]]
    assert ing.reverse_dead_sources() == []


def test_reverse_dead_sources():
    c = FluxConsumer(C0S, PRODUCERS)
    c.merge.install_state([[0, [], [3], [3, 0]], [1, [], [2], [2, 1]]])
    c.mark_dead({A0S, A1P})
    assert c.reverse_dead_sources() == [Send(C0S, A0P, Reverse((3, 0)))]
    assert data_from(c) == [P, S]
    assert ack_to(c) == [None, None]


# =====================================================================================
# Segment
# =====================================================================================

M, MX = Addr(2, 0, P), Addr(2, 0, S)
D0P, D0S = Addr(3, 0, P), Addr(3, 0, S)
D1P, D1S = Addr(3, 1, P), Addr(3, 1, S)
DOWN = [(D0P, D0S), (D1P, D1S)]


class Chain:
    """Passes records through and counts them; records its quiesce hooks."""

    columnar = False  # operators on records

    def keyed_stores(self):
        return []  # no KeyedState: state moves whole

    def __init__(self):
        self.count = 0
        self.calls = []

    def process(self, record):
        self.count += 1
        return [record]

    def process_many(self, records):
        return [self.process(r) for r in records]

    def get_state(self):
        return [self.count]

    def install_state(self, state):
        self.calls.append("install")
        self.count = state[0]

    def init_trans(self):
        self.calls.append("init_trans")

    def end_trans(self):
        self.calls.append("end_trans")


def middle(addr=M, mode=PROCESSING):
    return Segment(addr, FluxConsumer(addr, PRODUCERS), Chain(),
                   FluxProducer(addr, DOWN, 8, 4), by(lambda out: out % 2), mode)


def after_takeover():
    """M took over from its dead dual MX: D0S and D1S reversed to it. It processed item 1;
    A1's part of item 2 waits in its merge (A0 may still send a part of it)."""
    seg = middle()
    seg.on_message(A0P, Batch((((1, 0), rows(((1, 1), 10))),), (1,)))
    seg.on_message(A1P, Batch((((2, 1), rows(((2, 1), 21))),), (2,)))
    seg.process()
    assert seg.chain.count == 1 and seg.fcons.queued() == 1
    assert seg.on_fail({MX}) == []
    return seg


AVAIL = Avail(MX, 30, 5, "standby0", "node0")
TRANSFER = (2, 0, 5)


def started():
    seg = after_takeover()
    seg.on_message(D0S, Reverse(NO_SN))
    assert seg.on_message(D1S, Reverse(NO_SN)) == [TakeoverDone(M)]
    assert seg.on_avail(AVAIL, "sm@sb") == [RequestSend(TRANSFER, "sm@sb")]
    return seg


def test_maybe_start_waits_for_takeover_after_avail():
    seg = after_takeover()
    assert seg.on_avail(AVAIL, "sm@sb") == []
    assert seg.catchup == CatchUp(5, "sm@sb")
    assert seg.on_message(D0S, Reverse(NO_SN)) == []
    assert seg.on_message(D1S, Reverse(NO_SN)) == [
        TakeoverDone(M), RequestSend(TRANSFER, "sm@sb")]
    assert seg.catchup == CatchUp(5, "sm@sb", started=True)
    assert seg._maybe_start() == []  # once only


def test_maybe_start_waits_for_avail_of_its_dual_after_takeover():
    seg = after_takeover()
    seg.on_message(D0S, Reverse(NO_SN))
    assert seg.on_message(D1S, Reverse(NO_SN)) == [TakeoverDone(M)]
    assert seg._maybe_start() == []
    seg.on_fail({D0P})  # some other replica's avail does not start it
    assert seg.on_avail(Avail(D0P, 31, 4, "standby1", "node9"), "sm@sb1") == []
    assert seg.catchup is None
    assert seg.on_avail(AVAIL, "sm@sb") == [RequestSend(TRANSFER, "sm@sb")]


def test_sm_ready_drains_to_the_last_pause_ack_then_moves_the_state():
    seg = started()
    assert seg.sm_ready() == [Send(M, A0P, Pause(5)), Send(M, A1P, Pause(5)),
                              SourcesPaused(TRANSFER)]
    assert seg.mode == DRAINING
    # draining: data is taken, acked and processed as usual
    assert seg.ready_for(A0P, Batch(items((3, 0)), (3,)))
    assert seg.on_message(A0P, Batch((((3, 0), rows(((3, 1), 30))),), (3,))) == [
        Send(M, A0S, Ack((3, 0)))]
    assert seg.on_message(A0P, PauseAck(5)) == []
    assert seg.mode == DRAINING and seg.chain.calls == []
    assert seg.can_process()
    seg.process()  # item 2: A0's item 3 proves A0 sends no part of it
    assert not seg.can_process()  # item 3 waits for A1's bound
    effects = seg.on_message(A1P, PauseAck(5))
    assert seg.mode == MOVING
    assert seg.chain.calls == ["init_trans"]
    assert len(effects) == 1
    call = effects[0]
    assert isinstance(call, SendState) and call.transfer == TRANSFER
    state = msgpack.unpackb(call.data, raw=False, strict_map_key=False)
    assert state == wire_form(seg.get_state())
    assert state["operators"] == [2]
    # item 3 was drained but cannot be merged yet: it travels in the state, rows and all
    assert [[(tuple(sn), Rows.from_state(r).pairs()) for sn, r in q[1]]
            for q in state["fcons"]] == [[((3, 0), [((3, 1), 30)])], []]
    # quiesced: takes no message, processes and sends nothing
    for src, msg in [(A0P, Batch((), (4,))), (D0S, Ack((1, 0))), (A0S, CSync(5)),
                     (A1P, PSync(9)), (D0P, Pause(6))]:
        assert not seg.ready_for(src, msg)
    assert not seg.can_process() and seg.flushable() == []


def test_state_sent_resumes_with_csyncs_then_psyncs():
    seg = started()
    seg.sm_ready()
    seg.on_message(A0P, PauseAck(5))
    seg.on_message(A1P, PauseAck(5))
    effects = seg.state_sent()
    assert effects == [Send(M, A0P, CSync(5)), Send(M, A0S, CSync(5)),
                       Send(M, A1P, CSync(5)), Send(M, A1S, CSync(5)),
                       Send(M, D0P, PSync(5)), Send(M, D0S, PSync(5, True)),
                       Send(M, D1P, PSync(5)), Send(M, D1S, PSync(5, True)),
                       SourcesResumed(TRANSFER)]
    assert seg.mode == PROCESSING and seg.catchup is None
    assert seg.chain.calls == ["init_trans", "end_trans"]
    # the reversed secondaries get our data until their own side caught up (hand-back)
    assert modes(seg.fprod.out) == [[SEND, SEND], [SEND, SEND]]
    assert seg.fcons.p_fail is False and seg.fprod.p_fail is False


def checkpoint_bytes():
    seg = started()
    seg.sm_ready()
    seg.on_message(A0P, PauseAck(5))
    return seg, seg.on_message(A1P, PauseAck(5))[0].data


def test_a_standby_segment_holds_everything_then_installs_and_syncs():
    active, data = checkpoint_bytes()
    x = middle(MX, AWAITING_STATE)
    assert x.expect_state(CatchUp(5, "sm@node0")) == [
        RequestRecv(TRANSFER, "sm@node0")]
    for src, msg in [(A0S, Batch(items((1, 0)), (1,))), (D0P, Ack((1, 0))), (A0P, CSync(5)),
                     (A0S, PSync(5)), (D0S, Reverse(NO_SN)), (D0S, Pause(5))]:
        assert not x.ready_for(src, msg)
    assert not x.can_process() and x.flushable() == []
    assert x.sm_ready() == [] and x.mode == AWAITING_STATE
    effects = x.state_received(data)
    assert effects == [Send(MX, A0P, CSync(5)), Send(MX, A0S, CSync(5)),
                       Send(MX, A1P, CSync(5)), Send(MX, A1S, CSync(5)),
                       Send(MX, D0S, PSync(5)), Send(MX, D0P, PSync(5)),
                       Send(MX, D1S, PSync(5)), Send(MX, D1P, PSync(5))]
    assert x.mode == PROCESSING and x.catchup is None
    assert x.chain.calls == ["install"] and x.chain.count == 1
    # the queued sub-item moved too, rows and all
    assert plain(list(x.fcons.merge.queues[1])) == [((2, 1), (((2, 1), 21),))]
    assert x.fcons.merge.last == active.fcons.merge.last
    assert data_from(x.fcons) == [S, S] and ack_to(x.fcons) == [P, P]
    for xb, ab in zip(x.fprod.out.buffers, active.fprod.out.buffers):
        assert xb.hwm == ab.hwm[::-1] and xb.sent == ab.sent[::-1]
        assert plain(xb.entries()) == plain(ab.entries())
    assert [sn for b in x.fprod.out.buffers for sn, _ in b.entries()] == [(1, 0)]  # item 1's
    with pytest.raises(LocalProtocolError):
        x.state_received(data)


def test_abort_in_draining_resumes_with_csyncs_and_cancels_the_transfer():
    seg = started()
    seg.sm_ready()
    seg.on_message(A0P, PauseAck(5))
    # the view that declares the standby failed
    effects = seg.on_fail({MX})
    assert effects == [CancelTransfer(TRANSFER, "the standby is gone"),
                       Send(M, A0P, CSync(5)), Send(M, A0S, CSync(5)),
                       Send(M, A1P, CSync(5)), Send(M, A1S, CSync(5)),
                       SourcesResumed(TRANSFER)]
    assert seg.mode == PROCESSING and seg.catchup is None
    assert awaiting(seg.fcons) == set()
    assert seg.chain.calls == []  # never quiesced
    # still forwarding to its secondaries: there is no new replica
    assert modes(seg.fprod.out) == [[SEND, SEND], [SEND, SEND]]
    # the pause-ack of the aborted attempt is ignored
    assert seg.on_message(A1P, PauseAck(5)) == []
    assert seg.mode == PROCESSING


def test_abort_in_moving_ends_the_transaction():
    seg, _ = checkpoint_bytes()
    assert seg.abort_catchup() == [CancelTransfer(TRANSFER, "the standby is gone"),
                                   Send(M, A0P, CSync(5)), Send(M, A0S, CSync(5)),
                                   Send(M, A1P, CSync(5)), Send(M, A1S, CSync(5)),
                                   SourcesResumed(TRANSFER)]
    assert seg.mode == PROCESSING and seg.chain.calls == ["init_trans", "end_trans"]


def test_abort_before_draining():
    seg = after_takeover()
    seg.on_avail(AVAIL, "sm@sb")
    assert seg.abort_catchup() == []  # never started: nothing to cancel
    assert seg.catchup is None
    seg = started()
    assert seg.abort_catchup() == [CancelTransfer(TRANSFER, "the standby is gone")]
    assert seg.mode == PROCESSING and seg.catchup is None


def test_a_pause_ack_of_an_aborted_attempt_is_ignored_by_the_next():
    seg = started()
    seg.sm_ready()
    seg.abort_catchup()
    assert seg.on_avail(Avail(MX, 31, 6, "standby1", "node0"), "sm@sb1") == [
        RequestSend((2, 0, 6), "sm@sb1")]
    assert seg.sm_ready() == [Send(M, A0P, Pause(6)), Send(M, A1P, Pause(6)),
                              SourcesPaused((2, 0, 6))]
    assert seg.on_message(A0P, PauseAck(5)) == []
    assert seg.on_message(A1P, PauseAck(5)) == []
    assert awaiting(seg.fcons) == {0, 1} and seg.mode == DRAINING
    assert seg.on_message(A0P, PauseAck(6)) == []
    assert awaiting(seg.fcons) == {1}
    effects = seg.on_message(A1P, PauseAck(6))
    assert seg.mode == MOVING and effects[0].transfer == (2, 0, 6)


# =====================================================================================
# Host
# =====================================================================================

class Stub:
    """A machine that records messages; a standby factory's product."""

    def ready_for(self, src, msg):
        return True

    def __init__(self, addr):
        self.addr = addr
        self.calls = []

    def expect_state(self, catchup):
        self.calls.append(("expect", catchup))
        return []

    def on_message(self, src, msg):
        self.calls.append(("msg", src, msg))
        return []

    def on_fail(self, dead):
        self.calls.append(("fail", frozenset(dead)))
        return []

    def on_avail(self, avail, peer_mover):
        self.calls.append(("avail", avail, peer_mover))
        return []


def test_avail_for_this_host_creates_the_segment_and_asks_the_mover_to_receive():
    made = []

    def factory(addr):
        seg = middle(addr, AWAITING_STATE)
        made.append(seg)
        return seg

    other = Stub(Addr(1, 1, S))
    h = Host("standby0", {other.addr: other}, inc=30, segment_factory=factory)
    sends, others = h.on_view(View(1, avail=(AVAIL,)))
    assert len(made) == 1 and h.machines[MX] is made[0]
    assert made[0].catchup == CatchUp(5, MoverAddr("node0"))
    assert sends == [Envelope(MoverAddr("standby0"), MoverAddr("node0"), 1,
                              Handshake(TRANSFER, Role.RECV), 30, None)]
    assert others == []
    assert other.calls == [("avail", AVAIL, MoverAddr("standby0"))]
    assert h.created_at[MX] == 1 and h.peer_incs[MX] == 30


def test_avail_for_another_host_creates_nothing():
    made = []
    h = Host("standby1", {}, inc=31, segment_factory=lambda a: made.append(a))
    assert h.on_view(View(1, avail=(AVAIL,))) == ([], [])
    assert made == [] and h.machines == {}


def test_a_view_failing_one_address_of_a_live_host_discards_that_machine():
    other = Stub(Addr(1, 1, S))
    h = Host("standby0", {other.addr: other}, inc=30, segment_factory=Stub)
    h.on_view(View(1, avail=(AVAIL,)))
    x = h.machines[MX]
    h.on_view(View(2, failed=frozenset({MX})))  # killed alone: the host lives
    assert MX not in h.machines
    assert ("fail", frozenset({MX})) not in x.calls
    assert other.calls[-1] == ("fail", frozenset({MX}))
    late = Envelope(D0S, MX, 1, Ack((1,)), 50)
    assert h.fenced(late) and h.on_envelope(late) == ([], [])


def test_a_view_failing_the_whole_host_does_not_discard_it():
    h = Host("standby0", {}, inc=30, segment_factory=Stub)
    h.on_view(View(1, avail=(AVAIL,)))
    h.on_view(View(2, failed=frozenset({MX}), failed_incs=frozenset({30})))
    assert MX in h.machines


def test_valid_from_fences_a_killed_alone_replica_older_than_its_new_avail():
    a = Stub(M)
    h = Host("node0", {M: a}, inc=10)
    h.on_view(View(1, avail=(AVAIL,)))
    assert h.valid_from[(MX, 30)] == 1
    assert not h.fenced(Envelope(MX, M, 1, CSync(5), 30))
    h.on_view(View(2, failed=frozenset({MX})))  # aborted; its process lives on
    assert h.fenced(Envelope(MX, M, 1, CSync(5), 30))
    assert h.fenced(Envelope(MX, M, 2, CSync(5), 30))
    h.on_view(View(3, avail=(Avail(MX, 30, 6, "standby0", "node0"),)))  # same process again
    assert h.valid_from[(MX, 30)] == 3
    assert h.on_envelope(Envelope(MX, M, 2, CSync(5), 30)) == ([], [])
    assert h.on_envelope(Envelope(MX, M, 1, CSync(5), 30)) == ([], [])
    assert [c for c in a.calls if c[0] == "msg"] == []
    h.on_envelope(Envelope(MX, M, 3, CSync(6), 30))
    assert a.calls[-1] == ("msg", MX, CSync(6))


def test_created_at_drops_mail_sent_before_the_machine_existed():
    h = Host("standby0", {}, inc=30, segment_factory=Stub)
    h.on_view(View(1, failed=frozenset({MX}), failed_incs=frozenset({99})))
    h.on_view(View(2, avail=(AVAIL,)))
    x = h.machines[MX]
    old = Envelope(D0S, MX, 1, Ack((1,)), 50)  # sent to the address before view 2
    assert h.fenced(old)
    assert h.on_envelope(old) == ([], [])
    assert [c for c in x.calls if c[0] == "msg"] == []
    new = Envelope(D0S, MX, 2, Ack((2,)), 50)
    assert not h.fenced(new)
    h.on_envelope(new)
    assert x.calls[-1] == ("msg", D0S, Ack((2,)))


# =====================================================================================
# The segment's mode table (flux/protocol/segment.py TRANSITIONS)
# =====================================================================================

def test_a_quiesced_segment_refuses_local_work_and_messages_as_a_local_error():
    seg, _ = checkpoint_bytes()
    assert seg.mode == MOVING
    for call in (lambda: seg.on_message(A0P, Batch((), (4,))), seg.process,
                 lambda: seg.flush(0, 0), seg.sm_ready, lambda: seg.state_received(b""),
                 lambda: seg.on_message(A0P, PauseAck(5))):
        with pytest.raises(LocalProtocolError):
            call()
    assert seg.mode == MOVING  # a refused event changes nothing


def test_events_out_of_turn_are_local_errors_and_change_nothing():
    seg = started()
    with pytest.raises(LocalProtocolError):
        seg.state_sent()  # not MOVING
    with pytest.raises(LocalProtocolError):
        seg.expect_state(CatchUp(5, "sm@x"))  # not a new replica
    assert seg.mode == PROCESSING and seg.catchup == CatchUp(5, "sm@sb", started=True)
    seg.sm_ready()
    with pytest.raises(LocalProtocolError):
        seg.sm_ready()  # twice
    assert seg.mode == DRAINING
    x = middle(MX, AWAITING_STATE)
    for call in (x.process, lambda: x.flush(0, 0), lambda: x.on_message(A0S, Batch((), (1,)))):
        with pytest.raises(LocalProtocolError):
            call()
    assert x.mode == AWAITING_STATE


def test_the_mode_table_lists_every_mode_and_lets_views_in_everywhere():
    from flux.protocol.segment import TRANSITIONS, Event, SegmentMode
    assert {m for m, _ in TRANSITIONS} == set(SegmentMode)
    for mode in SegmentMode:
        assert TRANSITIONS[(mode, Event.FAIL)] is mode
        assert TRANSITIONS[(mode, Event.AVAIL)] is mode
    # only these events move a segment to another mode
    moves = {k: v for k, v in TRANSITIONS.items() if k[0] is not v}
    assert moves == {
        (PROCESSING, Event.SM_READY): STREAMING,
        (STREAMING, Event.BULK_SENT): DRAINING,
        (STREAMING, Event.ABORT): PROCESSING,
        (DRAINING, Event.DRAINED): MOVING,
        (MOVING, Event.STATE_SENT): PROCESSING,
        (AWAITING_STATE, Event.STATE_RECEIVED): PROCESSING,
        (DRAINING, Event.ABORT): PROCESSING,
        (MOVING, Event.ABORT): PROCESSING,
    }


# =====================================================================================
# Typed mover calls, dispatched by the host
# =====================================================================================

class MoverRecorder:
    def __init__(self):
        self.calls = []

    def request_send(self, transfer, peer):
        self.calls.append(("request_send", transfer, peer))
        return []

    def request_recv(self, transfer, peer):
        self.calls.append(("request_recv", transfer, peer))
        return []

    def send(self, transfer, state):
        self.calls.append(("send", transfer, state))
        return []

    def send_part(self, transfer, part):
        self.calls.append(("send_part", transfer, part))
        return []

    def cancel(self, transfer, reason):
        self.calls.append(("cancel", transfer, reason))
        return []


def test_the_host_dispatches_mover_calls_by_type():
    h = Host("node0", {}, inc=1, segment_factory=Stub)
    h.mover = MoverRecorder()
    assert h.run_local([RequestSend(TRANSFER, "sm@sb"), RequestRecv(TRANSFER, "sm@a"),
                        SendPart(TRANSFER, b"bulk"), SendState(TRANSFER, b"st"),
                        CancelTransfer(TRANSFER, "gone")]) == ([], [])
    assert h.mover.calls == [("request_send", TRANSFER, "sm@sb"), ("request_recv", TRANSFER, "sm@a"),
                             ("send_part", TRANSFER, b"bulk"), ("send", TRANSFER, b"st"),
                             ("cancel", TRANSFER, "gone")]
