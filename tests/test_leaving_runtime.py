"""Pairs that leave at a live rescale to fewer, in the runtime (rule 5 of
docs/design/rescaling.md): what the driver records at the rescale's cut, when the
controller lets them leave, what the job refuses meanwhile. The model is
``test_leaving_pairs.py``; the whole path runs on Spark in ``test_dormant_spark.py``."""
from __future__ import annotations

import pytest

from controller.placement import ChainedDeclustering
from controller.recovery import Recovery
from controller.topology import Topology
from exchange.group_map import GroupMap
from flux.addresses import Addr, P, S
from flux.control_messages import NodeStats, SegmentStats
from flux.runtime.controller_joins import JoinSide
from flux.runtime.restore import dormant_start
from flux.spark.job_growth import start_dormant, wait_left
from flux.spark.live_moves import LiveMoves, SpreadAsked

G = 16
pytestmark = pytest.mark.timeout(30)


def _spread(moves: LiveMoves, number: int, asked: SpreadAsked) -> int:
    """Carry ``asked`` through both phases from cut ``number``; the moves' cut."""
    moves.ask(asked)
    _cut(moves, number)  # the prepares
    moves.staged(number)
    _cut(moves, number + 1)  # the moves
    return number + 1


def _cut(moves: LiveMoves, number: int) -> list:
    """Checkpoint ``number`` cut at input ``10 * number``: the moves it carries."""
    carried = moves.cut(number)[0]
    moves.cut_at(number, 10 * number)
    return carried


def test_from_a_rescale_to_fewer_cut_on_the_manifest_counts_the_new_pairs_and_then_they_are_empty():
    moves = LiveMoves(2, 6, G, None, running=6)
    moves.cut(1)
    assert moves.unowned() == frozenset() and moves.running_at(6) == 6
    cut = _spread(moves, 2, SpreadAsked(3, G, leave=True))
    assert moves.moves_cut == cut and moves.leaving() == (3, (cut, 10 * cut))
    # the rescale's cut: counted at the new count, and the leaving pairs write it (a
    # restart from it restores the groups they gave away from their snapshots)
    assert moves.running_at(6) == 3 and moves.unowned() == frozenset()
    moves.cut(cut + 1)
    assert moves.unowned() == {3, 4, 5} and moves.running_at(6) == 3
    # a later growth joins them again: fresh, empty until a cut after they own groups
    moves.join_start()
    moves.cut(cut + 2)
    moves.join_applied()
    assert moves.running_at(6) == 6 and moves.leaving() is None
    again = _spread(moves, cut + 3, SpreadAsked(6, G))
    assert moves.unowned() == {3, 4, 5}  # empty before this cut's own moves
    moves.cut(again + 1)
    assert moves.unowned() == frozenset()


def test_a_spread_without_leave_keeps_the_idle_pairs_counted_and_written():
    """A pair made idle by ``spread_key_groups`` keeps what is not a key's (an expiry's
    watermark): it is not empty at a later cut, and a restart runs it."""
    moves = LiveMoves(2, 6, G, None, running=6)
    cut = _spread(moves, 1, SpreadAsked(3, G))
    moves.cut(cut + 1)
    assert moves.unowned() == frozenset() and moves.running_at(6) == 6
    assert moves.leaving() is None


def test_a_rescale_to_fewer_whose_groups_moved_already_leaves_from_the_last_move_cut():
    moves = LiveMoves(1, 4, G, None, running=4)
    cut = _spread(moves, 1, SpreadAsked(2, G))  # idle first
    moves.ask(SpreadAsked(2, G, leave=True))
    assert _cut(moves, cut + 1) == []  # nothing to move: done at this cut
    assert moves.leaving() == (2, (cut, 10 * cut)) and moves.running_at(4) == 2
    moves.ask(SpreadAsked(1, G, leave=True))  # a second rescale to fewer: asked, not cut
    assert moves.leaving() is None


def test_a_restart_forgets_a_rescale_to_fewer_its_checkpoint_already_counts():
    moves = LiveMoves(1, 4, G, None, running=4)
    _spread(moves, 1, SpreadAsked(2, G, leave=True))
    owners = GroupMap.even(2, G, 4).owners.tolist()
    moves.restarted({"partitions": 4, "stages": 1, "key_groups": G, "checkpoint": 2,
                     "cut": 9, "running": 2, "groups": {"1": owners}}, 4)
    assert moves.leaving() is None and moves.running_at(2) == 2
    moves.cut(3)
    assert moves.unowned() == {2, 3}  # dormant again, as the live run's left ones
    # the manifest's count, not the job's first one: pairs 2 and 3 stay dormant
    assert dormant_start({"partitions": 4, "stages": 1, "key_groups": G, "checkpoint": 2,
                          "running": 2, "groups": {"1": owners}}, 4, 4, G, 1)[1] == 2


class _Controller(JoinSide):
    """A controller's record, as much as ``JoinSide`` reads of it."""

    def __init__(self, recovery: Recovery):
        self.recovery, self.started = recovery, True
        self._init_membership()
        self.events, self.node_stats, self.sent = [], {}, []
        self.registered = {n: () for n in recovery.topology.workers}
        self.dead: set = set()

    def _broadcast(self, views):
        self.sent += views

    def clock(self):
        return 0.0

    def report(self, node: str, crossed: int, idle: bool) -> None:
        """``node`` says each replica it hosts crossed move cut ``crossed``, idle or not."""
        hosted = [a for a, n in self.recovery.node_of.items() if n == node]
        self.node_stats[node] = (0.0, NodeStats(tuple(
            SegmentStats(a, 0, 0, 0, 0, 0, 0, (), crossed, idle) for a in hosted)))


def _controller() -> _Controller:
    placement = ChainedDeclustering(2, 4)
    names = [f"node{n}" for n in placement.nodes] + ["standby0"]
    topology = Topology(placement, 2, 4, {n: 10 + k for k, n in enumerate(names)},
                        ["standby0"])
    return _Controller(Recovery(topology))


def test_pairs_leave_once_every_replica_of_theirs_says_it_crossed_the_cut_and_holds_nothing():
    c = _controller()
    nodes = [f"node{n}" for n in range(4)]
    c.ask_leave(range(2, 4), (5, 130))
    c.place_leaves()
    assert c.sent == [] and any("not reported" in w
                                for w in c.leave_waits(range(2, 4), (5, 130)))
    for n in nodes:
        c.report(n, 4, True)
    c.place_leaves()
    assert c.sent == [] and any("not past move cut 5 (at 4)" in w
                                for w in c.leave_waits(range(2, 4), (5, 130)))
    for n in nodes:
        c.report(n, 5, n != "node3")
    c.place_leaves()
    assert c.sent == [] and any("still holding" in w
                                for w in c.leave_waits(range(2, 4), (5, 130)))
    c.report("node3", 6, True)
    c.place_leaves()
    [view] = c.sent
    assert c.left_view([3, 2]) == view.number and view.left_cut == (5, 130)
    assert set(view.left) == {Addr(s, q, r) for s in (1, 2) for q in (2, 3) for r in (P, S)}
    # chained placement: node3 held replicas of partitions 2 and 3 only; a standby again
    assert "node3" in c.recovery.free and "node1" not in c.recovery.free
    assert c.recovery.left == {2, 3}
    states = c.recovery.pair_states()
    assert states[1, 2] == states[2, 3] == "dormant" and states[1, 1] == "whole"


def test_a_leave_waits_while_a_replica_is_missing():
    c = _controller()
    for n in range(4):
        c.report(f"node{n}", 5, True)
    c.recovery.node_failed("node0")
    c.ask_leave(range(3, 4), (5, 130))
    c.place_leaves()
    assert c.sent == [] and c.left_view([3]) is None
    assert any("missing" in w for w in c.leave_waits(range(3, 4), (5, 130)))


def test_a_leave_that_cannot_happen_in_time_says_which_replica_it_waits_for():
    c = _controller()
    clock = iter(range(100))
    with pytest.raises(TimeoutError, match="did not leave within 3s.*not reported by"):
        c.ask_leave(range(2, 4), (5, 130))
        wait_left(c, lambda view: [], range(2, 4), (5, 130), 3, clock=lambda: next(clock),
                  sleep=lambda s: None)
    for n in range(4):
        c.report(f"node{n}", 5, True)
    c.place_leaves()  # (the ask stays: placed at a later turn)
    assert c.left_view(range(2, 4)) is not None


def test_a_join_placed_is_waited_for_until_every_process_applied_it():
    c = _controller()
    c.recovery.leave(range(3, 4))
    c.recovery.add_standby("standby1", 40)  # (two free standbys: the join is placed)
    clock, asked = iter(range(100)), []

    def lagging(view):
        asked.append(view)
        return ["node0"] if len(asked) < 3 else []
    view = start_dormant(c, lagging, range(3, 4), 50, clock=lambda: next(clock),
                         sleep=lambda s: c.place_joins())  # (the controller's turns)
    assert view == c.joined_view([3]) and asked == [view] * 3


def test_with_a_sink_per_partition_an_empty_partitions_sink_counts_as_its_last_commit():
    """A partition dormant or gone at a cut writes nothing and its sink commits nothing:
    the checkpoint takes its sink partition as committed to what it committed last, and
    completes without it."""
    from controller.checkpoints import CheckpointCoordinator

    c = CheckpointCoordinator(1, 3, "fp", sinks=3)
    c.begin(1, 10)
    for p, sn in ((0, (9, 0)), (1, None), (2, (7, 2))):
        c.part_written(1, 1, p, f"k1p{p}")
        c.sink_committed(1, sn, partition=p)
    assert c.source_recorded(1, 10)["sinks"] == [[9, 0], None, [7, 2]]
    c.begin(2, 20, dormant={2})  # partition 2 left after cut 10
    c.part_written(2, 1, 0, "k2p0")
    c.part_written(2, 1, 1, "k2p1")
    c.sink_committed(2, (19, 0), partition=0)
    c.sink_committed(2, (18, 1), partition=1)
    manifest = c.source_recorded(2, 20)
    assert manifest is not None and manifest["sinks"] == [[19, 0], [18, 1], [7, 2]]
