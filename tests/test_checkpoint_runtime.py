"""The runtime's pieces of checkpoints, without Spark: replayable sources, the
snapshot writer, the driver's checkpoint service, a node restoring its operators."""
from __future__ import annotations

import pytest

from controller.checkpoints import CheckpointCoordinator
from flux.addresses import Addr, P, S
from flux.control_messages import SnapshotWritten
from flux.effects import Snapshot
from flux.runtime.checkpoint_service import CheckpointService
from flux.runtime.checkpoint_store import CheckpointStore
from flux.connectors.file_source import FileSource
from flux.runtime.snapshot_writer import SnapshotWriter, snapshot_name
from flux.connectors.sources import NOT_YET, Paced, SequenceSource, peek, replayable


def test_a_sequence_is_replayable_from_any_position():
    src = replayable([10, 11, 12, 13])
    assert isinstance(src, SequenceSource)
    assert [next(src), next(src)] == [10, 11] and src.position == 2
    src.open(1)
    assert list(src) == [11, 12, 13]
    with pytest.raises(ValueError, match="not a position of a sequence of 4 records"):
        src.open(9)
    assert replayable(iter([1])) is None


def test_peeking_a_source_leaves_it_where_it_was(tmp_path):
    (tmp_path / "a.jsonl").write_text("1\n2\n3\n")
    src = FileSource(str(tmp_path))
    sample, same = peek(src, 2)
    assert sample == [1, 2] and same is src and list(src) == [1, 2, 3]


def test_paced_keeps_its_schedule_across_a_restart():
    """Record i arrives at i / rate whatever happens: after a restart at an earlier
    position what arrived meanwhile is read at once, timed from its first arrival."""
    now = [0.0]
    src = Paced(list(range(100)), rate=10, clock=lambda: now[0])
    assert peek(src, 3)[0] == [0, 1, 2] and src.start is None  # peeking starts no pace
    assert next(src) == 0 and next(src) is NOT_YET
    now[0] = 1.0
    assert [next(src) for _ in range(10)] == list(range(1, 11)) and next(src) is NOT_YET
    src.open(4)  # a restart from a checkpoint whose cut was input 4
    assert next(src) == 4 and src.arrival == pytest.approx(0.4)
    with pytest.raises(ValueError, match="rate must be > 0"):
        Paced([1], 0)
    with pytest.raises(ValueError, match="replayable source"):
        Paced(iter([1]), 5)


def test_the_writer_writes_off_the_caller_thread_and_reports_each_snapshot(tmp_path):
    store = CheckpointStore(str(tmp_path))
    writer = SnapshotWriter(store, "run7")
    try:
        writer.write(Snapshot(1, 40, Addr(2, 3, P), b"state"))
        with pytest.raises(ValueError, match="without its state"):
            writer.write(Snapshot(1, 40, Addr(2, 3, S), None))
    finally:
        writer.stop()
    (done,) = writer.done()
    assert done.name == snapshot_name(Addr(2, 3, P), "run7") == "stage2-part3-P-run7.state"
    assert (done.number, done.nbytes, done.error) == (1, 5, "")
    assert store.read(1, done.name) == b"state"


def test_a_failed_write_is_reported_with_its_reason(tmp_path):
    store = CheckpointStore(str(tmp_path))
    (tmp_path / "ckpt-0000000007").write_text("a file where the folder should be")
    writer = SnapshotWriter(store)
    writer.write(Snapshot(7, 1, Addr(1, 0, P), b"x"))
    writer.stop()
    (done,) = writer.done()
    assert done.error and done.nbytes == 0


def test_the_service_writes_the_manifest_once_every_report_is_in(tmp_path):
    store = CheckpointStore(str(tmp_path), keep=2)
    service = CheckpointService(store, CheckpointCoordinator(1, 2, "fp"))
    try:
        for k, cut in ((1, 10), (2, 20), (3, 30)):
            service.cut_chosen(k, cut, {"at": cut})
            for p in (0, 1):
                name = snapshot_name(Addr(1, p, P))
                store.write(k, name, b"s" * (p + 1))
                service.snapshot_written(SnapshotWritten(k, Addr(1, p, P), name, p + 1, 0.01))
            service.settle()
            assert not service.completed or service.completed[-1].number < k
            service.sink_committed(k, (cut, 1))
            service.settle()
            assert service.latest.number == k and service.latest.cut == cut
        service.cut_chosen(4, 40, None)
        service.snapshot_written(SnapshotWritten(4, Addr(1, 0, P), "", 0, 0.0, "OSError: full"))
        service.settle()
    finally:
        service.stop()
    assert store.complete_ids() == [2, 3]  # the last two kept
    assert store.latest("fp", 2)["source"] == {"at": 30}
    assert service.latest.nbytes == 3 and service.errors == ["checkpoint 4: : OSError: full"]
