"""The durable epoch log of a split (flux/runtime/split_log.py): entries read back in
place order across writes and writers; two writers of the same places that agree are
one; a gap, a damaged object or writers that disagree end what the log can replay and
are named."""
from __future__ import annotations

import fsspec
import pytest

from flux.runtime.split_log import SplitLog

pytestmark = pytest.mark.timeout(30)


def split_log(tmp_path, split=0):
    return SplitLog(fsspec.filesystem("file"), str(tmp_path / "ckpt"), split)


def test_the_entries_come_back_in_place_order_across_writes(tmp_path):
    log = split_log(tmp_path)
    assert log.read() == ([], None)
    assert log.write([(1, ("epoch", 3)), (2, ("item", 7))]) == 2
    log.write([(3, ("cut", 1, 3)), (4, ("item", 9))])
    assert log.read() == ([("epoch", 3), ("item", 7), ("cut", 1, 3), ("item", 9)], None)
    assert split_log(tmp_path, 1).read() == ([], None)  # each split its own


def test_a_leader_writing_again_what_its_dead_follower_wrote_is_the_same_log(tmp_path):
    log = split_log(tmp_path)
    log.write([(1, ("item", 2)), (2, ("item", 5)), (3, ("epoch", 1))])  # the follower
    log.write([(2, ("item", 5)), (3, ("epoch", 1)), (4, ("item", 2097153))])  # the leader
    assert log.read() == ([("item", 2), ("item", 5), ("epoch", 1), ("item", 2097153)], None)


def test_writers_that_disagree_end_the_log_and_are_named(tmp_path):
    log = split_log(tmp_path)
    log.write([(1, ("item", 2)), (2, ("item", 5))])
    log.write([(2, ("item", 4)), (3, ("item", 6))])
    entries, damaged = log.read()
    assert entries == [("item", 2), ("item", 5)]
    assert "000000000002-000000000003" in damaged.path and "other entries" in damaged.why


def test_a_gap_or_a_damaged_object_ends_what_the_log_can_replay(tmp_path):
    log = split_log(tmp_path)
    log.write([(1, ("item", 2))])
    log.write([(3, ("item", 6))])
    entries, damaged = log.read()
    assert entries == [("item", 2)] and "place 2" in damaged.why
    log.write([(2, ("item", 4))])
    assert log.read() == ([("item", 2), ("item", 4), ("item", 6)], None)
    path = tmp_path / "ckpt" / "splits" / "0" / "000000000003-000000000003.json"
    path.write_bytes(path.read_bytes().replace(b"6", b"8"))
    entries, damaged = log.read()
    assert entries == [("item", 2), ("item", 4)] and "checksum" in damaged.why


def test_places_of_one_write_must_follow_each_other(tmp_path):
    with pytest.raises(ValueError, match="not consecutive"):
        split_log(tmp_path).write([(1, ("item", 2)), (3, ("item", 5))])
