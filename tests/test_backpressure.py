"""Back-pressure by credits (docs/design/backpressure.md): exact transitions of the window at a
producer and of the credits at a consumer, and what a user sees: a consumer that does
not take holds at most a window per connection, whatever the producer has.

Windows and credits count sub-items (DESIGN 11): producer partition p's part of item x,
connection SN ``(x, p)``; a credit is the connection SN of the last one taken."""
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
from items import rows

pytestmark = pytest.mark.timeout(120)

PP = Addr(1, 0, P)
C0P, C0S = Addr(2, 0, P), Addr(2, 0, S)
C1P, C1S = Addr(2, 1, P), Addr(2, 1, S)
CONSUMERS = [(C0P, C0S), (C1P, C1S)]
A0P, A0S = Addr(1, 0, P), Addr(1, 0, S)
A1P, A1S = Addr(1, 1, P), Addr(1, 1, S)


def sub(x, record):
    """Producer partition 0's part of item x: one row, the first output of input x."""
    return rows(((x, 1), record))


def producer(window, batch_size=2, capacity=16):
    fp = FluxProducer(PP, CONSUMERS, capacity, batch_size, window=window)
    for x in range(1, 9):
        fp.out.put(0, (x, 0), sub(x, f"t{x}"))
    return fp


def sns(send):
    return [sn for sn, _ in send.msg.items]


# -- the producer's window ---------------------------------------------------------------

def test_a_connection_carries_at_most_a_window_of_untaken_sub_items():
    fp = producer(window=3)
    assert sns(fp.out.flush(0, PRIM, (8,))) == [(1, 0), (2, 0)]
    assert sns(fp.out.flush(0, PRIM, (8,))) == [(3, 0)]  # one left in the window
    # full: nothing more, not even the bound (it stays before the first unsent sub-item)
    assert (0, PRIM) not in fp.out.flushable((8,))
    assert fp.out.flush(0, PRIM, (8,)) is None


def test_a_credit_frees_the_batches_it_covers_and_no_partial_batch():
    fp = producer(window=3)
    fp.out.flush(0, PRIM, (8,))
    fp.out.flush(0, PRIM, (8,))
    fp.out.on_credit(C0P, Credit((1, 0)))  # half of the first batch: frees nothing yet
    assert fp.out.flush(0, PRIM, (8,)) is None
    fp.out.on_credit(C0P, Credit((2, 0)))  # the first batch
    assert sns(fp.out.flush(0, PRIM, (8,))) == [(4, 0), (5, 0)]
    fp.out.on_credit(C0P, Credit((5, 0)))  # cumulative: everything up to (5, 0)
    assert sns(fp.out.flush(0, PRIM, (8,))) == [(6, 0), (7, 0)]


def test_the_bound_still_goes_out_when_the_window_has_no_room():
    fp = FluxProducer(PP, CONSUMERS, 16, 4, window=1)
    a, c = sub(1, "a"), sub(3, "c")
    fp.out.put(0, (1, 0), a)
    fp.out.put(0, (3, 0), c)
    assert fp.out.flush(0, PRIM, (1,)) == Send(PP, C0P, Batch((((1, 0), a),), (1,)))
    # (3, 0) waits for room; the bound before it may still advance (DESIGN 4.3): it
    # covers item 2 (no part for this consumer), not item 3
    assert fp.out.flush(0, PRIM, (3,)) == Send(PP, C0P, Batch((), (3, -1)))
    assert fp.out.flush(0, PRIM, (3,)) is None


def test_a_stale_credit_from_a_consumer_we_no_longer_send_to_is_dropped():
    fp = producer(window=2)
    fp.out.on_credit(C0S, Credit((9, 0)))  # C0S is a secondary: we take its acks, send nothing
    assert sns(fp.out.flush(0, PRIM, (8,))) == [(1, 0), (2, 0)]
    assert fp.out.flush(0, PRIM, (8,)) is None


def test_a_reverse_starts_the_secondary_connection_with_an_empty_window():
    fp = producer(window=2)
    fp.on_reverse(C0S, Reverse(NO_SN))
    assert sns(fp.out.flush(0, SEC, (8,))) == [(1, 0), (2, 0)]
    assert fp.out.flush(0, SEC, (8,)) is None
    fp.out.on_credit(C0S, Credit((2, 0)))  # now its data source: its credits count
    assert sns(fp.out.flush(0, SEC, (8,))) == [(3, 0), (4, 0)]


def test_a_window_below_one_is_refused():
    with pytest.raises(ValueError, match="window must be >= 1"):
        FluxProducer(PP, CONSUMERS, 8, 2, window=0)


# -- the consumer's credits --------------------------------------------------------------

def consumer(credit_every):
    return FluxConsumer(C0P, [(A0P, A0S), (A1P, A1S)], credit_every=credit_every)


def part(sn):
    """Producer partition ``sn[1]``'s part of item ``sn[0]``: one row, the first output of
    input ``sn[0]``."""
    return sn, rows(((sn[0], 1), f"t{sn}"))


def test_credits_go_to_the_data_source_every_credit_every_sub_items_taken():
    c = consumer(credit_every=2)
    c.on_batch(A0P, Batch((part((1, 0)), part((2, 0)), part((4, 0))), (4,)))
    c.on_batch(A1P, Batch((), (9,)))
    assert not c.credits_due()  # received is not taken
    assert c.release()[0] == (1,)
    assert not c.credits_due()
    assert c.release()[0] == (2,)
    assert c.credits_due()
    assert c.credits() == [Send(C0P, A0P, Credit((2, 0)))]
    assert not c.credits_due()


def test_each_part_of_an_item_counts_toward_its_own_feeds_credit():
    c = consumer(credit_every=2)
    c.on_batch(A0P, Batch((part((1, 0)), part((3, 0)), part((5, 0))), (5,)))
    c.on_batch(A1P, Batch((((3, 1), rows(((2, 1), "b"))), ((5, 1), rows(((4, 1), "d"))),
                           part((7, 1))), (7,)))
    x, item = c.release()
    assert x == (1,) and not c.credits_due()
    x, item = c.release()  # item 3: a part from each feed, rows merged by row SN
    assert x == (3,) and item.pairs() == [((2, 1), "b"), ((3, 1), "t(3, 0)")]
    # feed 0 took 2 sub-items: due; feed 1 took 1 and still holds (5, 1), (7, 1): not
    assert c.credits() == [Send(C0P, A0P, Credit((3, 0)))]
    assert [(f.owed, f.taken) for f in c.feeds] == [(0, (3, 0)), (1, (3, 1))]
    x, item = c.release()  # item 5: feed 0 is empty now
    assert x == (5,) and item.pairs() == [((4, 1), "d"), ((5, 1), "t(5, 0)")]
    assert c.credits() == [Send(C0P, A0P, Credit((5, 0))), Send(C0P, A1P, Credit((5, 1)))]


def test_a_feed_whose_queue_emptied_is_credited_at_once():
    c = consumer(credit_every=100)
    c.on_batch(A0P, Batch((part((1, 0)),), (2,)))
    c.on_batch(A1P, Batch((part((2, 1)), part((3, 1))), (3,)))
    assert c.release()[0] == (1,)  # (1, 0): feed 0 is empty now
    assert c.release()[0] == (2,)  # (2, 1): feed 1 still holds (3, 1)
    assert c.credits() == [Send(C0P, A0P, Credit((1, 0)))]


def test_after_a_take_over_credits_go_to_the_survivor():
    c = consumer(credit_every=1)
    c.on_batch(A0P, Batch((part((1, 0)),), (1,)))
    c.on_batch(A1P, Batch((), (5,)))
    assert c.on_fail({A0P}) == [Send(C0P, A0S, Reverse((1, 0)))]
    assert c.release()[0] == (1,)
    assert c.credits() == [Send(C0P, A0S, Credit((1, 0)))]


def test_the_ingress_takes_credits_from_both_replicas_of_stage_1():
    # items of two inputs: the window counts sub-items, not inputs
    builder = MachineBuilder(counting_dataflow(1), 1, capacity=16, batch_size=2, window=2,
                             batch_rows=2)
    ing = builder.ingress()
    for k in range(8):
        ing.accept((f"k{k}", k))
    first = ing.flush(0, PRIM)[0].msg.items
    assert [sn for sn, _ in first] == [(2, 0), (4, 0)]
    assert [len(sub) for _, sub in first] == [2, 2]
    assert ing.flush(0, PRIM) == []
    ing.on_message(Addr(1, 0, P), Credit((4, 0)))
    assert [sn for sn, _ in ing.flush(0, PRIM)[0].msg.items] == [(6, 0), (8, 0)]
    assert [sn for sn, _ in ing.flush(0, SEC)[0].msg.items] == [(2, 0), (4, 0)]  # S's own window


# -- what a user sees ---------------------------------------------------------------------

def stalled_run(window, inputs=300, partitions=2):
    """Every process of a two-stage dataflow in the simulator's world, every step taken
    in a seeded random order, except that stage 2 partition 0 replica P never takes an
    item: a stuck consumer. Returns (the sub-items it holds at the end, inputs the
    ingress accepted)."""
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
    if window is not None:  # what monitoring sees: the full windows upstream
        feeding = [world.machine(Addr(1, j, P)).stats() for j in range(partitions)]
        assert all(st.blocked >= 1 and st.in_flight >= window for st in feeding)
        assert world.machine(stuck).stats().taken == 0
        assert world.machine(stuck).stats().queued == world.machine(stuck).fcons.queued()
        assert world.machine(Addr(2, 1, P)).stats().taken > 0  # the other one works
    return world.machine(stuck).fcons.queued(), world.next_input


def test_a_consumer_that_takes_nothing_holds_one_window_per_connection():
    """However much stage 1 has, the stuck replica holds at most a window of sub-items
    from each of its producers; their buffers fill, their processing stops, and so does
    the source."""
    queued, accepted = stalled_run(window=4)
    assert 0 < queued <= 4 * 2
    assert accepted < 300
    # without credits the stuck replica would take in everything routed to it
    unbounded, everything = stalled_run(window=None)
    assert everything == 300 and unbounded > 10 * 4 * 2


def test_no_window_is_the_protocol_without_credits():
    fp = FluxProducer(PP, CONSUMERS, 64, 4)
    for x in range(1, 41):
        fp.out.put(0, (x, 0), sub(x, x))
    sent = 0
    while (send := fp.out.flush(0, PRIM, (40,))) is not None and send.msg.items:
        sent += len(send.msg.items)
    assert sent == 40

