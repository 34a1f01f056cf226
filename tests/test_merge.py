"""Exact transitions of the order-preserving merge (exchange/merge.py; paper 4.1, DESIGN 4.3, 11).

A tuple is a sub-item (docs/design/batches.md): producer partition ``p`` sends its part
of item ``x`` under the connection SN ``(x, p)``. The merge releases whole items:
the smallest head's item once every producer has a later SN queued or a bound that
covers the item.

Bound semantics (flux/sequence.covers): a bound ``b`` on a connection proves
that no SN with a prefix <= ``b`` will still arrive on it; so ``(x,)`` covers every
sub-item of item ``x``, and ``(x, p)`` only those up to ``(x, p)``.
"""
from __future__ import annotations

import random

import msgpack
import pytest

from exchange.merge import OrderedMerge
from exchange.rows import Rows
from flux.errors import RemoteProtocolError
from flux.sequence import NO_PROGRESS, NO_SN, before, bound_key, item_bound
from items import rows

pytestmark = pytest.mark.timeout(60)


def item(sn):
    return (sn, f"r{'.'.join(map(str, sn))}")


def items(*sns):
    return [item(sn) for sn in sns]


def released(m):
    """Pop every item the merge may release now: per item, its ``(producer, sub-item)``."""
    out = []
    while m.ready():
        out.append(m.pop_item())
    return out


def sns(out):
    """The connection SNs of released items, item by item."""
    return [[sn for _, (sn, _) in parts] for parts in out]


# --- construction -------------------------------------------------------------

def test_fresh_merge_state():
    m = OrderedMerge(["a", "b"])
    assert m.bounds == {"a": NO_PROGRESS, "b": NO_PROGRESS}
    assert m.last == {"a": NO_SN, "b": NO_SN}
    assert m.queued() == 0
    assert m.head() is None
    assert not m.ready()
    with pytest.raises(LookupError):
        m.pop_item()
    assert m.frontier() == NO_PROGRESS


def test_a_merge_needs_a_producer():
    with pytest.raises(ValueError):
        OrderedMerge([])


def test_push_returns_last_sn_and_queues_items():
    m = OrderedMerge([0, 1])
    assert m.push(0, items((1, 0), (4, 0)), (4,)) == (4, 0)
    assert m.last[0] == (4, 0)
    assert m.bounds[0] == (4,)
    assert list(m.queues[0]) == items((1, 0), (4, 0))
    # A bound-only push keeps the last SN.
    assert m.push(0, [], (6,)) == (4, 0)
    assert m.bounds[0] == (6,)
    assert m.queued() == 2


# --- release order ----------------------------------------------------------------

def test_release_in_global_sn_order_across_producers():
    m = OrderedMerge([0, 1, 2])
    m.push(0, items((1, 0), (5, 0), (6, 0)), (6,))
    m.push(1, items((2, 1), (3, 1)), (7,))
    m.push(2, items((4, 2), (8, 2)), (8,))
    assert sns(released(m)) == [[(1, 0)], [(2, 1)], [(3, 1)], [(4, 2)], [(5, 0)], [(6, 0)]]
    # 0 is empty with bound (6,), 1 is empty with bound (7,): neither covers
    # item 8, so (8, 2) is held until both do.
    assert list(m.queues[2]) == items((8, 2))
    assert not m.ready()
    m.bound(0, (8,))
    assert not m.ready()
    m.bound(1, (9,))
    assert sns(released(m)) == [[(8, 2)]]
    assert m.queued() == 0


def test_parts_of_one_item_come_out_together_in_sn_order():
    m = OrderedMerge([0, 1, 2])
    # pushed in another order than their SNs; item 3 has no part from producer 1
    m.push(2, items((3, 2), (5, 2)), (5,))
    m.push(0, items((3, 0), (5, 0)), (5,))
    m.push(1, items((5, 1)), (5,))
    assert m.pop_item() == [(0, item((3, 0))), (2, item((3, 2)))]
    assert m.pop_item() == [(0, item((5, 0))), (1, item((5, 1))), (2, item((5, 2)))]
    assert not m.ready() and m.queued() == 0


def test_pop_item_returns_the_exact_parts_and_raises_when_nothing_is_releasable():
    m = OrderedMerge(["a", "b"])
    m.push("a", [((1, 0), "x")], (1,))
    with pytest.raises(LookupError):
        m.pop_item()  # b's bound (0,) does not cover item 1
    m.push("b", [((2, 1), "y")], (2,))
    assert m.pop_item() == [("a", ((1, 0), "x"))]
    assert m.head() == ("b", (2, 1))
    # a is empty, its bound (1,) does not cover item 2
    with pytest.raises(LookupError):
        m.pop_item()
    assert m.queued() == 1


def test_an_item_is_held_while_one_producer_has_neither_a_later_sn_nor_a_covering_bound():
    m = OrderedMerge(["a", "b", "c"])
    m.push("a", items((5, 0)), (5,))
    assert m.head() == ("a", (5, 0))
    assert not m.ready()
    m.bound("b", (4,))  # b might still send its part of item 5
    assert not m.ready()
    m.bound("b", (5, 0))  # a bound inside item 5: (5, 1) may still come from b
    assert not m.ready()
    m.bound("b", (5,))  # covers item 5 ...
    assert not m.ready()  # ... but c (bound (0,)) still blocks
    m.push("c", items((5, 2)))  # c's part, with no bound: c may send more of item 5
    assert not m.ready()
    m.push("c", items((7, 2)))  # a later SN queued proves c sent all of item 5
    assert m.ready()
    assert m.pop_item() == [("a", item((5, 0))), ("c", item((5, 2)))]
    assert m.head() == ("c", (7, 2))
    assert not m.ready()


def test_a_producer_holding_a_part_must_also_prove_the_item_complete():
    # Its own last SN (5, 0) does not cover item 5: the merge knows connection SNs, not
    # which partition a producer is, so only a later SN or a bound covering (5,) will do.
    m = OrderedMerge(["a", "b"])
    m.push("a", items((5, 0)), (5, 0))
    m.bound("b", (9,))
    assert not m.ready()
    m.bound("a", (5,))
    assert m.pop_item() == [("a", item((5, 0)))]


def test_covering_uses_bound_prefixes_for_longer_sns():
    # Item numbers of several ingresses are (epoch, ingress) (batches.md): connection SNs
    # are three long, and bounds of any length cover by prefix.
    m = OrderedMerge(["a", "b"])
    m.push("a", items((5, 2, 0)), (5, 2))
    m.bound("b", (5, 1))  # b may still send its part of item (5, 2)
    assert not m.ready()
    m.bound("b", (5, 2, 0))  # ... even now: (5, 2, 1) is not covered
    assert not m.ready()
    m.bound("b", (5,))  # nothing with prefix <= (5,) will come from b
    assert m.pop_item() == [("a", item((5, 2, 0)))]
    m.push("a", items((5, 3, 0)), (5, 3))
    m.push("b", items((5, 3, 1)), (5, 3))
    assert m.pop_item() == [("a", item((5, 3, 0))), ("b", item((5, 3, 1)))]


def test_a_later_item_queued_at_every_producer_proves_the_earlier_complete():
    m = OrderedMerge(["a", "b"])
    m.push("a", items((3, 0)))
    m.push("b", items((2, 1)))
    assert m.head() == ("b", (2, 1))
    # a's head (3, 0) proves a sends nothing more of item 2, but b's last SN (2, 1)
    # does not prove b sent all of it.
    assert not m.ready()
    m.push("b", items((3, 1)))
    # item 2 goes; item 3 is held: neither producer sent a later SN or a bound.
    assert sns(released(m)) == [[(2, 1)]]
    assert not m.ready()
    m.push("b", items((4, 1)))
    assert not m.ready()  # a still may send more of item 3
    m.bound("a", (3,))
    assert sns(released(m)) == [[(3, 0), (3, 1)]]
    assert m.head() == ("b", (4, 1)) and not m.ready()


def test_idle_producer_with_advancing_bound_never_stalls():
    m = OrderedMerge(["busy", "idle"])
    out = []
    for n in range(1, 8):
        m.push("busy", items((n, 0)), (n,))
        assert not m.ready()  # idle's bound is still (n - 1,)
        m.bound("idle", (n,))
        out += released(m)
        assert sns(out) == [[(k, 0)] for k in range(1, n + 1)]
    assert m.queued() == 0
    assert m.last["idle"] == NO_SN


def test_bounds_never_move_back():
    m = OrderedMerge(["a", "b"])
    m.bound("b", (7,))
    m.bound("b", (3,))
    assert m.bounds["b"] == (7,)
    m.push("b", [], (2,))
    assert m.bounds["b"] == (7,)
    m.push("a", items((6, 0)), (6,))
    assert m.pop_item() == [("a", item((6, 0)))]  # still covered by the kept (7,)
    # Longer but weaker bound: (7, 3) is below (7,) + (inf,).
    m.bound("b", (7, 3))
    assert m.bounds["b"] == (7,)
    m.bound("b", (8, 0))
    assert m.bounds["b"] == (8, 0)


# --- protocol errors ----------------------------------------------------------------

def test_duplicate_sn_raises():
    m = OrderedMerge(["a", "b"])
    m.push("a", items((1, 0), (2, 0)))
    with pytest.raises(RemoteProtocolError):
        m.push("a", items((2, 0)))
    with pytest.raises(RemoteProtocolError):
        m.push("a", items((1, 0)))


def test_out_of_order_within_a_batch_raises():
    m = OrderedMerge(["a"])
    with pytest.raises(RemoteProtocolError):
        m.push("a", items((3, 0), (2, 0)))
    m2 = OrderedMerge(["a"])
    with pytest.raises(RemoteProtocolError):
        m2.push("a", items((4, 0), (4, 0)))


def test_same_sn_on_different_producers_is_each_checked_separately():
    # The check is per connection; the other producer's SNs do not count.
    m = OrderedMerge(["a", "b"])
    m.push("a", items((3, 0)))
    assert m.push("b", items((1, 1), (2, 1))) == (2, 1)


def test_a_rejected_batch_changes_nothing():
    m = OrderedMerge([0])
    m.push(0, [((1, 0), "a")])
    with pytest.raises(RemoteProtocolError):
        m.push(0, [((2, 0), "b"), ((2, 0), "b-again")])
    assert m.last[0] == (1, 0)
    assert m.queued() == 1


# --- frontier ----------------------------------------------------------------------

def test_frontier_exact_values():
    m = OrderedMerge(["a", "b"])
    m.push("a", items((3, 0), (5, 0)))
    # a: before((3, 0)) = (3, -1); b: bound (0,), nothing received.
    assert m.frontier() == (0,)
    m.bound("b", (7,))
    assert m.frontier() == (3, -1)
    assert item_bound(m.frontier()) == (2,)  # item 3 is still to come, whole
    assert m.pop_item() == [("a", item((3, 0)))]  # a's (5, 0) proves item 3 complete
    assert m.frontier() == (5, -1)  # before((5, 0))
    assert item_bound(m.frontier()) == (4,)
    m.bound("a", (5,))
    assert m.pop_item() == [("a", item((5, 0)))]
    # a empty: its bound (5,) is stronger than its last SN (5, 0), and is used.
    assert m.frontier() == (5,)
    assert item_bound(m.frontier()) == (5,)
    m.bound("a", (9,))
    assert m.frontier() == (7,)  # b's bound (7,) is now the weakest
    m.bound("b", (12,))
    assert m.frontier() == (9,)


def test_frontier_inside_an_item():
    m = OrderedMerge(["a", "b"])
    m.push("a", items((2, 1)), (2, 0))
    m.bound("b", (4,))
    assert m.frontier() == (2, 0)  # before((2, 1))
    assert item_bound(m.frontier()) == (1,)  # part of item 2 may still be released
    assert not m.ready()
    m.bound("a", (2,))
    m.pop_item()
    assert m.frontier() == (2,)  # a's bound
    assert item_bound(m.frontier()) == (2,)


def test_frontier_empty_queue_uses_last_sn_when_its_bound_is_weaker():
    # A producer that gave no bound is bounded by what it sent: before its head while
    # it is queued; once released, its last SN (a later SN sent is what proved the item).
    m = OrderedMerge(["a"])
    m.push("a", items((3, 0)))  # no bound
    assert m.frontier() == (3, -1)
    assert not m.ready()
    m.push("a", items((6, 0)))  # no bound: a later SN proves item 3 complete
    assert m.pop_item() == [("a", item((3, 0)))]
    assert m.bounds["a"] == NO_PROGRESS
    assert m.frontier() == (6, -1)
    # a state with an empty queue and a bound weaker than the last SN (DESIGN 4.6)
    m.install_state([["a", [], [0], [6, 0]]])
    assert m.frontier() == (6, 0)
    assert item_bound(m.frontier()) == (5,)


# --- state movement (DESIGN 4.6) ------------------------------------------------------

def test_state_round_trip_through_msgpack_with_rows_payloads():
    m = OrderedMerge([0, 1])
    first, second = rows(((1, 1), "a"), ((2, 1), "b")), rows(((2, 2), "c"))
    m.push(0, [((2, 0), first), ((4, 0), rows(((4, 1), "d")))], (3,))
    m.push(1, [((2, 1), second)], (2, 1))
    state = msgpack.unpackb(msgpack.packb(m.to_state(Rows.to_state), use_bin_type=True),
                            raw=False)
    copy = OrderedMerge([0, 1])
    copy.install_state(state, Rows.from_state)
    for merge in (m, copy):
        assert merge.bounds == {0: (3,), 1: (2, 1)} and merge.last == {0: (4, 0), 1: (2, 1)}
        assert merge.frontier() == (2, -1)
        assert not merge.ready()  # 1's last SN (2, 1) does not prove item 2 complete
        merge.bound(1, (3,))
        parts = merge.pop_item()
        assert [(p, sn) for p, (sn, _) in parts] == [(0, (2, 0)), (1, (2, 1))]
        assert [sub.pairs() for _, (_, sub) in parts] == [first.pairs(), second.pairs()]
        assert not merge.ready() and merge.queued() == 1
        merge.check_invariants()


def test_state_naming_an_unknown_producer_is_refused():
    m = OrderedMerge([0])
    with pytest.raises(ValueError):
        m.install_state([[5, [], [0], []]])


# --- items released whole, at random (DESIGN 11) ---------------------------------------

def _random_run(seed):
    """Producers send their parts of items 1..120 (each item has a part at a random subset
    of them) in random batches with random true bounds, whole items or inside one; after
    every push the merge releases what it may. Checks at every step that it releases an
    item exactly when every producer has proved the item complete (a later SN pushed or a
    bound covering it), whole and in SN order; returns the released items."""
    rng = random.Random(seed)
    producers = list(range(rng.randint(1, 4)))
    m = OrderedMerge(producers)
    plan = {p: [((x, p), f"{x}.{p}") for x in range(1, 121) if rng.random() < 0.5]
            for p in producers}
    parts_of = {}
    for p in producers:
        for sub in plan[p]:
            parts_of.setdefault(sub[0][0], []).append(sub)
    fed = {p: 0 for p in producers}
    told = {p: NO_PROGRESS for p in producers}  # the strongest bound each one pushed
    out = []

    def proved(p, x):  # producer p can send nothing more of item x
        sent_later = fed[p] and plan[p][fed[p] - 1][0][0] > x
        return sent_later or bound_key(told[p]) >= bound_key((x,))

    for _ in range(120):
        p = rng.choice(producers)
        batch = plan[p][fed[p]:fed[p] + rng.randint(0, 4)]
        fed[p] += len(batch)
        bound = None
        if rng.random() < 0.7:
            nxt = plan[p][fed[p]][0] if fed[p] < len(plan[p]) else (1000, p)
            # a true bound: below the next sub-item, as a whole item or inside it
            bound = rng.choice([(rng.randint(0, nxt[0] - 1),), before(nxt)])
            if bound_key(bound) > bound_key(told[p]):
                told[p] = bound
        m.push(p, batch, bound)
        m.check_invariants()
        while m.ready():
            head_item = m.head()[1][:-1]
            assert all(proved(q, head_item[0]) for q in producers)
            parts = m.pop_item()
            m.check_invariants()
            got = [sub for _, sub in parts]
            assert got == sorted(parts_of[head_item[0]])  # whole, in SN order
            assert all(sn == (head_item[0], q) for q, (sn, _) in parts)
            out.append(got)
        if m.head() is not None:  # held: some producer has not proved it complete
            assert not all(proved(q, m.head()[1][0]) for q in producers)
    # the rest, with bounds past every item: everything comes out
    for p in producers:
        m.push(p, plan[p][fed[p]:], (1000,))
    out += [[sub for _, sub in parts] for parts in released(m)]
    assert m.queued() == 0
    return out


@pytest.mark.parametrize("seed", range(60))
def test_items_are_released_whole_in_sn_order_as_soon_as_proved_complete(seed):
    out = _random_run(seed)
    subs = [sub for parts in out for sub in parts]
    assert [sub[0] for sub in subs] == sorted(sn for sn, _ in subs)
    items_out = [parts[0][0][0] for parts in out]
    assert items_out == sorted(set(items_out))  # one release per item
