"""Exact transitions of the order-preserving merge (exchange/merge.py; paper 4.1, DESIGN 4.3).

Bound semantics (flux/sequence.covers): a bound ``b`` on a connection proves
that no SN with a prefix <= ``b`` will still arrive on it.
"""
from __future__ import annotations

import pytest

from exchange.merge import OrderedMerge
from flux.errors import RemoteProtocolError
from flux.sequence import NO_PROGRESS, NO_SN


def item(sn):
    return (sn, f"r{'.'.join(map(str, sn))}")


def items(*sns):
    return [item(sn) for sn in sns]


def sns(released):
    return [sn for sn, _ in released]


# --- construction -------------------------------------------------------------

def test_fresh_merge_state():
    m = OrderedMerge(["a", "b"])
    assert m.bounds == {"a": NO_PROGRESS, "b": NO_PROGRESS}
    assert m.last == {"a": NO_SN, "b": NO_SN}
    assert m.queued() == 0
    assert m.head() is None
    assert not m.ready()
    assert m.pop_ready() == []
    assert m.frontier() == NO_PROGRESS


def test_a_merge_needs_a_producer():
    with pytest.raises(ValueError):
        OrderedMerge([])


def test_push_returns_last_sn_and_queues_items():
    m = OrderedMerge(["a", "b"])
    assert m.push("a", items((1,), (4,)), (4,)) == (4,)
    assert m.last["a"] == (4,)
    assert m.bounds["a"] == (4,)
    assert list(m.queues["a"]) == items((1,), (4,))
    # A bound-only push keeps the last SN.
    assert m.push("a", [], (6,)) == (4,)
    assert m.bounds["a"] == (6,)
    assert m.queued() == 2


# --- release order ----------------------------------------------------------------

def test_release_in_global_sn_order_across_producers():
    m = OrderedMerge(["a", "b", "c"])
    m.push("a", items((1,), (5,), (6,)), (6,))
    m.push("b", items((2,), (3,)), (7,))
    m.push("c", items((4,), (8,)), (8,))
    assert sns(m.pop_ready()) == [(1,), (2,), (3,), (4,), (5,), (6,)]
    # a is empty with bound (6,), b is empty with bound (7,): neither covers
    # (8,) from c, so it is held until both do.
    assert list(m.queues["c"]) == items((8,))
    assert not m.ready()
    m.bound("a", (8,))
    assert not m.ready()
    m.bound("b", (9,))
    assert sns(m.pop_ready()) == [(8,)]
    assert m.queued() == 0


def test_pop_returns_the_exact_item_and_raises_when_nothing_is_releasable():
    m = OrderedMerge(["a", "b"])
    m.push("a", [((1,), "x")], (1,))
    with pytest.raises(LookupError):
        m.pop()  # b's bound (0,) does not cover (1,)
    m.push("b", [((2,), "y")], (2,))
    assert m.pop() == ((1,), "x")
    assert m.head() == ("b", (2,))
    # a is empty, its bound (1,) does not cover (2,)
    with pytest.raises(LookupError):
        m.pop()


def test_head_held_until_every_empty_producers_bound_covers_it():
    m = OrderedMerge(["a", "b", "c"])
    m.push("a", items((5,)), (5,))
    assert m.head() == ("a", (5,))
    assert not m.ready()
    m.bound("b", (4,))  # b might still send (5,)
    assert not m.ready()
    m.bound("b", (5,))  # covers (5,) ...
    assert not m.ready()  # ... but c (bound (0,)) still blocks
    m.bound("c", (9,))
    assert m.ready()
    assert m.pop_ready() == items((5,))


def test_covering_uses_bound_prefixes_for_longer_sns():
    m = OrderedMerge(["a", "b"])
    m.push("a", items((5, 2)), (5, 2))
    m.bound("b", (5, 1))  # b may still send (5, 2)
    assert not m.ready()
    m.bound("b", (5,))  # nothing with prefix <= (5,) will come from b
    assert m.pop_ready() == items((5, 2))


def test_a_nonempty_other_queue_with_a_larger_head_allows_release():
    m = OrderedMerge(["a", "b"])
    m.push("a", items((3,)))
    m.push("b", items((2,)))
    assert m.head() == ("b", (2,))
    # b's head (2,) is released: a's head (3,) proves nothing smaller comes.
    assert m.pop() == item((2,))
    # a's (3,) is held: b is empty and its last SN (2,) does not cover (3,).
    assert not m.ready()


def test_idle_producer_with_advancing_bound_never_stalls():
    m = OrderedMerge(["busy", "idle"])
    released = []
    for n in range(1, 8):
        m.push("busy", items((n,)), (n,))
        assert not m.ready()  # idle's bound is still (n - 1,)
        m.bound("idle", (n,))
        released += m.pop_ready()
        assert sns(released) == [(k,) for k in range(1, n + 1)]
    assert m.queued() == 0
    assert m.last["idle"] == NO_SN


def test_bounds_never_move_back():
    m = OrderedMerge(["a", "b"])
    m.bound("b", (7,))
    m.bound("b", (3,))
    assert m.bounds["b"] == (7,)
    m.push("b", [], (2,))
    assert m.bounds["b"] == (7,)
    m.push("a", items((6,)), (6,))
    assert m.pop_ready() == items((6,))  # still covered by the kept (7,)
    # Longer but weaker bound: (7, 3) is below (7,) + (inf,).
    m.bound("b", (7, 3))
    assert m.bounds["b"] == (7,)
    m.bound("b", (8, 0))
    assert m.bounds["b"] == (8, 0)


# --- protocol errors ----------------------------------------------------------------

def test_duplicate_sn_raises():
    m = OrderedMerge(["a", "b"])
    m.push("a", items((1,), (2,)))
    with pytest.raises(RemoteProtocolError):
        m.push("a", items((2,)))
    with pytest.raises(RemoteProtocolError):
        m.push("a", items((1,)))


def test_out_of_order_within_a_batch_raises():
    m = OrderedMerge(["a"])
    with pytest.raises(RemoteProtocolError):
        m.push("a", items((3,), (2,)))
    m2 = OrderedMerge(["a"])
    with pytest.raises(RemoteProtocolError):
        m2.push("a", items((4,), (4,)))


def test_same_sn_on_different_producers_is_each_checked_separately():
    # The check is per connection; the other producer's SNs do not count.
    m = OrderedMerge(["a", "b"])
    m.push("a", items((3,)))
    assert m.push("b", items((1,), (2,))) == (2,)


# --- frontier ----------------------------------------------------------------------

def test_frontier_exact_values():
    m = OrderedMerge(["a", "b"])
    m.push("a", items((3,), (5,)))
    # a: before((3,)) = (2,); b: bound (0,), nothing received.
    assert m.frontier() == (0,)
    m.bound("b", (7,))
    assert m.frontier() == (2,)
    assert m.pop() == item((3,))
    assert m.frontier() == (4,)  # before((5,))
    assert m.pop() == item((5,))
    # a empty: its bound (0,) is weaker than its last SN (5,), which is used.
    assert m.frontier() == (5,)
    m.bound("a", (9,))
    assert m.frontier() == (7,)  # b's bound (7,) is now the weakest
    m.bound("b", (12,))
    assert m.frontier() == (9,)


def test_frontier_of_a_longer_sn_head():
    m = OrderedMerge(["a", "b"])
    m.push("a", items((2, 1)), (2, 1))
    m.bound("b", (4,))
    assert m.frontier() == (2, 0)
    m.pop()
    assert m.frontier() == (2, 1)  # a's bound = its last SN


def test_frontier_empty_queue_uses_last_sn_when_no_bound_was_given():
    m = OrderedMerge(["a"])
    m.push("a", items((3,)))  # no bound
    assert m.frontier() == (2,)
    m.pop()
    assert m.bounds["a"] == NO_PROGRESS
    assert m.frontier() == (3,)


def test_a_rejected_batch_changes_nothing():
    m = OrderedMerge([0])
    m.push(0, [((1,), "a")])
    with pytest.raises(RemoteProtocolError):
        m.push(0, [((2,), "b"), ((2,), "b-again")])
    assert m.last[0] == (1,)
    assert m.queued() == 1


# --- releasing by runs (issue 16) -----------------------------------------------

def _random_merge(draw_ops):
    """Two merges fed the same pushes: one released by runs, one tuple by tuple."""
    import random
    rng = random.Random(draw_ops)
    producers = list(range(rng.randint(1, 4)))
    runs, single = OrderedMerge(producers), OrderedMerge(producers)
    inputs = list(range(1, 200))
    owner = {n: rng.choice(producers) for n in inputs}  # each input goes to one producer
    nxt = {p: [] for p in producers}
    for n in inputs:
        for k in range(1, rng.randint(0, 3) + 1):  # 0-3 outputs of input n, SN (n, k)
            nxt[owner[n]].append(((n, k), f"{n}.{k}"))
    got_runs, got_single = [], []
    fed = {p: 0 for p in producers}
    for _ in range(300):
        p = rng.choice(producers)
        take = rng.randint(0, 5)
        batch = nxt[p][fed[p]:fed[p] + take]
        fed[p] += len(batch)
        # a true bound: everything this producer sends later comes from later inputs
        later = nxt[p][fed[p]][0][0] - 1 if fed[p] < len(nxt[p]) else 10_000
        bound = (rng.randint(0, later),) if rng.random() < 0.7 else None
        for m in (runs, single):
            m.push(p, batch, bound)
        limit = rng.choice([None, 1, 3])
        got_runs += runs.pop_ready_from(limit)
        while single.ready() and (limit is None or len(got_single) < len(got_runs)):
            got_single.append(single.pop_from())
        assert got_runs == got_single
    return got_runs


@pytest.mark.parametrize("seed", range(60))
def test_release_by_runs_equals_release_tuple_by_tuple(seed):
    released = _random_merge(seed)
    assert [sn for _, (sn, _) in released] == sorted(sn for _, (sn, _) in released)
