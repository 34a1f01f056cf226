"""The durable building blocks: a replayable FileSource, exactly-once FileSink
and DeltaSink (a real Delta table through delta-rs), and the checkpoint store."""
from __future__ import annotations

import json
import os

import pytest

from flux.connector_api import Sink, Source, is_exactly_once
from flux.errors import CheckpointMismatch, SinkFenced
from flux.runtime.checkpoint_store import CheckpointStore
from flux.connector_api import SinkPerPartition
from flux.connectors.delta_sink import DeltaSink, read_delta_sink
from flux.connectors.file_sink import FileSink, read_file_sink
from flux.connectors.file_source import FileSource
from flux.connectors.sources import NOT_YET

pytestmark = pytest.mark.timeout(60)


def put(folder, name, records):
    tmp = folder / f".{name}"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, folder / name)  # placed whole, as a file source expects


# -- FileSource -----------------------------------------------------------------------------

def test_file_source_reads_files_in_name_order_and_resumes_at_its_position(tmp_path):
    put(tmp_path, "b.jsonl", [{"k": 3}, {"k": 4}])
    put(tmp_path, "a.jsonl", [{"k": 1}, {"k": 2}])
    (tmp_path / "_ignored.jsonl").write_text('{"k": 99}\n')
    src = FileSource(str(tmp_path))
    assert isinstance(src, Source)
    assert [next(src), next(src), next(src)] == [{"k": 1}, {"k": 2}, {"k": 3}]
    where = src.position
    assert where[0] == "b.jsonl"
    again = FileSource(str(tmp_path))
    again.open(json.loads(json.dumps(where)))  # a position survives JSON (a manifest)
    assert list(again) == [{"k": 4}]
    assert list(src) == [{"k": 4}]


def test_following_a_folder_picks_up_new_files_and_waits_for_a_line_being_written(tmp_path):
    now = [0.0]
    src = FileSource(str(tmp_path), follow=True, poll_interval=1.0, clock=lambda: now[0])
    assert next(src) is NOT_YET
    put(tmp_path, "001.jsonl", [1, 2])
    now[0] += 1.5
    assert [next(src), next(src)] == [1, 2]
    with open(tmp_path / "001.jsonl", "a") as f:
        f.write("3")  # a line without its newline: maybe still being written
    assert next(src) is NOT_YET
    put(tmp_path, "002.jsonl", [4])
    now[0] += 1.5
    assert [next(src), next(src)] == [3, 4]  # a later file: the line was whole
    assert src.position == ["002.jsonl", 2]


def test_a_position_in_a_file_that_is_gone_is_refused_clearly(tmp_path):
    src = FileSource(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no longer has 'x.jsonl'"):
        src.open(["x.jsonl", 10])
    with pytest.raises(FileNotFoundError, match="no folder"):
        FileSource(str(tmp_path / "missing"))


def test_a_line_that_is_not_json_names_file_and_byte(tmp_path):
    (tmp_path / "a.jsonl").write_text('1\n{oops\n')
    src = FileSource(str(tmp_path))
    assert next(src) == 1
    with pytest.raises(ValueError, match="'a.jsonl' at byte 2 is not JSON"):
        next(src)


# -- FileSink -------------------------------------------------------------------------------

OUT = [((i, 0), {"n": i}) for i in range(1, 8)]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_file_sink_commits_by_sn_and_a_reopened_sink_drops_the_replay(tmp_path, fmt):
    sink = FileSink(str(tmp_path), format=fmt)
    assert isinstance(sink, Sink) and is_exactly_once(sink) and not is_exactly_once(print)
    sink.write(OUT[:3])
    sink.commit((3, 0))
    sink.write(OUT[3:5])  # written, never committed: the driver dies here
    del sink
    again = FileSink(str(tmp_path), format=fmt)
    assert again.committed() == (3, 0)
    again.write(OUT)  # a restart replays from the checkpoint before (3, 0)
    again.commit((7, 0))
    assert again.skipped == 3
    assert read_file_sink(str(tmp_path)) == [(sn, r) for sn, r in OUT]


def test_a_part_renamed_but_never_named_by_the_manifest_is_removed(tmp_path):
    sink = FileSink(str(tmp_path))
    sink.write(OUT[:2])
    sink.commit((2, 0))
    (tmp_path / "part-00000001-00000001.jsonl").write_text('{"sn": [5, 0], "record": 1}\n')
    (tmp_path / ".part-00000001-00000002.jsonl.tmp").write_text("half")
    FileSink(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["_flux_epochs", "part-00000001-00000000.jsonl"]
    assert read_file_sink(str(tmp_path)) == OUT[:2]


def test_file_sink_as_a_plain_callable_and_its_errors(tmp_path):
    with FileSink(str(tmp_path), commit_every=3) as sink:
        for item in OUT:
            sink(item)
        assert len(sink.parts) == 2  # committed at 3 and 6
    assert read_file_sink(str(tmp_path)) == OUT
    with pytest.raises(ValueError, match="holds jsonl parts, not parquet"):
        FileSink(str(tmp_path), format="parquet")
    with pytest.raises(ValueError, match="commit of"):
        FileSink(str(tmp_path)).commit((1, 0))


# -- DeltaSink (a real Delta table) ---------------------------------------------------------

def test_delta_sink_commits_with_its_sn_and_skips_the_replay_after_a_restart(tmp_path):
    uri = str(tmp_path / "table")
    sink = DeltaSink(uri, app_id="job-1")
    assert is_exactly_once(sink) and sink.committed() is None
    sink.write(OUT[:4])
    sink.commit((4, 0))
    sink.write(OUT[4:6])  # never committed
    again = DeltaSink(uri, app_id="job-1")
    # versions: the first open's fence, its commit, this open's fence
    assert again.committed() == (4, 0) and again.version == 3
    again.write(OUT)
    again.commit((7, 0))
    assert read_delta_sink(uri) == OUT
    from deltalake import DeltaTable

    assert DeltaTable(uri).transaction_version("job-1") == 4


def test_a_delta_sink_that_another_writer_overtook_is_fenced(tmp_path):
    uri = str(tmp_path / "table")
    old, new = DeltaSink(uri, app_id="job"), None
    old.write(OUT[:1])
    old.commit((1, 0))
    new = DeltaSink(uri, app_id="job")  # another incarnation took over
    new.write(OUT[1:2])
    new.commit((2, 0))
    old.write(OUT[1:3])
    with pytest.raises(SinkFenced, match="another writer took over"):
        old.commit((3, 0))
    assert read_delta_sink(uri) == OUT[:2]


def test_a_delta_sink_opened_again_fences_the_one_before_before_either_commits(tmp_path):
    """The zombie's first commit after its successor opened fails, though the successor
    has committed nothing yet: the open fences (as the writers on the nodes assume)."""
    uri = str(tmp_path / "table")
    zombie = DeltaSink(uri, app_id="job")
    zombie.write(OUT[:2])
    zombie.commit((2, 0))
    zombie.write(OUT[2:4])
    successor = DeltaSink(uri, app_id="job")
    with pytest.raises(SinkFenced):
        zombie.commit((4, 0))
    assert successor.committed() == (2, 0)
    successor.write(OUT[2:5])
    successor.commit((5, 0))
    assert read_delta_sink(uri) == OUT[:5]


def test_a_delta_commit_racing_another_of_its_app_id_fails_instead_of_landing_beside_it(
        tmp_path, monkeypatch):
    """The zombie checked the version before its successor opened and committed, and
    writes after: its commit is made on the table as it checked it, so Delta finds the
    two transactions of one app id in conflict and nothing is written twice."""
    import deltalake

    uri = str(tmp_path / "table")
    zombie = DeltaSink(uri, app_id="job")
    zombie.write(OUT[:2])
    zombie.commit((2, 0))
    zombie.write(OUT[2:4])
    real, successor = deltalake.write_deltalake, []

    def successor_commits_between_the_check_and_the_write(*args, **kwargs):
        monkeypatch.setattr(deltalake, "write_deltalake", real)
        successor.append(DeltaSink(uri, app_id="job"))
        successor[0].write(OUT[2:4])
        successor[0].commit((4, 0))
        return real(*args, **kwargs)

    monkeypatch.setattr(deltalake, "write_deltalake",
                        successor_commits_between_the_check_and_the_write)
    with pytest.raises(SinkFenced, match="committed while this one did"):
        zombie.commit((4, 0))
    assert read_delta_sink(uri) == OUT[:4]


def test_the_delta_sinks_of_a_tables_partitions_open_at_once_each_fenced_once(tmp_path):
    """Their opens race to create the table and fence their app ids at once: each ends
    with its own fence, none fails."""
    for run in range(3):
        uri = str(tmp_path / f"table-{run}")
        sinks = SinkPerPartition(lambda p: DeltaSink(uri, app_id=f"job-{p}")).open_many(
            range(6))
        assert [s.version for s in sinks] == [1] * 6
        for p, sink in enumerate(sinks):
            sink.write([((p + 1, p), p)])
            sink.commit((p + 1, p))
        assert sorted(read_delta_sink(uri)) == [((p + 1, p), p) for p in range(6)]


def test_a_delta_sink_opened_only_to_read_fences_nothing(tmp_path):
    from deltalake import DeltaTable

    uri = str(tmp_path / "table")
    writer = DeltaSink(uri, app_id="job")
    writer.write(OUT[:2])
    writer.commit((2, 0))
    reader, = SinkPerPartition(lambda p: DeltaSink(uri, app_id="job")).open_many(
        [0], to_read=True)
    assert reader.committed() == (2, 0)
    assert DeltaTable(uri).transaction_version("job") == 2  # no fence committed
    writer.write(OUT[2:4])
    writer.commit((4, 0))
    assert read_delta_sink(uri) == OUT[:4]
    with pytest.raises(RuntimeError, match="only to read"):
        reader.commit((5, 0))


# -- the checkpoint store -------------------------------------------------------------------

def test_only_complete_checkpoints_are_read_and_old_ones_are_removed(tmp_path):
    store = CheckpointStore(str(tmp_path), keep=2)
    assert store.latest() is None
    for k in (1, 2, 3):
        store.write(k, "stage1-p0", b"state %d" % k)
        store.complete(k, {"fingerprint": "abc", "partitions": 2, "files": ["stage1-p0"],
                           "source": ["a.jsonl", 10 * k]})
    store.write(4, "stage1-p0", b"half")  # checkpoint 4 never completes
    assert store.complete_ids() == [2, 3]
    latest = store.latest("abc", 2)
    assert latest["checkpoint"] == 3 and latest["source"] == ["a.jsonl", 30]
    assert store.read(3, "stage1-p0") == b"state 3"
    with pytest.raises(FileNotFoundError, match="is not in the store"):
        store.complete(5, {"files": ["stage1-p0"]})


def test_a_checkpoint_of_another_dataflow_is_refused_clearly(tmp_path):
    store = CheckpointStore(str(tmp_path))
    store.complete(1, {"fingerprint": "abc", "partitions": 4, "files": []})
    with pytest.raises(CheckpointMismatch, match="partitions 4, this job has 8"):
        store.latest("abc", 8)
    with pytest.raises(CheckpointMismatch, match="fingerprint 'abc'"):
        store.latest("xyz", 4)


def test_the_store_takes_fsspec_urls(tmp_path):
    store = CheckpointStore("memory://flux-test-store")
    store.write(1, "s", b"x")
    store.complete(1, {"files": ["s"]})
    assert store.latest()["checkpoint"] == 1
    store.fs.rm(store.root, recursive=True)
