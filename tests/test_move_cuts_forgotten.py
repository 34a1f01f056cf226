"""Move cuts are forgotten once every consumer crossed them (DESIGN 13): a producer keeps
every move cut of the job's life to tell a connection never told (a take-over's, a new
replica's) only until each live consumer replica said, in its acks and credits, that it
crossed it; a job that moves key groups all its life (the rebalancing policy) then keeps
no growing list. A consumer remembers what it learned by number, so a cut told again is
not learned twice."""
from __future__ import annotations

import pytest

from exchange.group_map import GroupMove
from flux.addresses import Addr, P, S
from flux.control_messages import Avail
from flux.data_messages import Ack, Credit
from flux.protocol.cuts import Cuts
from flux.protocol.flux_producer import FluxProducer

pytestmark = pytest.mark.timeout(30)

PP = Addr(1, 0, P)
C0P, C0S = Addr(2, 0, P), Addr(2, 0, S)
C1P, C1S = Addr(2, 1, P), Addr(2, 1, S)
MOVE = GroupMove(2, 0, 9, 1, 4)


def flux_producer():
    fp = FluxProducer(PP, [(C0P, C0S), (C1P, C1S)], 8, 16)
    fp.out.move_cuts = ((4, 10, (MOVE,)), (7, 20, (MOVE,)))
    return fp


def producer_with_move_cuts():
    """Replica P: it sends to the P consumers (their credits) and takes the S ones'
    acks."""
    return flux_producer().out


def test_a_move_cut_is_forgettable_only_once_every_live_consumer_crossed_it():
    out = producer_with_move_cuts()
    assert out.moves_forgettable() == 0  # nobody said anything yet
    out.on_credit(C0P, Credit((11, 0), 4))
    out.on_credit(C1P, Credit((11, 0), 7))
    out.on_ack(C0S, Ack((11, 0), 7))
    assert out.moves_forgettable() == 0  # C1S has not said
    out.on_ack(C1S, Ack((11, 0), 4))
    assert out.moves_forgettable() == 4
    out.on_credit(C0P, Credit((12, 0), 7))
    out.on_ack(C1S, Ack((12, 0), 7))
    assert out.moves_forgettable() == 7


def test_a_dead_consumer_does_not_hold_it_back_but_its_standby_does():
    fp = flux_producer()
    for addr in (C0P, C1P):
        fp.out.on_credit(addr, Credit((11, 0), 7))
    fp.out.on_ack(C0S, Ack((11, 0), 7))
    fp.out.on_ack(C1S, Ack((11, 0), 4))
    assert fp.out.moves_forgettable() == 4
    fp.on_fail({C1S})
    assert fp.out.moves_forgettable() == 7  # its standby gets its state from C1P
    fp.on_avail(Avail(C1S, 1, 1, "node9", "node2"))
    assert fp.out.moves_forgettable() == 0  # a standby not heard from yet holds it back


def test_an_egress_keeps_no_moves_and_holds_nothing_back():
    out = producer_with_move_cuts()
    out.on_credit(C0P, Credit((11, 0), 7))
    out.on_ack(C0S, Ack((11, 0), 7))
    out.on_credit(C1P, Credit((11, 0), None))  # say partition 1's were egresses
    out.on_ack(C1S, Ack((11, 0), None))
    assert out.moves_forgettable() == 7


def test_a_consumer_forgets_only_what_it_crossed_and_never_learns_a_cut_twice():
    cuts = Cuts()
    told = (4, 10, ((4, 10, [MOVE.to_wire()]), (7, 20, [MOVE.to_wire()])))
    cuts.learn(told)
    assert [k for k, _, _ in cuts.move_cuts] == [4, 7] and sorted(cuts.moves) == [4, 7]
    cuts.cross_moves(4)
    cuts.forget(7)  # its consumers crossed 7, but it did not yet: 7 is kept
    assert [k for k, _, _ in cuts.move_cuts] == [7]
    cuts.learn(told)  # told again by a producer that has not forgotten 4
    assert sorted(cuts.moves) == [7] and [k for k, _, _ in cuts.move_cuts] == [7]
    cuts.cross_moves(7)
    cuts.forget(7)
    assert cuts.move_cuts == () and cuts.moves_seen == 7
    again = Cuts()
    again.install_state(cuts.to_state())  # a new replica's, from its twin
    again.learn(told)
    assert again.moves == {} and again.move_cuts == ()


def test_a_consumer_that_gets_no_data_says_what_it_crossed_on_a_bound():
    """A spare pair owning no group gets batches of a bound alone: it acks and credits
    them once when it crossed a new move cut, so it holds no producer's forgetting back."""
    from flux.data_messages import Batch
    from flux.protocol.flux_consumer import FluxConsumer

    consumer = FluxConsumer(C0P, [(Addr(1, 0, P), Addr(1, 0, S))])
    assert consumer.on_batch(Addr(1, 0, P), Batch((), (5,))) == []  # nothing new to say
    consumer.moves_crossed = 4
    said = consumer.on_batch(Addr(1, 0, P), Batch((), (9,)))
    assert [(e.dst, type(e.msg).__name__, e.msg.moves) for e in said] == [
        (Addr(1, 0, S), "Ack", 4), (Addr(1, 0, P), "Credit", 4)]
    assert consumer.on_batch(Addr(1, 0, P), Batch((), (12,))) == []  # said once
