"""Live moves of key groups (DESIGN 13): the group map, routing by it, and moves carried
in band with the checkpoint cuts, so a consumer that never saw a move's own cut still
crosses its moves there."""
from __future__ import annotations

import numpy as np
import pytest

from exchange.group_map import GroupMap, GroupMove
from exchange.partitioner import HashPartitioner, group_owner
from exchange.routing import moved, router_for
from flux.protocol.cuts import Cuts
from flux.testing.counter import first_field

pytestmark = pytest.mark.timeout(60)


def test_the_even_map_is_the_contiguous_ranges():
    groups = GroupMap.even(6, 256)
    assert groups.owner(np.arange(256)).tolist() == \
        group_owner(np.arange(256), 256, 6).tolist()
    assert groups.ranges()[0] == (0, 42, 0) and groups.ranges()[-1] == (214, 255, 5)


def test_a_move_gives_its_groups_to_the_destination_only():
    groups = GroupMap.even(4, 256).moved([GroupMove(1, 10, 20, 0, 3)])
    assert set(groups.owner(np.arange(10, 21)).tolist()) == {3}
    assert groups.owner(9) == 0 and groups.owner(21) == 0
    assert groups.ranges()[:3] == [(0, 9, 0), (10, 20, 3), (21, 63, 0)]


def test_a_move_of_groups_its_source_does_not_own_is_refused():
    with pytest.raises(ValueError, match="does not own"):
        GroupMap.even(4, 256).moved([GroupMove(1, 60, 70, 0, 2)])


def test_a_router_after_a_move_sends_the_moved_keys_to_the_destination():
    router = router_for(first_field, 4)
    group = HashPartitioner(4).group
    keys = [f"k{i}" for i in range(200)]
    source = int(router.route((keys[0], 1)))
    g = group(keys[0])
    after = moved(router, [GroupMove(1, g, g, source, (source + 1) % 4)])
    for key in keys:
        want = (source + 1) % 4 if group(key) == g else router.route((key, 1))
        assert after.route((key, 1)) == want


def test_a_consumer_that_learns_a_later_cut_first_still_crosses_the_moves_before_it():
    move = GroupMove(1, 0, 5, 0, 1)
    cuts = Cuts()
    cuts.learn((2, 9, ((1, 4, (move,)),)))  # cut 1 (at input 4) never came alone
    assert cuts.pending == {2: 9}  # checkpoint 1 is skipped, as before
    assert cuts.moves_due((3,)) is None and cuts.moves_due((4,)) == 1
    assert cuts.cross_moves(1) == (move,)
    cuts.learn((3, 12, ((1, 4, (move,)),)))  # known already: not again
    assert not cuts.moves
    assert cuts.latest == (3, 12) and cuts.move_cuts == ((1, 4, (move,)),)


def test_cuts_with_moves_survive_a_catch_up():
    cuts = Cuts()
    cuts.learn((1, 4, ((1, 4, (GroupMove(2, 0, 5, 0, 1),)),)))
    copy = Cuts()
    copy.install_state(cuts.to_state())
    assert copy.moves == cuts.moves and copy.move_cuts == cuts.move_cuts
    assert copy.latest == cuts.latest


def test_the_moves_of_a_rescale_make_the_new_ranges():
    grown = GroupMap.even(4, 256, pairs=6)  # pairs 4 and 5 own nothing yet
    moves = grown.moves_to(GroupMap.even(6, 256), stage=1)
    assert moves[:2] == [GroupMove(1, 43, 63, 0, 1), GroupMove(1, 86, 127, 1, 2)]
    assert grown.moved(moves) == GroupMap.even(6, 256)
    shrunk = GroupMap.even(3, 256, pairs=6)
    assert GroupMap.even(6, 256).moved(GroupMap.even(6, 256).moves_to(shrunk, 1)) == shrunk


def _producer():
    from flux.addresses import P, S, Addr
    from flux.protocol.producer import SEND, Producer

    consumer = (Addr(1, 0, P), Addr(1, 0, S))
    return Producer(Addr(0, 0, P), [consumer], 8, 4, normal_modes=(SEND, SEND)), consumer


def test_a_connection_is_told_each_move_cut_once_and_a_new_replica_all_of_them():
    producer, consumer = _producer()
    first, second = GroupMove(1, 0, 5, 0, 1), GroupMove(1, 6, 9, 0, 1)
    producer.cut, producer.move_cuts = (1, 4), ((1, 4, (first,)),)
    producer.put(0, (3, 0), "a")
    assert producer.flush(0, 0, (4,)).msg.cut == (1, 4, ((1, 4, (first,)),))
    producer.put(0, (5, 0), "b")
    assert producer.flush(0, 0, (6,)).msg.cut == (1, 4)  # told already
    producer.cut = (2, 8)
    producer.move_cuts += ((2, 8, (second,)),)
    assert producer.flush(0, 0, (9,)).msg.cut == (2, 8, ((2, 8, (second,)),))
    producer.fail_addresses({consumer[0]})
    producer.on_avail(consumer[0], 1)  # a new replica there knows nothing we told
    assert producer.links[0][0].told_cut is None


@pytest.mark.parametrize("ordered, moves, both", [
    (False, [GroupMove(2, 0, 9, 0, 2)], True),  # the last stage, a sink per partition
    (False, [GroupMove(1, 0, 9, 0, 2)], False),  # another stage: one replica writes
    (False, [GroupMove(2, 0, 9, 0, 2, prepare=True)], False),  # a prepare moves no owner
    (True, [GroupMove(2, 0, 9, 0, 2)], False),  # one ordered sink: no egress holds
], ids=["last-stage", "first-stage", "prepare", "ordered-output"])
def test_both_replicas_write_the_snapshot_of_a_cut_that_moves_the_last_stage(ordered, moves,
                                                                            both):
    """With a sink per partition, both replicas of every pair, in every stage, write the
    snapshot of a cut whose moves change the last stage's owners (docs/design/
    rescaling.md): the egresses hold the moved keys' outputs until a checkpoint covers
    the cut, so a single failure must not keep that checkpoint open."""
    from flux.addresses import P, Addr
    from flux.protocol.builder import MachineBuilder
    from flux.testing.dataflows import regrouping_dataflow

    builder = MachineBuilder(regrouping_dataflow(2), 3, capacity=64, batch_size=16,
                             ordered_output=ordered)
    segment = builder.segment(Addr(1, 0, P))
    assert not segment.both_replicas_write()  # no cut
    segment.cuts.learn((1, 0, ((1, 0, [m.to_wire() for m in moves]),)))
    assert segment.snapshot_due()
    assert segment.both_replicas_write() is both
