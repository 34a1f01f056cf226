"""The durable epoch log of a split (flux/runtime/split_log.py): entries read back in
place order across writes, writers and attempts; two writers of the same places that
agree are one; a gap, a damaged object or writers that disagree end what the log can
replay and are named; an earlier attempt's zombie is never read; truncation keeps what a
restart from the oldest kept checkpoint follows."""
from __future__ import annotations

import fsspec
import pytest

from flux.runtime.split_log import SplitLog

pytestmark = pytest.mark.timeout(30)


def split_log(tmp_path, split=0, attempt=0, start=0):
    return SplitLog(fsspec.filesystem("file"), str(tmp_path / "ckpt"), split, attempt, start)


def read(log):
    got = log.read()
    return got.entries, got.damaged


def test_the_entries_come_back_in_place_order_across_writes(tmp_path):
    log = split_log(tmp_path)
    assert read(log) == ([], None) and log.read().last == 0
    assert log.write([(1, ("epoch", 3)), (2, ("item", 7))]) == 2
    log.write([(3, ("cut", 1, 3)), (4, ("item", 9))])
    assert read(log) == ([("epoch", 3), ("item", 7), ("cut", 1, 3), ("item", 9)], None)
    assert log.read().last == 4
    assert read(split_log(tmp_path, 1)) == ([], None)  # each split its own


def test_a_leader_writing_again_what_its_dead_follower_wrote_is_the_same_log(tmp_path):
    log = split_log(tmp_path)
    log.write([(1, ("item", 2)), (2, ("item", 5)), (3, ("epoch", 1))])  # the follower
    log.write([(2, ("item", 5)), (3, ("epoch", 1)), (4, ("item", 2097153))])  # the leader
    assert read(log) == ([("item", 2), ("item", 5), ("epoch", 1), ("item", 2097153)], None)


def test_writers_that_disagree_end_the_log_and_are_named(tmp_path):
    log = split_log(tmp_path)
    log.write([(1, ("item", 2)), (2, ("item", 5))])
    log.write([(2, ("item", 4)), (3, ("item", 6))])
    entries, damaged = read(log)
    assert entries == [("item", 2), ("item", 5)]
    assert "000000000002-000000000003" in damaged.path and "other entries" in damaged.why


def test_a_gap_or_a_damaged_object_ends_what_the_log_can_replay(tmp_path):
    log = split_log(tmp_path)
    log.write([(1, ("item", 2))])
    log.write([(3, ("item", 6))])
    entries, damaged = read(log)
    assert entries == [("item", 2)] and "place 2" in damaged.why
    log.write([(2, ("item", 4))])
    assert read(log) == ([("item", 2), ("item", 4), ("item", 6)], None)
    path = (tmp_path / "ckpt" / "splits" / "0" / "000000-000000000000"
            / "000000000003-000000000003.json")
    path.write_bytes(path.read_bytes().replace(b"6", b"8"))
    entries, damaged = read(log)
    assert entries == [("item", 2), ("item", 4)] and "checksum" in damaged.why


def test_places_of_one_write_must_follow_each_other_and_the_attempts_start(tmp_path):
    with pytest.raises(ValueError, match="not consecutive"):
        split_log(tmp_path).write([(1, ("item", 2)), (3, ("item", 5))])
    with pytest.raises(ValueError, match="past 4"):
        split_log(tmp_path, attempt=1, start=4).write([(4, ("item", 2))])


def test_a_zombie_of_an_earlier_attempt_writing_past_the_next_ones_start_is_never_read(
        tmp_path):
    first = split_log(tmp_path)
    first.write([(1, ("epoch", 0)), (2, ("item", 3))])
    restart = split_log(tmp_path, attempt=1, start=2)  # a restart read places 1-2
    restart.write([(3, ("epoch", 5)), (4, ("item", 5242884))])
    first.write([(3, ("item", 9)), (4, ("epoch", 1))])  # the old run's node, not stopped yet
    first.write([(2, ("item", 3)), (3, ("item", 7))])   # one object across the start
    assert read(split_log(tmp_path)) == (
        [("epoch", 0), ("item", 3), ("epoch", 5), ("item", 5242884)], None)


def test_truncation_keeps_the_epochs_after_the_oldest_kept_cut_and_what_follows(tmp_path):
    log = split_log(tmp_path)
    log.write([(1, ("epoch", 0)), (2, ("item", 3))])
    log.write([(3, ("epoch", 1)), (4, ("item", 2097160))])
    log.write([(5, ("epoch", 2)), (6, ("item", 4194310))])
    restart = split_log(tmp_path, attempt=1, start=6)
    restart.write([(7, ("epoch", 3)), (8, ("item", 6291460))])
    assert log.truncate(0) == 1  # a cut at epoch 0's end: epoch 1's start on is kept
    got = log.read()
    assert (got.first, got.damaged) == (3, None) and got.entries[0] == ("epoch", 1)
    assert log.truncate(2) == 2  # nothing of the first attempt is kept: its folder goes
    got = split_log(tmp_path).read()
    assert (got.first, got.entries, got.damaged) == (
        7, [("epoch", 3), ("item", 6291460)], None)
    assert [a for a, _ in split_log(tmp_path).attempts()] == [1]
    assert log.truncate(9) == 0  # no start after it yet: nothing goes


def test_the_first_run_records_where_the_splits_begin_and_later_runs_read_it(tmp_path):
    from flux.errors import CheckpointCorrupt
    from flux.runtime.split_log import SplitLogs

    url = str(tmp_path / "ckpt")
    first = {"topic": "t", "starts": [4, 9], "ends": None}
    assert SplitLogs(url, 2).origin(first) == first
    moved = {"topic": "t", "starts": [40, 90], "ends": None}  # "latest" a day later
    assert SplitLogs(url, 2).origin(moved) == first
    path = tmp_path / "ckpt" / "splits" / "origin.json"
    path.write_bytes(path.read_bytes().replace(b"9", b"8"))
    with pytest.raises(CheckpointCorrupt, match="origin.json.*checksum"):
        SplitLogs(url, 2).origin(moved)


def test_a_restart_from_the_first_input_refuses_a_log_truncated_for_lost_checkpoints(
        tmp_path):
    from flux.errors import CheckpointCorrupt
    from flux.runtime.split_log import SplitLogs

    log = split_log(tmp_path)
    log.write([(1, ("epoch", 0)), (2, ("item", 3))])
    log.write([(3, ("epoch", 1)), (4, ("item", 2097160))])
    logs = SplitLogs(str(tmp_path / "ckpt"), 1 + 1)
    assert logs.replay(0, [])[0] == (0, [("epoch", 0), ("item", 3), ("epoch", 1),
                                          ("item", 2097160)], 4)
    log.truncate(0)  # a checkpoint at epoch 0's end was kept, then lost
    with pytest.raises(CheckpointCorrupt, match="needs its log from place 1"):
        logs.replay(0, [])
    assert logs.replay(2 * 2 ** 20 * 1, [7, 0])[0] == (7, [("epoch", 1), ("item", 2097160)], 4)
