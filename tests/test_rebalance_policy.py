"""The metric-driven rebalancing policy (``controller.rebalance``): it moves part of
a hot partition's key groups to the least loaded partition, only when a stage is out of
balance for a whole look, and never splits what cannot be split."""
from __future__ import annotations

import pytest

from controller.rebalance import Rebalance, RebalancePolicy, best_run, largest_run, routed_loads
from flux.addresses import Addr
from flux.control_messages import SegmentStats

pytestmark = pytest.mark.timeout(30)

EVEN4 = [g * 4 // 256 for g in range(256)]  # 4 partitions, 64 groups each


def look(policy, rates, owners, seconds=10.0, stage=1, start=None):
    """Two observations ``seconds`` apart with each partition taking ``rates``/s."""
    before = start or {(stage, p): 1000 for p in range(len(rates))}
    assert policy.observe(0.0, before, {stage: owners}) is None
    after = {k: n + int(rates[k[1]] * seconds) for k, n in before.items()}
    return policy.observe(seconds, after, {stage: owners})


def test_an_even_load_moves_nothing():
    policy = RebalancePolicy(Rebalance(every=10), [1], 4)
    assert look(policy, [500, 520, 480, 510], EVEN4) is None


def test_a_hot_partition_gives_the_coolest_the_share_that_evens_them():
    policy = RebalancePolicy(Rebalance(every=10), [1], 4)
    move = look(policy, [3000, 500, 1000, 500], EVEN4)
    # (3000 - 500) / (2 * 3000) of its 64 groups: 27, from the end of its range
    assert (move.stage, move.first, move.last, move.dest) == (1, 37, 63, 1)
    assert move.rates == (3000.0, 500.0, 1000.0, 500.0)


def test_an_idle_spare_pair_is_the_coolest():
    owners = [g * 3 // 256 for g in range(256)]  # partitions 0..2; 3 owns nothing
    policy = RebalancePolicy(Rebalance(every=10), [1], 4)
    move = look(policy, [400, 3000, 500, 0], owners)
    assert move.dest == 3 and owners[move.first] == owners[move.last] == 1
    assert move.last == max(g for g, o in enumerate(owners) if o == 1)


def test_no_decision_before_a_whole_look_and_none_below_the_floor_rate():
    policy = RebalancePolicy(Rebalance(every=10, min_rate=5000), [1], 4)
    assert look(policy, [3000, 500, 500, 500], EVEN4) is None  # hot, but below 5000/s
    policy = RebalancePolicy(Rebalance(every=10), [1], 4)
    assert look(policy, [3000, 500, 500, 500], EVEN4, seconds=5) is None  # half a look


def test_a_partition_of_one_group_is_left_alone_and_one_keeps_a_group():
    owners = [0] + [1] * 85 + [2] * 85 + [3] * 85
    policy = RebalancePolicy(Rebalance(every=10), [1], 4)
    assert look(policy, [5000, 10, 10, 10], owners) is None  # one hot key
    owners = [0, 0] + [1] * 254
    policy = RebalancePolicy(Rebalance(every=10), [1], 2)
    move = look(policy, [5000, 0], owners)
    assert (move.first, move.last, move.dest) == (1, 1, 1)  # group 0 stays


def test_a_counter_that_began_again_is_not_read_as_a_rate():
    policy = RebalancePolicy(Rebalance(every=10), [1], 2)
    assert policy.observe(0.0, {(1, 0): 50_000, (1, 1): 50_000}, {1: EVEN4}) is None
    # partition 1's replica was rebuilt: its counter starts from 0
    assert policy.observe(10.0, {(1, 0): 90_000, (1, 1): 100}, {1: EVEN4}) is None


def test_only_the_stages_asked_for_are_balanced():
    policy = RebalancePolicy(Rebalance(every=10, stages=(2,)), [1, 2], 4)
    before = {(s, p): 0 for s in (1, 2) for p in range(4)}
    assert policy.observe(0.0, before, {1: EVEN4, 2: EVEN4}) is None
    after = {**before, (1, 0): 40_000, (1, 1): 100, (2, 0): 100, (2, 3): 40_000}
    move = policy.observe(10.0, after, {1: EVEN4, 2: EVEN4})
    assert move.stage == 2 and EVEN4[move.first] == 3


def test_settings_are_checked():
    for bad in (dict(every=0), dict(imbalance=1.0), dict(min_rate=-1)):
        with pytest.raises(ValueError, match="Rebalance"):
            Rebalance(**bad)


def test_largest_run():
    assert largest_run([0, 1, 2, 10, 11]) == (0, 2)
    assert largest_run([3, 7, 8]) == (7, 8)
    assert largest_run([5]) == (5, 5)


# -- by the rows routed to each key group --------------------------------------------------

def look_by_groups(policy, group_rates, owners, seconds=10.0, stage=1):
    """Two observations ``seconds`` apart with each group of ``stage`` taking
    ``group_rates``/s (the partitions' own counters say nothing: even)."""
    taken = {(stage, p): 0 for p in range(policy.partitions)}
    before = [100] * len(group_rates)
    assert policy.observe(0.0, taken, {stage: owners}, {stage: before}) is None
    after = [n + int(r * seconds) for n, r in zip(before, group_rates)]
    return policy.observe(seconds, taken, {stage: owners}, {stage: after})


def test_the_groups_that_carry_the_load_are_the_ones_moved():
    """Partition 0's load is on its first 8 groups (an even share of its groups would
    have moved its last 27, nearly idle, and changed little)."""
    rates = [10.0] * 256
    for g in range(8):
        rates[g] = 300.0
    policy = RebalancePolicy(Rebalance(every=10), [1], 4)
    move = look_by_groups(policy, rates, EVEN4)
    # partition 0 takes 8 * 300 + 56 * 10 = 2960/s, the others 640: three of the hot
    # groups and the 26 cold ones after them (1160/s) leave both at 1800
    assert (move.first, move.last, move.dest) == (5, 33, 1)
    assert move.rates == (2960.0, 640.0, 640.0, 640.0)


def test_a_group_hotter_than_the_gap_stays_where_it_is():
    """One group takes 3000/s of partition 0's 3630: the cold groups around it go (the
    partition keeps its hot key alone), never the hot one, which would only make the
    partition taking it the hot one (and the look after would move it back)."""
    rates = [10.0] * 256
    rates[5] = 3000.0
    policy = RebalancePolicy(Rebalance(every=10), [1], 4)
    move = look_by_groups(policy, rates, EVEN4)
    assert not move.first <= 5 <= move.last and move.dest == 1
    owners = [0, 0] + [1 + g * 3 // 254 for g in range(254)]  # 0 owns groups 0 and 1
    rates = [3000.0, 10.0] + [5.0] * 254
    policy = RebalancePolicy(Rebalance(every=10), [1], 4)
    assert look_by_groups(policy, rates, owners) is None  # group 1 alone: too little


def test_a_move_must_bring_the_hot_partition_down_by_a_tenth():
    owners = [0, 0] + [1 + g * 3 // 254 for g in range(254)]
    rates = [1000.0, 80.0] + [300 * 3 / 254] * 254  # 1080/s against 300 each
    policy = RebalancePolicy(Rebalance(every=10), [1], 4)
    assert look_by_groups(policy, rates, owners) is None  # group 1's 80: 7% of 1080
    rates[1] = 150.0  # 1150 -> 1000: 13%
    policy = RebalancePolicy(Rebalance(every=10), [1], 4)
    move = look_by_groups(policy, rates, owners)
    assert (move.first, move.last) == (1, 1)


def test_group_counts_that_began_again_are_not_read_as_rates():
    policy = RebalancePolicy(Rebalance(every=10), [1], 2)
    taken = {(1, 0): 0, (1, 1): 0}
    assert policy.observe(0.0, taken, {1: EVEN4}, {1: [500] * 256}) is None
    assert policy.observe(10.0, taken, {1: EVEN4}, {1: [9000] + [0] * 255}) is None


def test_best_run_keeps_a_group_and_looks_inside_each_run():
    rates = [0.0] * 8
    rates[2], rates[3], rates[6] = 50.0, 50.0, 100.0
    # groups 2, 3 and 6 owned by the hot partition (200/s), the cool one at 0
    assert best_run([2, 3, 6], rates, 200.0, 0.0) in ((2, 3, 100.0), (6, 6, 100.0))
    assert best_run([4], rates, 200.0, 0.0) is None  # one group: it keeps it


def test_routed_loads_take_a_pairs_larger_counts_and_sum_the_partitions():
    stats = [SegmentStats(Addr(1, 0, 0), 0, 0, 0, 0, 0, 0, (5, 0, 2)),
             SegmentStats(Addr(1, 0, 1), 0, 0, 0, 0, 0, 0, (1, 4, 2)),  # rebuilt: behind
             SegmentStats(Addr(1, 1, 0), 0, 0, 0, 0, 0, 0, (0, 1, 1)),
             SegmentStats(Addr(0, 0, 0), 0, 0, 0, 0, 0, 0, (7, 7)),  # the ingress: stage 1
             SegmentStats(Addr(2, 0, 0), 0, 0, 0, 0, 0, 0, ())]  # the last stage: none
    assert routed_loads(stats) == {2: [5, 5, 3], 1: [7, 7]}
