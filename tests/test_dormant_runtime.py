"""Dormant pairs in the runtime (docs/design/rescaling.md): what the wire carries, where a
job with dormant pairs starts and restarts, which snapshots the coordinator takes as
empty, how the controller places a join and says who has applied it, what a job
refuses. The whole path runs on Spark in ``test_dormant_spark.py``."""
from __future__ import annotations

import queue

import pytest

from controller.checkpoints import CheckpointCoordinator
from controller.placement import ChainedDeclustering
from controller.recovery import Recovery
from controller.topology import Topology
from exchange.group_map import GroupMap
from exchange.wire import decode, encode
from flux.addresses import CONTROLLER, Addr, P, ProcAddr, S
from flux.control_messages import Joined, View, Welcome
from flux.envelope import Envelope
from flux.errors import RescaleRefused
from flux.runtime.checkpoint_service import CheckpointService
from flux.runtime.checkpoint_store import CheckpointStore
from flux.runtime.controller_joins import JoinSide
from flux.runtime.restore import dormant_start, restore_operators
from flux.runtime.snapshot_writer import SnapshotWriter
from flux.spark.job_growth import check_dormant, check_growth
from flux.spark.live_moves import LiveMoves, SpreadAsked
from flux.spark.options import JobOptions
from test_incremental_checkpoints import crossed, segment_with_counter

G = 16


def test_a_view_of_joined_pairs_and_a_late_joiners_welcome_cross_the_wire():
    view = View(7, joined=(Joined(Addr(1, 4, P), 31, "standby31", ((1, (0, 4, 4)),), 3,
                                  (6, 40)),
                           Joined(Addr(1, 4, S), 32, "standby32")))
    left = View(8, left=(Addr(1, 3, P), Addr(1, 3, S)), left_cut=(5, 130))
    welcome = Welcome("standby40", 7, ((Addr(1, 4, P), "standby31"),), (5,), (4, 5), (3,))
    for msg in (view, left, welcome):
        env = Envelope(CONTROLLER, ProcAddr("node0"), 7, msg, 0, None)
        assert decode(encode(env)).msg == msg


def test_a_job_with_dormant_pairs_starts_on_its_running_ones_and_restarts_on_those_owning_groups():
    maps, running = dormant_start(None, 6, 4, G, 2)
    assert running == 4 and set(maps) == {1, 2}
    assert all(set(m.owners.tolist()) == {0, 1, 2, 3} and m.partitions == 6
               for m in maps.values())
    # a checkpoint from before the growth: four run again, the others dormant again
    before = GroupMap.even(4, G, 6)
    manifest = {"partitions": 6, "stages": 2, "key_groups": G, "checkpoint": 3, "cut": 9,
                "groups": {"1": before.owners.tolist(), "2": before.owners.tolist()}}
    assert dormant_start(manifest, 6, 4, G, 2)[1] == 4
    # one cut after pairs 4 and 5 started, their keys spread back over four: they run
    # again (idle, with what they kept), as they did when it was cut
    assert dormant_start(dict(manifest, running=6), 6, 4, G, 2)[1] == 0
    assert dormant_start(dict(manifest, running=5), 6, 4, G, 2)[1] == 5
    # after a move onto pair 5 alone every pair runs (0: none dormant; 4 idle, owning
    # nothing), the maps as the checkpoint left them
    owners = before.owners.copy()
    owners[-1] = 5
    manifest["groups"]["1"] = owners.tolist()
    maps, running = dormant_start(manifest, 6, 4, G, 2)
    assert running == 0 and maps[1].owners.tolist() == owners.tolist()
    # contiguous over all six (no map written): every pair runs, none dormant
    assert dormant_start(dict(manifest, groups={}), 6, 4, G, 2) == ({}, 0)
    # a job without dormant pairs: as before
    assert dormant_start(None, 4, 0, G, 2) == ({}, 0)


def test_the_partitions_that_never_owned_a_group_are_empty_at_a_cut_joined_or_not():
    moves = LiveMoves(2, 6, G, None, running=4)
    assert moves.cut(1)[0] == [] and moves.unowned() == {4, 5}
    moves.ask(SpreadAsked(6, G))
    prepares, _ = moves.cut(2)
    assert prepares and moves.unowned() == {4, 5}  # a prepare moves nothing yet
    moves.staged(2)
    carried, (before, after) = moves.cut(3)
    assert {m.dest for m in carried} >= {4, 5}
    assert moves.unowned() == {4, 5}  # empty before this cut's own moves
    moves.cut(4)
    assert moves.unowned() == frozenset()  # they own groups from the cut before on
    assert LiveMoves(2, 4, G, None).unowned() == frozenset()  # no dormant pairs


def test_a_checkpoint_completes_without_a_dormant_partitions_snapshot_and_it_restores_empty(
        tmp_path):
    """Partition 1 is dormant at the cuts: the coordinator takes its snapshot as written
    and empty, the checkpoint completes on partition 0's alone (its manifest saying one
    pair ran), and a replica of partition 1 restored from it starts empty."""
    seg = segment_with_counter(full_every=4)
    store = CheckpointStore(str(tmp_path))
    writer = SnapshotWriter(store)
    service = CheckpointService(store, CheckpointCoordinator(1, 2, "fp"))
    try:
        for k in (1, 2):
            seg.chain.operators[0].process(("a", k))
            (snap,) = crossed(seg, k, k).snapshot()
            writer.write(snap)
            service.cut_chosen(k, k, k, dormant={1}, running=1)
            service.sink_committed(k, None)
        writer.stop()
        for written in writer.done():
            service.snapshot_written(written)
        service.settle()
    finally:
        service.stop()
    assert service.latest.number == 2
    assert store.latest()["chains"][1] == [] and store.latest()["running"] == 1
    fresh, dormant = segment_with_counter(full_every=4), segment_with_counter(full_every=4)
    empty = dormant.chain.get_state()
    restore_operators(store, 2, {Addr(1, 0, P): fresh, Addr(1, 1, P): dormant})
    assert fresh.chain.get_state() == seg.chain.get_state()
    assert dormant.chain.get_state() == empty


class _Controller(JoinSide):
    """A controller's record, as much as ``JoinSide`` reads of it."""

    def __init__(self, recovery: Recovery):
        self.recovery, self.started = recovery, True
        self._init_membership()
        self.events, self.node_stats = [], {}
        self.registered = {n: () for n in recovery.topology.workers}
        self.dead: set = set()
        self.sent: list = []

    def _broadcast(self, views):
        self.sent += views

    def clock(self):
        return 0.0


def _controller():
    placement = ChainedDeclustering(2, 2)
    standbys = ["standby0"]
    names = [f"node{n}" for n in placement.nodes] + standbys
    topology = Topology(placement, 2, 4, {n: 10 + k for k, n in enumerate(names)}, standbys)
    return _Controller(Recovery(topology))


def test_a_join_waits_for_two_free_standbys_and_is_applied_once_every_worker_says_so():
    c = _controller()
    c.ask_join(range(2, 4))
    c.place_joins()
    assert c.joined_view(range(2, 4)) is None and c.sent == []  # one standby: it waits
    assert c.join_waits() == (1, 0, False)
    c.recovery.add_standby("standby1", 40)  # (a retried task registers)
    c.registered["standby1"] = ()
    c.place_joins()
    view = c.joined_view([3, 2])
    assert view == c.sent[-1].number and {j.addr.partition for j in c.sent[-1].joined} == {2, 3}
    assert c.lagging(view) == ["node0", "node1", "standby0", "standby1"]
    for name in ("node0", "node1", "standby0"):
        c.heard_view(name, view)
    c.heard_view("standby1", view - 1)
    assert c.lagging(view) == ["standby1"]
    c.dead.add("standby1")  # a dead one is waited for by no one
    assert c.lagging(view) == []


def test_a_join_carries_where_its_replicas_start_and_one_withdrawn_is_never_placed():
    c = _controller()
    start = (((1, (0, 1, 1, 0)),), 3, (4, 17))
    c.ask_join(range(2, 4), start)
    c.place_joins()  # one standby: it waits
    c.withdraw_join(range(2, 4))
    c.recovery.add_standby("standby1", 40)
    c.place_joins()
    assert c.sent == [] and c.joined_view(range(2, 4)) is None
    c.ask_join(range(2, 4), start)  # asked again: placed, starting where it says
    c.place_joins()
    [view] = c.sent
    assert {(j.groups, j.moves_seen, j.cut) for j in view.joined} == {start}


def test_live_moves_hold_every_move_while_a_join_is_applied():
    moves = LiveMoves(1, 4, G, None, running=2)
    moves.cut_at(1, 10)
    moves.ask(SpreadAsked(2, G))
    assert moves.cut(2)[0] == []  # (nothing moves from a spread over the pairs owning all)
    moves.ask(SpreadAsked(3, G))
    groups, seen, cut = moves.join_start()
    assert seen == 0 and cut == (1, 10)
    assert dict(groups)[1] == tuple(GroupMap.even(2, G, 4).owners.tolist())
    assert moves.cut(3)[0] == []  # held: the joined replicas start from the maps before
    moves.join_applied()
    prepares = moves.cut(4)[0]
    assert prepares and all(m.prepare for m in prepares) and moves.moves_cut == 4


def _options(**kw):
    return JobOptions.from_kwargs(**dict(dict(nodes=4, max_nodes=6, standbys=2,
                                               checkpoint="/tmp/x"), **kw))


@pytest.mark.parametrize("kw, splits, why", [
    (dict(replication="none"), 0, "replication='none'"),
    ({}, 2, "SplitSource"),
    (dict(ordered_output=False, egress_on_executors=True), 0, "egress_on_executors=True"),
    (dict(checkpoint=None), 0, "no checkpoint="),
    (dict(standbys=1), 0, "standbys=1"),
])
def test_dormant_pairs_are_refused_where_they_are_not_built_naming_why(kw, splits, why):
    with pytest.raises(ValueError, match=why):
        check_dormant(_options(**kw), splits)
    check_dormant(_options(), 0)
    check_dormant(_options(ordered_output=False), 0)  # sinks per partition in the driver
    check_dormant(_options(max_nodes=None, standbys=0, checkpoint=None), 0)
    with pytest.raises(ValueError, match="max_nodes must be an int >= nodes"):
        _options(max_nodes=3)


def test_a_job_with_dormant_pairs_grows_up_to_max_nodes():
    check_growth(6, 6)
    check_growth(2, 6)  # (to fewer: the pairs past 2 leave, ``_shrink``)
    with pytest.raises(RescaleRefused, match="up to max_nodes=6"):
        check_growth(7, 6)
