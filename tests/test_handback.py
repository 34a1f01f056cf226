"""The hand-back after a catch-up (docs/design/handback.md), at the consumer: a consumer
that reversed to the active keeps its data until the new replica on its own side has
caught up, then takes each item once, in order, from whichever side, and folds in
after the active's last data. Failures in between lose and repeat nothing."""
from __future__ import annotations

import pytest

from flux.addresses import Addr, P, S
from flux.control_messages import FoldedIn
from flux.data_messages import Ack, Batch, Credit, PSync, Restore, Restored, Reverse, Stay
from flux.effects import Send
from flux.errors import RemoteProtocolError
from flux.protocol.flux_consumer import FluxConsumer
from items import rows

A0P, A0S = Addr(1, 0, P), Addr(1, 0, S)  # A0P the active, A0S the new replica X
A1P, A1S = Addr(1, 1, P), Addr(1, 1, S)
C0S = Addr(2, 0, S)  # its own side's producer (A0S) died: it reversed to A0P
PRODUCERS = [(A0P, A0S), (A1P, A1S)]


def batch(*ks, bound=None):
    """Producer partition 0's batch of items k (connection SN (k, 0), one row each)."""
    its = tuple(((k, 0), rows(((k, 1), f"t{k}"))) for k in ks)
    return Batch(its, (bound if bound is not None else (ks[-1] if ks else 0),))


def held(c):
    return [sn[0] for sn, _ in c.merge.queues[0]]


def folded(effects):
    return [e for e in effects if isinstance(e, FoldedIn)]


def sends(effects, kind):
    return [(e.dst, e.msg) for e in effects if isinstance(e, Send) and isinstance(e.msg, kind)]


def reversed_then_synced():
    """C0S after A0S died and was rebuilt: both psyncs taken, listening to X."""
    c = FluxConsumer(C0S, PRODUCERS)
    c.on_batch(A0S, batch(1))
    assert c.on_fail({A0S}) == [Send(C0S, A0P, Reverse((1, 0)))]
    c.on_avail(A0S, 4)
    c.on_batch(A0P, batch(2))
    assert c.on_psync(A0P, PSync(4, forwards=True)) == []
    c.on_batch(A0P, batch(3))  # the active goes on sending to us
    assert c.ready_for(A0S, PSync(4))
    assert c.on_psync(A0S, PSync(4)) == []  # no fold-in yet: the hand-back runs
    assert c.feeds[0].data_from == P and c.feeds[0].listen == S
    return c


def test_the_new_replica_takes_over_once_it_reaches_what_we_hold():
    c = reversed_then_synced()
    # X restarts at the state's point: behind us, dropped, its window freed
    assert c.on_batch(A0S, batch(2)) == [Send(C0S, A0S, Credit((), 0))]
    c.on_batch(A0P, batch(4))
    assert held(c) == [1, 2, 3, 4]
    # X reaches what we hold: its new items are taken, the active is told to stop
    effects = c.on_batch(A0S, batch(3, 4, 5))
    assert sends(effects, Restore) == [(A0P, Restore(4))]
    assert sends(effects, Ack) == [(A0P, Ack((5, 0), 0))]  # acks to the active again
    assert held(c) == [1, 2, 3, 4, 5]
    assert c.feeds[0].data_from == S and c.feeds[0].ack_to == P
    # the active's data sent before our Restore reached it: only what is new is taken
    c.on_batch(A0P, batch(5, 6))
    assert held(c) == [1, 2, 3, 4, 5, 6]
    assert c.on_restored(A0P, Restored(4)) == []
    # X is behind what the active's last data gave us: dropped until it passes; then
    # (its marks for us exact again) the fold-in is reported
    assert folded(c.on_batch(A0S, batch(6, 7))) == [FoldedIn(C0S, A0S, 4)]
    assert folded(c.on_batch(A0S, batch(8))) == []
    assert held(c) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert not c.feeds[0].in_handback()
    with pytest.raises(RemoteProtocolError):  # the active sends us nothing now
        c.on_batch(A0P, batch(9))


def test_a_bound_past_what_we_hold_is_caught_up_too():
    c = reversed_then_synced()
    effects = c.on_batch(A0S, batch(bound=3))  # nothing X still sends is held already
    assert sends(effects, Restore) == [(A0P, Restore(4))]
    assert c.feeds[0].data_from == S


def test_the_new_replica_dying_while_listened_to_leaves_the_active_sending():
    c = reversed_then_synced()
    # no reverse (the active never stopped), but its take-over waits for our word
    assert c.on_fail({A0S}) == [Send(C0S, A0P, Stay(4))]
    assert c.feeds[0].data_from == P and not c.feeds[0].in_handback()
    c.on_batch(A0P, batch(4))
    assert held(c) == [1, 2, 3, 4]


def test_the_new_replica_dying_before_its_psync_leaves_the_active_sending():
    c = FluxConsumer(C0S, PRODUCERS)
    c.on_batch(A0S, batch(1))
    c.on_fail({A0S})
    c.on_avail(A0S, 4)
    c.on_psync(A0P, PSync(4, forwards=True))
    assert c.on_fail({A0S}) == [Send(C0S, A0P, Stay(4))]
    c.on_batch(A0P, batch(2))
    assert held(c) == [1, 2] and not c.feeds[0].in_handback()


def test_a_stale_forwarding_psync_answers_stay():
    c = FluxConsumer(C0S, PRODUCERS)
    c.on_batch(A0S, batch(1))
    c.on_fail({A0S})
    c.on_avail(A0S, 4)
    assert c.on_fail({A0S}) == []  # X died before the active's psync came
    assert c.on_psync(A0P, PSync(4, forwards=True)) == [Send(C0S, A0P, Stay(4))]
    assert c.feeds[0].data_from == P


def test_the_active_dying_while_we_listen_makes_our_side_the_source():
    c = reversed_then_synced()
    assert c.on_fail({A0P}) == []
    assert c.feeds[0].data_from == S and c.feeds[0].ack_to is None
    effects = c.on_batch(A0S, batch(2, 3, 4))  # the first new item is taken, once
    assert folded(effects) == [FoldedIn(C0S, A0S, 4)] and sends(effects, Restore) == []
    assert held(c) == [1, 2, 3, 4]
    c.on_batch(A0S, batch(5))
    assert held(c) == [1, 2, 3, 4, 5] and not c.feeds[0].in_handback()


def test_the_new_replica_dying_after_the_switch_reverses_to_the_active():
    c = reversed_then_synced()
    c.on_batch(A0S, batch(3, 4))  # switch: Restore on its way to A0P
    assert held(c) == [1, 2, 3, 4]
    assert c.on_fail({A0S}) == [Send(C0S, A0P, Reverse((4, 0)))]
    assert folded(c.on_batch(A0P, batch(4, 5))) == []  # sent before it got our Restore
    assert c.on_restored(A0P, Restored(4)) == []  # no fold-in: the new replica is gone
    # after the reverse, from after (4, 0): what the last data gave us is dropped
    c.on_batch(A0P, batch(5, 6))
    c.on_batch(A0P, batch(7))
    assert held(c) == [1, 2, 3, 4, 5, 6, 7] and not c.feeds[0].in_handback()


def test_the_active_dying_after_the_switch_waits_for_no_restored():
    c = reversed_then_synced()
    c.on_batch(A0S, batch(3, 4))
    c.on_batch(A0P, batch(5))  # the active's last data, ahead of X
    effects = c.on_fail({A0P})
    assert effects == [] and c.feeds[0].ack_to is None  # X has not sent (5, 0) yet
    assert c.on_restored(A0P, Restored(4)) == []
    assert folded(c.on_batch(A0S, batch(5, 6))) == [FoldedIn(C0S, A0S, 4)]
    assert held(c) == [1, 2, 3, 4, 5, 6]


def test_the_active_dying_once_we_have_all_of_ours_folds_in_at_once():
    c = reversed_then_synced()
    c.on_batch(A0S, batch(3, 4))
    assert folded(c.on_fail({A0P})) == [FoldedIn(C0S, A0S, 4)]


def test_the_listened_replica_is_credited_as_the_merge_gives_items_out():
    c = reversed_then_synced()
    c.on_batch(A1S, Batch((((9, 1), rows(((9, 2), "u"))),), (9,)))  # lets 0's items out
    c.release()
    assert sends(c.credits(), Credit) == [(A0P, Credit((1, 0), 0)), (A0S, Credit((1, 0), 0))]
