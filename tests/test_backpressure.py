"""Back-pressure by credits (docs/design/backpressure.md): exact transitions of the window at a
producer and of the credits at a consumer, and what a user sees: a consumer that does
not take holds at most a window per connection, whatever the producer has."""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P, S
from flux.protocol.buffer import PRIM, SEC
from flux.protocol.builder import MachineBuilder
from flux.data_messages import Batch, Credit, Reverse
from flux.effects import Send
from flux.testing.dataflows import counting_dataflow
from flux.protocol.flux_consumer import FluxConsumer
from flux.protocol.flux_producer import FluxProducer
from flux.sequence import NO_SN

PP = Addr(1, 0, P)
C0P, C0S = Addr(2, 0, P), Addr(2, 0, S)
C1P, C1S = Addr(2, 1, P), Addr(2, 1, S)
CONSUMERS = [(C0P, C0S), (C1P, C1S)]
A0P, A0S = Addr(1, 0, P), Addr(1, 0, S)
A1P, A1S = Addr(1, 1, P), Addr(1, 1, S)


def producer(window, batch_size=2, capacity=16):
    fp = FluxProducer(PP, CONSUMERS, capacity, batch_size, window=window)
    for n in range(1, 9):
        fp.out.put(0, (n, 1), f"t{n}")
    return fp


def sns(send):
    return [sn for sn, _ in send.msg.items]


# -- the producer's window ---------------------------------------------------------------

def test_a_connection_carries_at_most_a_window_of_untaken_tuples():
    fp = producer(window=3)
    assert sns(fp.out.flush(0, PRIM, (8,))) == [(1, 1), (2, 1)]
    assert sns(fp.out.flush(0, PRIM, (8,))) == [(3, 1)]  # one left in the window
    # full: nothing more, not even the bound (it stays before the first unsent tuple)
    assert (0, PRIM) not in fp.out.flushable((8,))
    assert fp.out.flush(0, PRIM, (8,)) is None


def test_a_credit_frees_the_batches_it_covers_and_no_partial_batch():
    fp = producer(window=3)
    fp.out.flush(0, PRIM, (8,))
    fp.out.flush(0, PRIM, (8,))
    fp.out.on_credit(C0P, Credit((1, 1)))  # half of the first batch: frees nothing yet
    assert fp.out.flush(0, PRIM, (8,)) is None
    fp.out.on_credit(C0P, Credit((2, 1)))  # the first batch
    assert sns(fp.out.flush(0, PRIM, (8,))) == [(4, 1), (5, 1)]
    fp.out.on_credit(C0P, Credit((5, 1)))  # cumulative: everything up to (5, 1)
    assert sns(fp.out.flush(0, PRIM, (8,))) == [(6, 1), (7, 1)]


def test_the_bound_still_goes_out_when_the_window_has_no_room():
    fp = FluxProducer(PP, CONSUMERS, 16, 4, window=1)
    fp.out.put(0, (1, 1), "a")
    fp.out.put(0, (3, 1), "c")
    assert fp.out.flush(0, PRIM, (1,)) == Send(PP, C0P, Batch((((1, 1), "a"),), (1,)))
    # (3, 1) waits for room; the bound before it may still advance (DESIGN 4.3)
    assert fp.out.flush(0, PRIM, (3,)) == Send(PP, C0P, Batch((), (3, 0)))
    assert fp.out.flush(0, PRIM, (3,)) is None


def test_a_stale_credit_from_a_consumer_we_no_longer_send_to_is_dropped():
    fp = producer(window=2)
    fp.out.on_credit(C0S, Credit((9, 1)))  # C0S is a secondary: we take its acks, send nothing
    assert sns(fp.out.flush(0, PRIM, (8,))) == [(1, 1), (2, 1)]
    assert fp.out.flush(0, PRIM, (8,)) is None


def test_a_reverse_starts_the_secondary_connection_with_an_empty_window():
    fp = producer(window=2)
    fp.on_reverse(C0S, Reverse(NO_SN))
    assert sns(fp.out.flush(0, SEC, (8,))) == [(1, 1), (2, 1)]
    assert fp.out.flush(0, SEC, (8,)) is None
    fp.out.on_credit(C0S, Credit((2, 1)))  # now its data source: its credits count
    assert sns(fp.out.flush(0, SEC, (8,))) == [(3, 1), (4, 1)]


def test_a_window_below_one_is_refused():
    with pytest.raises(ValueError, match="window must be >= 1"):
        FluxProducer(PP, CONSUMERS, 8, 2, window=0)


# -- the consumer's credits --------------------------------------------------------------

def consumer(credit_every):
    return FluxConsumer(C0P, [(A0P, A0S), (A1P, A1S)], credit_every=credit_every)


def test_credits_go_to_the_data_source_every_credit_every_tuples_taken():
    c = consumer(credit_every=2)
    c.on_batch(A0P, Batch((((1, 1), "a"), ((2, 1), "b"), ((4, 1), "d")), (4,)))
    c.on_batch(A1P, Batch((), (9,)))
    assert not c.credits_due()  # received is not taken
    c.release()
    assert not c.credits_due()
    c.release()
    assert c.credits_due()
    assert c.credits() == [Send(C0P, A0P, Credit((2, 1)))]
    assert not c.credits_due()


def test_a_feed_whose_queue_emptied_is_credited_at_once():
    c = consumer(credit_every=100)
    c.on_batch(A0P, Batch((((1, 1), "a"),), (2,)))
    c.on_batch(A1P, Batch((((2, 1), "b"), ((3, 1), "c")), (3,)))
    c.release()  # (1, 1): feed 0 is empty now
    c.release()  # (2, 1): feed 1 still holds (3, 1)
    assert c.credits() == [Send(C0P, A0P, Credit((1, 1)))]


def test_after_a_take_over_credits_go_to_the_survivor():
    c = consumer(credit_every=1)
    c.on_batch(A0P, Batch((((1, 1), "a"),), (1,)))
    c.on_batch(A1P, Batch((), (5,)))
    assert c.on_fail({A0P}) == [Send(C0P, A0S, Reverse((1, 1)))]
    c.release()
    assert c.credits() == [Send(C0P, A0S, Credit((1, 1)))]


def test_the_ingress_takes_credits_from_both_replicas_of_stage_1():
    builder = MachineBuilder(counting_dataflow(1), 1, capacity=16, batch_size=2, window=2)
    ing = builder.ingress()
    for k in range(4):
        ing.accept((f"k{k}", k))
    assert len(ing.flush(0, PRIM)[0].msg.items) == 2
    assert ing.flush(0, PRIM) == []
    ing.on_message(Addr(1, 0, P), Credit((2,)))
    assert len(ing.flush(0, PRIM)[0].msg.items) == 2
    assert len(ing.flush(0, SEC)[0].msg.items) == 2  # S's window is its own


# -- what a user sees ---------------------------------------------------------------------

def stalled_run(window, inputs=300, partitions=2):
    """Every process of a two-stage dataflow in the simulator's world, every step taken
    in a seeded random order, except that stage 2 partition 0 replica P never takes an
    input: a stuck consumer. Returns (its queue at the end, inputs the ingress accepted)."""
    import random

    from controller.placement import ChainedDeclustering
    from flux.sim.world import World, WorldConfig
    from flux.testing.workloads import keyed_workload

    rng = random.Random(5)
    stuck = Addr(2, 0, P)
    world = World(counting_dataflow(2), keyed_workload(inputs, 5, keys=6), partitions,
                  ChainedDeclustering(2, partitions),
                  WorldConfig(capacity=8, ingress_capacity=8, batch_size=3, window=window), rng)
    while steps := [s for s in world.enabled() if s != ("process", stuck)]:
        world.apply(rng.choice(steps))
    if window is not None:  # what monitoring sees (issue 12): the full windows upstream
        feeding = [world.machine(Addr(1, j, P)).stats() for j in range(partitions)]
        assert all(st.blocked >= 1 and st.in_flight >= window for st in feeding)
        assert world.machine(stuck).stats().taken == 0
        assert world.machine(stuck).stats().queued == world.machine(stuck).fcons.queued()
        assert world.machine(Addr(2, 1, P)).stats().taken > 0  # the other one works
    return world.machine(stuck).fcons.queued(), world.next_input


def test_a_consumer_that_takes_nothing_holds_one_window_per_connection():
    """However much stage 1 has, the stuck replica holds at most a window from each of
    its producers; their buffers fill, their processing stops, and so does the source."""
    queued, accepted = stalled_run(window=4)
    assert 0 < queued <= 4 * 2
    assert accepted < 300
    # without credits the stuck replica would take in everything routed to it
    unbounded, everything = stalled_run(window=None)
    assert everything == 300 and unbounded > 10 * 4 * 2


def test_no_window_is_the_protocol_without_credits():
    fp = FluxProducer(PP, CONSUMERS, 64, 4)
    for n in range(1, 41):
        fp.out.put(0, (n, 1), n)
    sent = 0
    while (send := fp.out.flush(0, PRIM, (40,))) is not None and send.msg.items:
        sent += len(send.msg.items)
    assert sent == 40

