"""Live moves of key groups in the runtime, the parts that are not Spark (DESIGN 13): the
maps a checkpoint's manifest records and a restart reads back, the driver's record of
the moves asked and carried, and the controller's relay of the ranges."""
from __future__ import annotations

import pytest

from controller.checkpoints import CheckpointCoordinator
from controller.key_groups import groups_to_manifest, manifest_maps, restore_maps
from controller.range_relay import RangeRelay
from exchange.group_map import GroupMap, GroupMove
from flux.addresses import P, S, Addr
from flux.control_messages import InstallRange, RangeInstalled, RangePacked
from flux.runtime.restore import routing_maps
from flux.spark.live_moves import LiveMoves, MoveAsked

G = 256


def even(n: int) -> GroupMap:
    return GroupMap.even(n, G)


def manifest(before: dict, after: dict, partitions: int = 4, stages: int = 2) -> dict:
    """A complete checkpoint's manifest whose cut moved ``before`` to ``after``."""
    c = CheckpointCoordinator(stages, partitions, "f", key_groups=G, shape="s")
    c.begin(1, 100, (before, after))
    c.source_recorded(1, None)
    c.sink_committed(1, None)
    done = None
    for s in range(1, stages + 1):
        for p in range(partitions):
            done = c.part_written(1, s, p, f"s{s}p{p}")
    return dict(done, checkpoint=1)


# -- the maps in a manifest -----------------------------------------------------------

def test_a_manifest_holds_the_maps_before_and_after_its_cuts_moves():
    """Stage 1's groups 0..127 moved to partition 3 at the cut (its map before was
    contiguous ranges); stage 2 had moved earlier and did not move now."""
    moved2 = even(4).moved([GroupMove(2, 0, 9, 0, 1)])
    before = {1: even(4), 2: moved2}
    after = {1: even(4).moved([GroupMove(1, 0, 63, 0, 3), GroupMove(1, 64, 127, 1, 3)]),
             2: moved2}
    m = manifest(before, after)
    assert set(m["groups"]) == {"1", "2"} and set(m["groups_before"]) == {"1"}
    got_before, got_after = manifest_maps(m)
    assert got_before == before and got_after == after
    assert restore_maps(m, 4) == {1: (before[1], after[1]), 2: (moved2, moved2)}
    assert routing_maps(m, 4) == after


def test_a_manifest_of_contiguous_ranges_names_no_map_and_restores_as_before():
    m = manifest({1: even(4), 2: even(4)}, {1: even(4), 2: even(4)})
    assert "groups" not in m and "groups_before" not in m
    assert restore_maps(m, 4) == {s: (even(4), even(4)) for s in (1, 2)}
    assert routing_maps(m, 4) == {}


def test_a_restore_at_another_count_starts_from_contiguous_ranges():
    """A rescale from a checkpoint whose map was moved: the old partitions' snapshots
    hold the moved map's groups, the new partitions own contiguous ranges."""
    after = even(4).moved([GroupMove(1, 0, 63, 0, 3)])
    m = manifest({1: after, 2: even(4)}, {1: after, 2: even(4)})
    assert restore_maps(m, 6) == {1: (after, even(6)), 2: (even(4), even(6))}
    assert routing_maps(m, 6) == {}


def test_a_manifest_from_before_key_groups_has_no_maps():
    assert manifest_maps({"partitions": 4, "stages": 2}) == ({}, {})
    assert groups_to_manifest({1: even(4)}, {1: even(4)}) == {}


# -- the driver's record of moves -------------------------------------------------------

def carry(moves: LiveMoves, k: int):
    """Cut ``k`` prepares the asks, their bulks are staged, cut ``k + 1`` moves them."""
    prepares, (before, after) = moves.cut(k)
    assert after == before and all(m.prepare for m in prepares)  # the bulk moves no key
    moves.staged(k)
    return moves.cut(k + 1)


def test_an_ask_becomes_one_move_per_run_of_owners_in_two_phases():
    moves = LiveMoves(2, 4, G, None)
    moves.ask(MoveAsked(1, 32, 100, 3))
    expected = [GroupMove(1, 32, 63, 0, 3), GroupMove(1, 64, 100, 1, 3)]
    assert moves.waiting_for_cut()
    prepares, (before, after) = moves.cut(7)
    assert prepares == [m.prepared() for m in expected] and after == before
    assert not moves.waiting_for_cut() and moves.preparing() == (7, expected)
    assert moves.cut(8) == ([], (before, before))  # the bulks are not there yet
    moves.staged(7)  # they are: the next cut carries the moves
    assert moves.waiting_for_cut() and moves.preparing() is None
    carried, (before, after) = moves.cut(9)
    assert carried == expected
    assert before[1] == even(4) and after[1].groups_of(3) == list(range(32, 101)) + \
        list(range(192, 256))
    assert moves.cut(10)[0] == []  # carried once
    assert moves.pending(8) and not moves.pending(9)  # until a checkpoint covers it


def test_asks_while_a_prepare_waits_for_its_bulks_wait_for_its_moves():
    moves = LiveMoves(2, 4, G, None)
    moves.ask(MoveAsked(1, 0, 10, 3))
    moves.cut(3)
    moves.ask(MoveAsked(1, 5, 20, 2))  # groups the first moves: after it
    assert not moves.waiting_for_cut() and moves.cut(4)[0] == []
    moves.staged(4)  # not the prepare's checkpoint: nothing
    assert moves.cut(5)[0] == []
    moves.staged(3)
    assert moves.cut(6)[0] == [GroupMove(1, 0, 10, 0, 3)]
    assert moves.cut(7)[0] == [GroupMove(1, 5, 10, 3, 2).prepared(),
                               GroupMove(1, 11, 20, 0, 2).prepared()]


def test_a_prepare_whose_bulks_do_not_come_is_carried_after_a_while_whoever_waits():
    """A destination replica dead and not replaced never says it holds the bulk; and the
    caller that asked may have given up: after ``PREPARE_WAIT`` the next cut carries the
    moves all the same (the destination then waits for the bulk at the cut)."""
    from flux.spark.live_moves import PREPARE_WAIT

    now = [100.0]
    moves = LiveMoves(2, 4, G, None, clock=lambda: now[0])
    moves.ask(MoveAsked(1, 0, 10, 3))
    moves.cut(3)
    now[0] += PREPARE_WAIT - 0.1
    assert moves.cut(4)[0] == [] and moves.preparing() is not None
    assert not moves.waiting_for_cut()
    now[0] += 0.2
    assert moves.preparing() is None and moves.waiting_for_cut()
    assert moves.cut(5)[0] == [GroupMove(1, 0, 10, 0, 3)]


def test_a_restart_between_a_prepare_and_its_moves_asks_again():
    moves = LiveMoves(2, 4, G, None)
    moves.ask(MoveAsked(1, 0, 10, 3))
    moves.cut(3)
    moves.restarted({**manifest({1: even(4)}, {1: even(4)}), "checkpoint": 3}, 4)
    assert moves.asked == [MoveAsked(1, 0, 10, 3)] and moves.preparing() is None
    assert moves.cut(4)[0] == [GroupMove(1, 0, 10, 0, 3).prepared()]


def test_an_ask_a_restart_undid_comes_again_and_one_for_a_partition_gone_is_dropped():
    moves = LiveMoves(2, 4, G, None)
    moves.ask(MoveAsked(2, 0, 10, 2))
    moves.cut(5)
    moves.ask(MoveAsked(1, 0, 10, 3))
    moves.restarted(None, 4)  # back to the first input: the map of contiguous ranges
    assert moves.maps == {1: even(4), 2: even(4)}
    assert moves.asked == [MoveAsked(2, 0, 10, 2), MoveAsked(1, 0, 10, 3)]
    moves.restarted(None, 3)  # a rescale from a checkpoint to 3: partition 3 is no more
    assert moves.asked == [MoveAsked(2, 0, 10, 2)]


def test_a_restart_from_the_checkpoint_that_carried_a_move_keeps_it():
    moves = LiveMoves(2, 4, G, None)
    moves.ask(MoveAsked(1, 0, 63, 2))
    _, groups = carry(moves, 3)
    m = manifest(*groups)
    m["checkpoint"] = 4
    moves.restarted(m, 4)
    assert moves.asked == [] and moves.maps[1].groups_of(2)[:64] == list(range(64))


# -- the controller's relay -------------------------------------------------------------

MOVE = GroupMove(1, 0, 63, 0, 2)


def test_a_range_goes_to_each_destination_replica_until_it_holds_it_where_it_is_hosted():
    relay = RangeRelay()
    where = {Addr(1, 2, P): "node1", Addr(1, 2, S): "node2"}
    assert relay.packed(RangePacked(3, MOVE, Addr(1, 0, P), b"range")) is None
    assert relay.packed(RangePacked(3, MOVE, Addr(1, 0, S), b"range")) is None  # the same
    due = list(relay.unsent(where.get))
    assert [(a, n) for _, a, n in due] == [(Addr(1, 2, P), "node1"), (Addr(1, 2, S), "node2")]
    assert relay.send((3, MOVE), Addr(1, 2, P), "node1") == InstallRange(3, MOVE, b"range")
    assert not relay.installed(RangeInstalled(3, MOVE, Addr(1, 2, P)), "node1", where.get)
    where[Addr(1, 2, P)] = "standby0"  # node1 died: its standby gets the range again
    assert [(a, n) for _, a, n in relay.unsent(where.get)] == \
        [(Addr(1, 2, P), "standby0"), (Addr(1, 2, S), "node2")]
    relay.send((3, MOVE), Addr(1, 2, S), "node2")
    relay.send((3, MOVE), Addr(1, 2, P), "standby0")
    assert not relay.installed(RangeInstalled(3, MOVE, Addr(1, 2, S)), "node2", where.get)
    assert relay.installed(RangeInstalled(3, MOVE, Addr(1, 2, P)), "standby0", where.get)
    assert relay.pending() == 0 and list(relay.unsent(where.get)) == []
    # a late pack of a move done is old news
    assert relay.packed(RangePacked(3, MOVE, Addr(1, 0, S), b"other")) is None
    assert relay.pending() == 0


def test_a_bulk_is_kept_for_the_destination_until_its_move_is_installed_there():
    """A prepare's bulk goes to both destination replicas and is staged there; the move's
    pack of changes since it goes too; a standby that replaces a destination replica
    before it installed gets both again; once the move is held, both are dropped."""
    relay = RangeRelay()
    where = {Addr(1, 2, P): "node1", Addr(1, 2, S): "node2"}
    bulk = MOVE.prepared()
    relay.packed(RangePacked(3, bulk, Addr(1, 0, P), b"bulk"))
    relay.packed(RangePacked(3, bulk, Addr(1, 0, S), b"bulk"))
    for addr, name in where.items():
        relay.send((3, bulk), addr, name)
        assert not relay.installed(RangeInstalled(3, bulk, addr), name, where.get)
    assert relay.staged(3, bulk, where.get) and relay.pending() == 1  # kept
    relay.packed(RangePacked(5, MOVE, Addr(1, 0, P), b"changes", over=3))
    relay.packed(RangePacked(5, MOVE, Addr(1, 0, S), b"changes", over=3))
    assert relay.send((5, MOVE), Addr(1, 2, P), "node1") == \
        InstallRange(5, MOVE, b"changes", over=3)
    relay.installed(RangeInstalled(5, MOVE, Addr(1, 2, P)), "node1", where.get)
    where[Addr(1, 2, S)] = "standby0"  # node2 died before it installed the move
    assert not relay.staged(3, bulk, where.get)
    assert sorted(k[0] for k, a, n in relay.unsent(where.get)) == [3, 5]
    for key, addr, name in list(relay.unsent(where.get)):
        relay.send(key, addr, name)
    relay.installed(RangeInstalled(3, bulk, Addr(1, 2, S)), "standby0", where.get)
    assert relay.installed(RangeInstalled(5, MOVE, Addr(1, 2, S)), "standby0", where.get)
    assert relay.pending() == 0  # the bulk with its move


def test_a_replica_that_installed_a_sources_own_copy_is_not_sent_the_controllers():
    """The source's replicas send the changes straight to the destination's too: one
    that said it holds them, where it is hosted now, is not sent them again."""
    relay = RangeRelay()
    where = {Addr(1, 2, P): "node1", Addr(1, 2, S): "node2"}
    relay.packed(RangePacked(5, MOVE, Addr(1, 0, P), b"changes", over=3))
    relay.installed(RangeInstalled(5, MOVE, Addr(1, 2, P)), "node1", where.get)
    assert [a for _, a, _ in relay.unsent(where.get)] == [Addr(1, 2, S)]
    where[Addr(1, 2, P)] = "standby0"  # rebuilt: its new process was sent nothing
    assert [a for _, a, _ in relay.unsent(where.get)] == [Addr(1, 2, P), Addr(1, 2, S)]


def test_a_source_replica_rebuilt_after_the_prepare_packs_whole_and_is_not_compared():
    """Its twin packs the changes since the bulk: two forms, each compared only with its
    own kind, the first sent on; two packs of changes that differ are a divergence."""
    relay = RangeRelay()
    assert relay.packed(RangePacked(5, MOVE, Addr(1, 0, S), b"whole")) is None
    assert relay.packed(RangePacked(5, MOVE, Addr(1, 0, P), b"changes", over=3)) is None
    assert relay.send((5, MOVE), Addr(1, 2, P), "node1") == InstallRange(5, MOVE, b"whole")
    assert "diverged" in relay.packed(RangePacked(5, MOVE, Addr(1, 0, P), b"other", over=3))


def test_packs_that_differ_between_the_source_replicas_are_a_divergence():
    relay = RangeRelay()
    relay.packed(RangePacked(3, MOVE, Addr(1, 0, P), b"range"))
    wrong = relay.packed(RangePacked(3, MOVE, Addr(1, 0, S), b"rangE"))
    assert "stage 1 partition 0 packed different states of key groups 0..63 at " \
           "checkpoint 3" in wrong


@pytest.mark.parametrize("asked, error", [
    (MoveAsked(3, 0, 1, 1), "stage must be from 1 to 2"),
    (MoveAsked(1, 5, 4, 1), "key groups must be first..last within 0..255"),
    (MoveAsked(1, 0, 256, 1), "key groups must be first..last within 0..255"),
    (MoveAsked(1, 0, 4, 4), "to must be a running partition from 0 to 3"),
])
def test_a_move_the_job_cannot_make_is_refused_naming_why(asked, error):
    from flux.spark.job_moves import check_move

    with pytest.raises(ValueError, match=error):
        check_move(asked, 2, G, 4)
    check_move(MoveAsked(1, 0, 4, 3), 2, G, 4)


def test_a_move_of_the_last_stage_waits_for_a_cut_past_what_the_sinks_held():
    """With a sink per partition, after a restart: the second phase of a move of the last
    stage waits for a cut the driver says may move it (``LastStageMoves.may_move``)."""
    moves = LiveMoves(2, 4, G, None, clock=lambda: 0.0)
    moves.ask(MoveAsked(2, 0, 4, 3))
    prepares, _ = moves.cut(1)
    assert [m.prepare for m in prepares] == [True]
    moves.staged(1)
    assert moves.cut(2, last_stage=False)[0] == []  # below the floor: not yet
    carried, _ = moves.cut(3, last_stage=True)
    assert [(m.stage, m.first, m.last, m.dest, m.prepare) for m in carried] == [
        (2, 0, 4, 3, False)]


def test_the_drivers_rules_for_moves_of_the_last_stage():
    """One checkpoint at a time while one that moved the last stage is open, a restart
    when it does not complete in time, a floor after a restart, none of it with one
    ordered egress."""
    from exchange.group_map import GroupMove
    from flux.spark.last_stage_moves import LastStageMoves, MoveCheckpointStuck

    now = [0.0]
    rules = LastStageMoves(2, sinks_apart=True, interval=1.0, clock=lambda: now[0])
    rules.cut(4, [GroupMove(1, 0, 9, 0, 1)])  # an earlier stage's: nothing held
    assert not rules.blocks_cut()
    rules.cut(5, [GroupMove(2, 0, 9, 0, 1, prepare=True)])  # a prepare routes nothing
    assert not rules.blocks_cut()
    rules.cut(6, [GroupMove(2, 0, 9, 0, 1)])
    assert rules.blocks_cut()
    rules.completed(5)
    assert rules.blocks_cut()
    now[0] = 31.0
    with pytest.raises(MoveCheckpointStuck, match="checkpoint 6"):
        rules.blocks_cut()
    rules.completed(7)
    assert not rules.blocks_cut() and rules.covered == 7
    rules.restarted((120, 2))
    assert not rules.may_move(120) and rules.may_move(121)
    ordered = LastStageMoves(2, sinks_apart=False, interval=1.0)
    ordered.cut(6, [GroupMove(2, 0, 9, 0, 1)])
    ordered.restarted((120, 2))
    assert not ordered.blocks_cut() and ordered.may_move(3)


def test_live_moves_are_refused_where_they_are_not_built_yet():
    from flux.runtime.config import NodeConfig
    from flux.spark.job_moves import check_live

    class Checkpoints:
        key_groups = G
        moves = LiveMoves(2, 4, G, None)

    config = NodeConfig(dataflow=b"", stages=2, partitions=4)
    check_live(True, config, Checkpoints())
    with pytest.raises(ValueError, match="give the job checkpoint="):
        check_live(True, config, None)
    check_live(True, NodeConfig(dataflow=b"", stages=2, partitions=4, ordered_output=False),
               Checkpoints())  # with a sink per partition too
    check_live(True, NodeConfig(dataflow=b"", stages=2, partitions=4, splits=2),
               Checkpoints())  # several ingresses: each switches at the cut's epoch
    with pytest.raises(ValueError, match="a running job"):
        check_live(False, config, Checkpoints())


def test_a_spread_is_every_stages_moves_to_contiguous_ranges_over_the_first_pairs():
    """Over 4 of 6 pairs and back to 6: the moves of one cut each, pairs 4 and 5 owning
    nothing in between; a restart at fewer pairs than the spread drops it."""
    from flux.spark.live_moves import SpreadAsked

    moves = LiveMoves(2, 6, G, None)
    moves.ask(SpreadAsked(4, G))
    carried, (_, after) = carry(moves, 3)
    assert after == {1: GroupMap.even(4, G, 6), 2: GroupMap.even(4, G, 6)}
    assert {m.stage for m in carried} == {1, 2} and not after[1].groups_of(5)
    moves.ask(SpreadAsked(6, G))
    carried, (_, after) = carry(moves, 5)
    assert after == {1: even(6), 2: even(6)}
    four = GroupMap.even(4, G, 6)
    assert carried == four.moves_to(even(6), 1) + four.moves_to(even(6), 2)
    assert len(carried) == 2 * 6  # the design's six moves of 4 -> 6, per stage
    moves.ask(SpreadAsked(6, G))
    moves.restarted(None, 5)  # to the first input, at 5 pairs: the spread over 4 again
    assert moves.asked == [SpreadAsked(4, G)]


# -- a range taken out of a keyed store and put in another: changes like any other ---------

def vectorized_stores(ttl=None) -> tuple:
    """The vectorized operators' stores after a workload (sessions, stats), with the
    expiry's watermark among the pairs when ``ttl``."""
    import sys

    sys.path.insert(0, "tests")
    from test_vectorized_examples import Pair
    from flux.keyed_state import keyed_state_of
    from flux.testing.workloads import packet_workload

    pair = Pair(ttl=ttl, idle_ttl=ttl)
    packets = packet_workload(600, 5, pairs=40, apps=4, sources=8)
    for i in range(0, len(packets), 100):
        pair.feed(packets[i:i + 100])
    return keyed_state_of(pair.vsessions), keyed_state_of(pair.vstats)


def store_kinds() -> list:
    from flux.columnar_state import ColumnarKeyedState
    from flux.keyed_state import KeyedState

    plain = KeyedState([[("k", i), [i, i * i]] for i in range(40)])
    columnar = ColumnarKeyedState([[("k", i), [i, i * i]] for i in range(40)],
                                  total=int, squares=int)
    sessions, stats = vectorized_stores(ttl=20)
    return [("KeyedState", plain, lambda: KeyedState()),
            ("ColumnarKeyedState", columnar,
             lambda: ColumnarKeyedState(total=int, squares=int)),
            ("SessionTable", sessions, lambda: type(sessions)()),
            ("StatsTable", stats, lambda: type(stats)())]


@pytest.mark.parametrize("kind", range(4), ids=["KeyedState", "ColumnarKeyedState",
                                                "SessionTable", "StatsTable"])
def test_a_range_taken_and_put_is_a_change_at_both_stores_and_the_watermark_stays(kind):
    from flux.expiry import WATERMARK_KEY
    from flux.keys import PARTITION_WIDE, sorted_keys

    _, source, empty = store_kinds()[kind]
    before = source.snapshot()
    keys = [k for k, _ in before if k not in PARTITION_WIDE]
    moved = keys[::3]
    dest = empty()
    for store in (source, dest):  # both tracking, as during a catch-up and a checkpoint
        store.clear_dirty()
        store.start_changes()
    installs = source.installs, dest.installs
    stray = [("never", "held")] if kind < 2 else []  # (the tables' keys are typed)
    held, values = source.take_keys(moved + stray)
    assert held == moved
    dest.put_keys(held, values)
    assert (source.installs, dest.installs) == (installs[0] + 1, installs[1] + 1)
    taken = [pair for pair in before if pair[0] in set(moved)]
    assert source.snapshot() == [pair for pair in before if pair[0] not in set(moved)]
    assert dest.snapshot() == taken
    for changes in (source.changes(), source.delta()):
        assert changes["set"] == [] and changes["deleted"] == sorted_keys(moved)
    for changes in (dest.changes(), dest.delta()):
        assert changes["set"] == taken and changes["deleted"] == []
    if kind >= 2:  # the vectorized stores of the ttl run hold the expiry's watermark
        assert any(k == WATERMARK_KEY for k, _ in source.snapshot())
        assert all(k != WATERMARK_KEY for k, _ in dest.snapshot())


def test_a_stage_whose_state_is_not_keyed_by_its_key_is_refused_before_it_moves():
    """The third stage of the packets' dataflow counts per app in a stage keyed by
    ``(app, ts)``: its groups cannot move (nor be split), the first two stages' can."""
    from flux.errors import RescaleRefused
    from flux.rescale import check_rescalable
    from flux.testing.dataflows import packet_dataflow
    from flux.testing.workloads import packet_workload

    flow, sample = packet_dataflow(3), packet_workload(400, 2, pairs=50, apps=3, sources=9)
    for stage in (1, 2):
        check_rescalable(flow, sample, G, only=stage)
    with pytest.raises(RescaleRefused, match="count3"):
        check_rescalable(flow, sample, G, only=3)


# -- a move in two phases: the changes since the bulk --------------------------------------

def test_the_changes_since_a_bulk_are_the_keys_whose_value_is_not_the_bulks():
    """Assigned an equal value: unchanged; another value, a new key: changed; a key of
    the bulk gone: deleted; an array (``==`` answers per element): changed, to be safe."""
    import numpy as np

    from flux.protocol.segment_moves import range_changes

    same = {"n": 1}
    arr = np.arange(3)
    bulk = [2, [("a",), ("b",), ("c",), ("d",), ("e",)], [same, 5, 7, [1, 2], arr]]
    now = [2, [("a",), ("b",), ("d",), ("e",), ("f",)], [same, 6, [1, 2], arr.copy(), 0]]
    assert range_changes(bulk, now) == [2, [("b",), ("e",), ("f",)],
                                        [6, now[2][3], 0], [("c",)]]
    assert range_changes(bulk, bulk) == [2, [], [], []]


# -- a node's side: the bulk packed off the loop, the steps timed ----------------------

def _until(predicate, timeout=10.0):
    import time

    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    return predicate()


def test_a_bulk_is_packed_off_the_loop_and_reported_with_the_step_that_kept_it():
    from flux.effects import PackRange
    from flux.runtime.range_timing import RangeTiming
    from flux.state_codec import pack_state

    now = [10.0]
    timing = RangeTiming(lambda: now[0])
    parts = [[0, [("k%d" % i,) for i in range(5000)], ["v" * 100] * 5000]]
    move = GroupMove(1, 0, 63, 0, 2, prepare=True)
    timing.began(10.0)
    now[0] = 10.004  # the step that kept it took 4 ms
    assert timing.effect(PackRange(3, move, Addr(1, 0, P), parts)) is None  # not yet
    got = []
    assert _until(lambda: got.extend(timing.packed()) or got)
    assert got == [RangePacked(3, move, Addr(1, 0, P), pack_state(parts), None,
                               pytest.approx(0.004))]
    assert timing.packed() == []  # reported once


def test_a_bulk_that_cannot_be_encoded_stops_the_job_naming_the_move():
    from flux.effects import PackRange
    from flux.errors import OperatorError
    from flux.runtime.range_timing import RangeTiming

    timing = RangeTiming(lambda: 0.0)
    move = GroupMove(1, 0, 63, 0, 2, prepare=True)
    timing.effect(PackRange(3, move, Addr(1, 0, P), [[0, [("k",)], [object()]]]))
    assert _until(lambda: not timing.packer.busy())
    with pytest.raises(OperatorError, match="the bulk of the live move of key groups 0..63"):
        timing.packed()


def test_a_destination_pause_runs_from_the_step_that_crossed_the_cut_to_the_install():
    from flux.effects import RangeAwaited
    from flux.runtime.range_timing import RangeTiming

    now = [5.0]
    timing = RangeTiming(lambda: now[0])
    timing.began(5.0)  # the step that crosses the cut, the range not there
    now[0] = 5.01
    assert timing.effect(RangeAwaited(4, MOVE, Addr(1, 2, P))) is None
    now[0] = 5.2
    timing.delivering(InstallRange(4, MOVE, b""))  # the install's step begins
    now[0] = 5.23
    done = timing.effect(RangeInstalled(4, MOVE, Addr(1, 2, P)))
    assert done.waited == pytest.approx(0.23)
    timing.began(6.0)  # a range there at the crossing: the pause is the install's step
    now[0] = 6.02
    assert timing.effect(RangeInstalled(5, MOVE, Addr(1, 2, S))).waited == \
        pytest.approx(0.02)
