"""Checkpoints are verified before they are trusted: a file truncated, changed by one bit,
zeroed or deleted is found, the restore falls back to the newest older checkpoint whose
files all verify, and with none left the job stops with ``CheckpointCorrupt`` naming the
file; never is a wrong state restored. Also the input log's entries, and which sources a
checkpointing job accepts (their replay order is declared, never guessed)."""
from __future__ import annotations

import json
import os

import pytest

from flux.errors import CheckpointCorrupt, SourceOrderUnknown
from flux.runtime.checkpoint_store import DAMAGED, MANIFEST, CheckpointStore, digest
from flux.runtime.input_log import InputLog

pytestmark = pytest.mark.timeout(60)

DAMAGE = ("truncated", "bit-flipped", "zeroed", "deleted")


def damage(path: str, how: str) -> None:
    """Hurt a file the way disks and object stores do."""
    if how == "deleted":
        os.remove(path)
        return
    data = open(path, "rb").read()
    if how == "truncated":
        data = data[:len(data) // 2]
    elif how == "zeroed":
        data = bytes(len(data))
    else:  # one bit of the middle byte
        middle = len(data) // 2
        data = data[:middle] + bytes([data[middle] ^ 0x04]) + data[middle + 1:]
    with open(path, "wb") as f:
        f.write(data)


def write_checkpoint(store: CheckpointStore, k: int, chain_from: int = None) -> None:
    """Checkpoint ``k`` of one stage and two partitions, as the coordinator writes them:
    partition 0 a whole snapshot at ``k`` (or a chain from ``chain_from``: a delta over
    files of older checkpoints), partition 1 whole; every file's checksum in the manifest."""
    chains, digests = [], {}
    for p in range(2):
        first = chain_from if (p == 0 and chain_from is not None) else k
        chain = [(j, f"part{p}-{j}.state") for j in range(first, k + 1)]
        for j, name in chain:
            data = f"state of partition {p} at {j}".encode()
            if not store.exists(j, name):
                store.write(j, name, data)
            digests[f"{j}/{name}"] = digest(data)
        chains.append([list(f) for f in chain])
    store.complete(k, {"fingerprint": "fp", "partitions": 2, "stages": 1, "cut": 10 * k,
                       "source": 10 * k, "sink": None,
                       "files": [chain[-1][1] for chain in chains], "chains": chains,
                       "digests": digests})


def path_of(store: CheckpointStore, k: int, name: str) -> str:
    return store.path(k, name)


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("which", ["state", "base-of-delta", "manifest"])
def test_a_damaged_checkpoint_is_passed_over_for_the_one_before(tmp_path, how, which):
    store = CheckpointStore(str(tmp_path), keep=5)
    write_checkpoint(store, 1)
    write_checkpoint(store, 2)
    write_checkpoint(store, 3, chain_from=2)  # partition 0: the whole of 2, a delta at 3
    hurt = {"state": path_of(store, 3, "part1-3.state"),
            "base-of-delta": path_of(store, 2, "part0-2.state"),
            "manifest": path_of(store, 3, MANIFEST)}[which]
    damage(hurt, how)
    manifest = store.restorable("fp", 2)
    # checkpoint 2's own chain for partition 0 is its whole file, which is damaged when
    # the base of checkpoint 3's delta is: then only checkpoint 1 verifies
    assert manifest["checkpoint"] == (1 if which == "base-of-delta" else 2)
    assert not store.exists(3, MANIFEST)  # set aside (or gone): never tried again
    assert store.exists(3, DAMAGED) == (how != "deleted" or which != "manifest")
    assert store.complete_ids() == ([1] if which == "base-of-delta" else [1, 2])


@pytest.mark.parametrize("how", DAMAGE)
def test_with_no_checkpoint_left_that_verifies_the_job_stops_naming_the_file(tmp_path, how):
    store = CheckpointStore(str(tmp_path))
    write_checkpoint(store, 1)
    hurt = path_of(store, 1, "part0-1.state")
    damage(hurt, how)
    with pytest.raises(CheckpointCorrupt) as err:
        store.restorable("fp", 2)
    assert err.value.path == hurt and hurt in str(err.value)


def test_a_node_reading_a_file_changed_after_the_check_names_it(tmp_path):
    store = CheckpointStore(str(tmp_path))
    write_checkpoint(store, 1)
    manifest = store.restorable("fp", 2)
    damage(path_of(store, 1, "part1-1.state"), "bit-flipped")
    assert store.read_part(manifest, 1, 0) == [b"state of partition 0 at 1"]
    with pytest.raises(CheckpointCorrupt, match="part1-1.state"):
        store.read_part(manifest, 1, 1)


def test_the_manifest_checks_itself(tmp_path):
    store = CheckpointStore(str(tmp_path))
    write_checkpoint(store, 1)
    path = path_of(store, 1, MANIFEST)
    manifest = json.loads(open(path).read())
    manifest["cut"] += 1  # still valid JSON, still a manifest: one value changed
    with open(path, "w") as f:
        f.write(json.dumps(manifest))
    with pytest.raises(CheckpointCorrupt, match="checksum does not match"):
        store.restorable("fp", 2)


def test_a_manifest_from_before_checksums_is_still_read(tmp_path):
    store = CheckpointStore(str(tmp_path))
    store.write(1, "a.state", b"old")
    with open(os.path.join(store.root, "ckpt-0000000001", MANIFEST), "w") as f:
        json.dump({"fingerprint": "fp", "partitions": 1, "cut": 5, "files": ["a.state"],
                   "checkpoint": 1}, f)
    assert store.restorable("fp", 1)["cut"] == 5
    assert store.read_part(store.restorable(), 1, 0) == [b"old"]


def test_pruning_never_counts_a_damaged_checkpoint_among_the_kept(tmp_path):
    """A kept checkpoint whose manifest is damaged can never be restored: pruning sets it
    aside and keeps an older one in its place, so a fallback still has where to go."""
    store = CheckpointStore(str(tmp_path), keep=2)
    for k in (1, 2, 3):
        write_checkpoint(store, k)
    damage(path_of(store, 3, MANIFEST), "truncated")
    write_checkpoint(store, 4)  # completes, then prunes to two kept
    assert store.complete_ids() == [2, 4]
    damage(path_of(store, 4, "part0-4.state"), "zeroed")
    assert store.restorable("fp", 2)["checkpoint"] == 2


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_input_log_entry_ends_what_the_log_replays_and_says_which(tmp_path, how):
    log = InputLog(CheckpointStore(str(tmp_path)))
    log.append(1, [0, 1, 1])
    log.append(4, [2, 0])
    log.append(6, [1])
    entry = os.path.join(log.dir, f"{4:012d}-{5:012d}.json")
    damage(entry, how)
    order, damaged = log.read_checked(after=1)
    assert order == [1, 1] and damaged is not None
    assert damaged.path.endswith(f"{4:012d}-{5:012d}.json") or how == "deleted"
    log.drop_after(3)  # the inputs past the gap are read and logged anew
    log.append(4, [0, 2, 2])
    assert log.read_checked(after=1) == ([1, 1, 0, 2, 2], None)


def test_an_overlapping_entry_covers_a_damaged_one(tmp_path):
    log = InputLog(CheckpointStore(str(tmp_path)))
    log.append(1, [0, 1])
    log.append(1, [0, 1, 2])  # a restart logged inputs 1-3 again
    damage(os.path.join(log.dir, f"{1:012d}-{2:012d}.json"), "bit-flipped")
    assert log.read_checked(after=0) == ([0, 1, 2], None)


# -- which sources a checkpointing job accepts ------------------------------------------------

class Partitioned:
    """A user's source of partitions interleaved by arrival, declaring nothing but having
    ``last`` and ``replay`` (flux.PartitionedSource)."""

    def __init__(self, n=40, parts=4):
        self.records = [[i % 7, i] for i in range(n)]
        self.parts, self.i = parts, 0

    @property
    def position(self):
        return self.i

    def open(self, position):
        self.i = position

    @property
    def last(self):
        return (self.i - 1) % self.parts, self.i - 1

    def replay(self, partitions):
        pass

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= len(self.records):
            raise StopIteration
        self.i += 1
        return self.records[self.i - 1]


class Positional(Partitioned):
    """A user's source of one ordered stream, declaring it."""

    replay_order = "position"
    last = replay = None


class Undeclared(Positional):
    replay_order = None


class Wrapper:
    """A user's wrapper that forwards position and open only (what hid Kafka's partitions
    from the job)."""

    def __init__(self, source):
        self.source = source

    @property
    def position(self):
        return self.source.position

    def open(self, position):
        self.source.open(position)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.source)


class DeclaringWrapper(Wrapper):
    """A wrapper that says what its source is, as the docs ask."""

    @property
    def replay_order(self):
        from flux.connector_api import replay_order_of

        return replay_order_of(self.source)

    @property
    def last(self):
        return self.source.last

    def replay(self, partitions):
        self.source.replay(partitions)


def sources():
    from flux.connectors.file_source import FileSource

    return {"list": lambda tmp: [[i % 7, i] for i in range(40)],
            "file": lambda tmp: FileSource(str(tmp)),
            "positional": lambda tmp: Positional(),
            "partitioned": lambda tmp: Partitioned(),
            "undeclared": lambda tmp: Undeclared()}


def wrap(kind, source):
    from flux.connectors.sources import Paced, replayable

    if kind == "bare":
        return source
    inner = replayable(source)
    return {"Paced": lambda: Paced(source, 1e6), "wrapper": lambda: Wrapper(inner),
            "declaring-wrapper": lambda: DeclaringWrapper(inner)}[kind]()


#: (source, wrapper) -> the input log on (True), off (False) or refused (None)
EXPECTED = {
    ("list", "bare"): False, ("list", "Paced"): False, ("list", "wrapper"): None,
    ("list", "declaring-wrapper"): False,
    ("file", "bare"): False, ("file", "Paced"): False, ("file", "wrapper"): None,
    ("file", "declaring-wrapper"): False,
    ("positional", "bare"): False, ("positional", "Paced"): False,
    ("positional", "wrapper"): None, ("positional", "declaring-wrapper"): False,
    ("partitioned", "bare"): True, ("partitioned", "Paced"): True,
    ("partitioned", "wrapper"): None, ("partitioned", "declaring-wrapper"): True,
    ("undeclared", "bare"): None, ("undeclared", "Paced"): None,
    ("undeclared", "wrapper"): None, ("undeclared", "declaring-wrapper"): None,
}


@pytest.mark.parametrize("source,wrapper", sorted(EXPECTED))
def test_a_checkpointing_job_logs_the_order_of_every_partitioned_source_or_refuses_it(
        tmp_path, source, wrapper):
    """Never a partitioned source read without the input log: that is what renumbered
    inputs under committed outputs, silently."""
    from flux.testing.dataflows import counting_dataflow
    from flux.spark.job import FluxJob

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(f"[{i % 7}, {i}]\n" for i in range(40)))
    src = wrap(wrapper, sources()[source](tmp_path / "in"))
    want = EXPECTED[source, wrapper]
    if want is None:
        with pytest.raises(SourceOrderUnknown, match="replay_order") as err:
            FluxJob(None, counting_dataflow(1), src, nodes=2, checkpoint=str(tmp_path / "c"))
        assert type(src).__name__ in str(err.value)
        return
    job = FluxJob(None, counting_dataflow(1), src, nodes=2, checkpoint=str(tmp_path / "c"))
    try:
        assert (job.input_log is not None) == want
    finally:
        job.stop()


def test_the_refusal_names_the_wrapper_and_its_source(tmp_path):
    from flux.testing.dataflows import counting_dataflow
    from flux.connectors.sources import Paced
    from flux.spark.job import FluxJob

    with pytest.raises(SourceOrderUnknown, match=r"Paced\(Undeclared\).*declares no replay_order"):
        FluxJob(None, counting_dataflow(1), Paced(Undeclared(), 100), nodes=2,
                checkpoint=str(tmp_path / "c"))


@pytest.mark.parametrize("partitions", [1, 4])
@pytest.mark.parametrize("wrapper", ["bare", "Paced", "wrapper", "declaring-wrapper"])
def test_a_kafka_topic_keeps_its_input_log_however_it_is_wrapped_or_is_refused(
        tmp_path, broker, partitions, wrapper):
    """The case that went wrong was a Kafka topic read through Paced with checkpoints."""
    import uuid

    from flux.testing.dataflows import counting_dataflow
    from flux.connectors.kafka_source import KafkaSource
    from flux.spark.job import FluxJob

    topic = f"wrapped-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions)
    source = KafkaSource(broker.bootstrap, topic, ending="latest")
    try:
        src = wrap(wrapper, source)
        if wrapper == "wrapper":
            with pytest.raises(SourceOrderUnknown, match="Wrapper"):
                FluxJob(None, counting_dataflow(1), src, nodes=2,
                        checkpoint=str(tmp_path / "c"), check_records=0)
            return
        job = FluxJob(None, counting_dataflow(1), src, nodes=2,
                      checkpoint=str(tmp_path / "c"), check_records=0)
        try:
            assert job.input_log is not None
        finally:
            job.stop()
    finally:
        source.close()


def test_stop_before_start_does_nothing(tmp_path):
    from flux.testing.dataflows import counting_dataflow
    from flux.spark.job import FluxJob

    records = [[i % 3, i] for i in range(10)]
    job = FluxJob(None, counting_dataflow(1), records, nodes=2)
    job.stop()
    job = FluxJob(None, counting_dataflow(1), records, nodes=2, checkpoint=str(tmp_path / "c"))
    job.stop()


# -- from the writer to the restore: the checksums the runtime records ------------------------

def test_the_writer_s_checksums_reach_the_manifest_and_a_restore_falls_back_past_damage(
        tmp_path):
    """A segment's whole snapshot and deltas, written by the node's writer, completed by the
    driver's service: a delta damaged on disk makes the restore take the checkpoint before,
    whose state is that partition's state at its own cut."""
    from flux.addresses import Addr, P
    from flux.runtime.restore import restore_operators
    from test_incremental_checkpoints import segment_with_counter, write_checkpoints

    seg = segment_with_counter(full_every=4)
    store = CheckpointStore(str(tmp_path), keep=3)
    states = write_checkpoints(seg, store, (1, 2, 3))
    manifest = store.restorable("fp", 2)
    assert manifest["checkpoint"] == 3 and len(manifest["digests"]) == 4  # chains of 3 and 1
    delta = store.path(3, manifest["chains"][0][-1][1])
    damage(delta, "bit-flipped")
    with pytest.raises(CheckpointCorrupt, match="ckpt-0000000003"):  # a node reading it
        restore_operators(store, 3, {Addr(1, 0, P): segment_with_counter(full_every=4)})
    manifest = store.restorable("fp", 2)
    assert manifest["checkpoint"] == 2
    fresh = segment_with_counter(full_every=4)
    restore_operators(store, 2, {Addr(1, 0, P): fresh})
    assert fresh.chain.get_state() == states[2] != states[3]


def first_field(record):
    return record[0]


class Unencodable:
    """A counter whose state msgpack cannot encode once it has seen ``after`` records."""

    def __init__(self, after=3):
        self.n, self.after = 0, after

    def process(self, record):
        self.n += 1
        return [record]

    def get_state(self):
        return {"n": self.n, "since": object() if self.n > self.after else None}

    def install_state(self, state):
        self.n = state["n"]


def test_a_state_that_cannot_be_encoded_at_a_checkpoint_is_the_operator_s_error():
    """Not a dropped connection and a lost pair: the operator, stage, partition and the
    SN of the cut, as for an operator that raises."""
    from flux.protocol.builder import MachineBuilder
    from flux.dataflow import Dataflow, Stage
    from flux.errors import OperatorError
    from flux.addresses import Addr, S
    from test_incremental_checkpoints import crossed

    flow = Dataflow([Stage("counts", first_field, (Unencodable,))])
    seg = MachineBuilder(flow, 2, capacity=8, batch_size=4).segment(Addr(1, 1, S))
    op = seg.chain.operators[0]
    for i in range(5):
        op.process([i, i])
    with pytest.raises(OperatorError) as err:
        crossed(seg, 4, 17).snapshot()
    e = err.value
    assert (e.stage, e.partition, e.sn) == (1, 1, (17,))
    assert "Unencodable" in e.what and "checkpoint 4" in e.what and "encoded" in e.error


# -- the sink's manifest and parts ------------------------------------------------------------

@pytest.mark.parametrize("how", DAMAGE[:3])
def test_a_file_sink_with_a_damaged_manifest_will_not_open_and_names_it(tmp_path, how):
    """Its manifest says which parts are committed and the last SN: a guess would lose or
    repeat outputs (deleted, it is a sink that committed nothing: the parts it does not
    name are removed, as ever)."""
    from flux.errors import DamagedFile
    from flux.connectors.file_sink import FileSink

    with FileSink(str(tmp_path), commit_every=2) as sink:
        sink.write([((1, 1), "a"), ((2, 1), "b"), ((3, 1), "c")])
    damage(str(tmp_path / "_flux_epochs" / "manifest-00000001.json"), how)
    with pytest.raises(DamagedFile, match="manifest-00000001.json"):
        FileSink(str(tmp_path))


@pytest.mark.parametrize("how", DAMAGE)
def test_reading_a_file_sink_with_a_damaged_part_names_the_part(tmp_path, how):
    from flux.errors import DamagedFile
    from flux.connectors.file_sink import FileSink, read_file_sink

    with FileSink(str(tmp_path), commit_every=2) as sink:
        sink.write([((1, 1), "a"), ((2, 1), "b"), ((3, 1), "c")])
    assert read_file_sink(str(tmp_path)) == [((1, 1), "a"), ((2, 1), "b"), ((3, 1), "c")]
    damage(str(tmp_path / "part-00000001-00000000.jsonl"), how)
    with pytest.raises(DamagedFile, match="part-00000001-00000000.jsonl"):
        read_file_sink(str(tmp_path))


def test_the_checksum_cost_experiment_writes_its_figures(tmp_path):
    """``experiments.checkpoint_checksums`` times every piece of a checkpoint and its
    checksum in each round, and writes what it printed."""
    from experiments.checkpoint_checksums import main

    summary = main(["--keys", "3000", "--rounds", "3", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "checksums.json").read_text())
    assert saved["rounds"] == 3 and len(saved["rows"]) == 3
    for row in saved["rows"]:
        assert row["checkpoint_s"] == pytest.approx(row["pack_s"] + row["write_s"])
        assert row["checksum_cost"] == pytest.approx(row["checksum_s"] / row["checkpoint_s"])
    assert summary["checksum_cost"]["n"] == 3


def test_the_input_log_keeps_what_every_kept_checkpoint_replays_after_a_fallback(
        tmp_path, monkeypatch):
    """After a fallback from checkpoint 2 (cut 20) to 1 (cut 10), checkpoint 3 cuts at 15.
    Had 2 stayed complete (it could not be set aside), the kept ones are 2 and 3: the log
    is truncated to the smallest cut among them (15), not the oldest one's (20), so a
    restart from 3 still replays inputs 16-20 in their order."""
    from controller.checkpoints import CheckpointCoordinator
    from flux.addresses import Addr, P
    from flux.control_messages import SnapshotWritten
    from flux.runtime.checkpoint_service import CheckpointService

    store = CheckpointStore(str(tmp_path), keep=2)
    log = InputLog(store)
    for first in range(1, 31, 5):  # entries of 5 inputs: truncation removes whole entries
        log.append(first, [i % 3 for i in range(first - 1, first + 4)])
    service = CheckpointService(store, CheckpointCoordinator(1, 1, "fp"), input_log=log)

    def checkpoint(k, cut):
        service.cut_chosen(k, cut, cut)
        store.write(k, "a.state", b"state")
        service.snapshot_written(SnapshotWritten(k, Addr(1, 0, P), "a.state", 5, 0.0,
                                                 digests=(digest(b"state"),)))
        service.sink_committed(k, None)
        service.settle()

    try:
        checkpoint(1, 10)
        checkpoint(2, 20)
        damage(store.path(2, "a.state"), "bit-flipped")
        monkeypatch.setattr(CheckpointStore, "_set_aside", lambda self, k: None)
        restored = store.restorable("fp", 1)
        service.coordinator.restarted(restored["checkpoint"])
        assert restored["cut"] == 10
        checkpoint(3, 15)
    finally:
        service.stop()
    assert store.complete_ids()[-2:] == [2, 3]
    assert log.read(after=15) == [i % 3 for i in range(15, 30)]
