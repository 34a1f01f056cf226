"""The durable input log of a source with partitions of its own (DESIGN 10):
what it holds reads back in order from any cut, a restart's overlapping appends agree,
what a checkpoint covers goes, and the writer keeps inputs waiting while it cannot write."""
from __future__ import annotations

import time

import pytest

from flux.runtime.checkpoint_store import CheckpointStore
from flux.runtime.input_log import InputLog, InputLogWriter

pytestmark = pytest.mark.timeout(30)


def test_the_log_reads_back_the_partitions_of_the_inputs_after_any_cut(tmp_path):
    log = InputLog(CheckpointStore(str(tmp_path)))
    assert log.read(after=0) == []
    assert log.append(1, [0, 0, 1, 2, 2, 2]) == 6
    assert log.append(7, [1, 0]) == 8
    assert log.read(after=0) == [0, 0, 1, 2, 2, 2, 1, 0]
    assert log.read(after=4) == [2, 2, 1, 0]
    assert log.read(after=8) == []
    log.append(5, [2, 2, 1, 0, 2])  # a restart from cut 4 logs again what it replays, and more
    assert log.read(after=4) == [2, 2, 1, 0, 2]
    log.truncate(6)
    assert log.read(after=6) == [1, 0, 2]
    assert log.read(after=0) == []  # 1-6 went: the log starts at 5 now


def test_a_gap_ends_what_the_log_can_replay(tmp_path):
    log = InputLog(CheckpointStore(str(tmp_path)))
    log.append(1, [0, 1])
    log.append(5, [1])
    assert log.read(after=0) == [0, 1]


def test_the_log_lives_beside_the_checkpoints_without_being_one(tmp_path):
    store = CheckpointStore(str(tmp_path))
    InputLog(store).append(1, [3])
    assert store.ids() == [] and (tmp_path / "inputs").is_dir()


def wait_done(writer, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        last = writer.done()
        if last is not None:
            return last
        time.sleep(0.005)
    return None


def test_the_writer_appends_one_at_a_time_and_retries_until_it_can(tmp_path):
    store = CheckpointStore(str(tmp_path))
    log = InputLog(store)
    writer = InputLogWriter(log, retry_after=0.05)
    try:
        writer.submit(1, [0, 1])
        with pytest.raises(RuntimeError, match="under way"):
            writer.submit(3, [1])
        assert wait_done(writer) == 2 and not writer.busy
        (tmp_path / "inputs").rename(tmp_path / "away")  # the store goes away for a while
        (tmp_path / "inputs").write_text("not a folder")
        writer.submit(3, [1, 1])
        assert wait_done(writer, 0.3) is None and writer.errors  # inputs 3-4 must wait
        (tmp_path / "inputs").unlink()
        (tmp_path / "away").rename(tmp_path / "inputs")
        assert wait_done(writer) == 4
    finally:
        writer.stop()
    assert log.read(after=0) == [0, 1, 1, 1]
