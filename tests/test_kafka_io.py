"""The Kafka building blocks, against a real Kafka-protocol broker (noida-db,
started once for the module and stopped by its PID): KafkaSource's position and resume,
the refusal of a new partition, the consumer group's offsets; KafkaSink's transactions,
committed SN, replay, crash and fencing, as a read_committed reader sees them."""
from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("confluent_kafka")
if not os.environ.get("NOIDA_DB"):
    pytest.importorskip("noida_db")

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402

from flux.connector_api import Sink, Source, is_exactly_once  # noqa: E402
from flux.errors import SinkFenced  # noqa: E402
from flux.testing.kafka_broker import BrokerError, KafkaBroker  # noqa: E402
from flux.connectors.kafka_sink import SN_HEADER, KafkaSink  # noqa: E402
from flux.connectors.kafka_source import KafkaSource, KafkaSourceError, PartitionsChanged  # noqa: E402
from flux.connectors.sources import NOT_YET  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def produce(broker, topic, records, partitions):
    """Record i, as JSON, into partition i % partitions."""
    broker.produce(topic, [json.dumps(r).encode() for r in records], partitions)


def take(source, n, seconds=10.0):
    """The next ``n`` records of ``source`` with the (partition, offset) of each."""
    got, deadline = [], time.monotonic() + seconds
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} records arrived"
        record = next(source)
        if record is NOT_YET:
            time.sleep(0.01)
            continue
        got.append((record, source.last))
    return got


def read_back(broker, topic, isolation="read_committed", seconds=10.0):
    """Every record of ``topic`` as ``(partition, sn, value)``, in each partition's order."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader",
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "enable.auto.commit": False, "session.timeout.ms": 6000})
    count = broker.partitions(topic)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(count)])
    rows, ended, deadline = [], set(), time.monotonic() + seconds
    try:
        while len(ended) < count:
            assert time.monotonic() < deadline, f"{topic}: only partitions {ended} ended"
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                ended.add(message.partition())
                continue
            sn = dict(message.headers() or []).get(SN_HEADER)
            rows.append((message.partition(), sn and tuple(json.loads(sn)),
                         json.loads(message.value())))
    finally:
        consumer.close()
    return rows


# -- the broker ---------------------------------------------------------------------------------

def test_the_broker_stops_by_its_pid_and_leaves_nothing_behind(tmp_path):
    broker = KafkaBroker(parent=str(tmp_path)).start()
    pid, folder = broker.pid, broker.workdir
    broker.create_topic("t", 2)
    assert broker.partitions("t") == 2 and broker.partitions("nothing") == 0
    broker.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not os.path.exists(folder)


def test_a_broker_that_does_not_come_up_says_why_and_leaves_no_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("NOIDA_DB", "/bin/false")
    with pytest.raises(BrokerError, match="exited with code 1 before answering"):
        KafkaBroker(parent=str(tmp_path)).start()
    assert os.listdir(tmp_path) == []

    def no_process(*args, **kwargs):
        raise OSError("cannot run it")

    monkeypatch.setattr("flux.testing.kafka_broker.subprocess.Popen", no_process)
    with pytest.raises(OSError, match="cannot run it"):
        KafkaBroker(parent=str(tmp_path)).start()
    assert os.listdir(tmp_path) == []


# -- KafkaSource -------------------------------------------------------------------------------

def test_the_source_reads_every_partition_and_resumes_right_after_its_position(broker):
    topic = broker.fresh_topic(prefix="t", partitions=3)
    produce(broker, topic, list(range(30)), 3)
    with KafkaSource(broker.bootstrap, topic) as src:
        assert isinstance(src, Source)
        assert src.position == {"0": 0, "1": 0, "2": 0}
        first = take(src, 13)
        where = json.loads(json.dumps(src.position))  # a position survives JSON (a manifest)
    for p in range(3):  # the next offset after the last record returned from each partition
        seen = [offset for _, (part, offset) in first if part == p]
        assert where[str(p)] == (max(seen) + 1 if seen else 0)
    with KafkaSource(broker.bootstrap, topic) as again:
        again.open(where)
        rest = take(again, 30 - 13)
        assert next(again) is NOT_YET  # nothing more: waiting, not the end
        assert again.position == {"0": 10, "1": 10, "2": 10}
    everything = first + rest
    assert sorted(r for r, _ in everything) == list(range(30))  # no gap, no duplicate
    for record, (partition, offset) in everything:  # record i went to i % 3, at offset i // 3
        assert (partition, offset) == (record % 3, record // 3)


def test_a_replay_gives_the_logged_interleaving_whatever_arrives_first(broker):
    """After a restart the input log says which partition each input came from: the
    source gives them in that order, then reads on freely, each partition in its order."""
    topic = broker.fresh_topic(prefix="t", partitions=3)
    produce(broker, topic, list(range(30)), 3)
    order = [2, 2, 2, 0, 1, 2, 2, 0]  # an interleaving Kafka itself would hardly give
    with KafkaSource(broker.bootstrap, topic) as src:
        src.open({"0": 1, "1": 0, "2": 1})
        src.replay(order)
        replayed = take(src, len(order))
        assert [part for _, (part, _) in replayed] == order
        assert [r for r, _ in replayed] == [5, 8, 11, 3, 1, 14, 17, 6]
        assert src.position == {"0": 3, "1": 1, "2": 6}  # held-back records not counted
        rest = take(src, 30 - 2 - len(order))
        with pytest.raises(PartitionsChanged, match="partitions \\[7\\]"):
            src.replay([7])
    records = [r for r, _ in replayed + rest]
    assert sorted(records) == sorted(set(range(30)) - {0, 2})  # nothing lost or twice
    for p in range(3):
        mine = [r for r in records if r % 3 == p]
        assert mine == sorted(mine)  # each partition in its own order


def test_a_source_bounded_at_the_latest_offsets_ends_there(broker):
    topic = broker.fresh_topic(prefix="t", partitions=2)
    produce(broker, topic, list(range(10)), 2)
    with KafkaSource(broker.bootstrap, topic, ending="latest") as src:
        got = take(src, 10)
        produce(broker, topic, [99], 2)  # after the source was opened: not read
        with pytest.raises(StopIteration):
            while True:
                assert next(src) in (NOT_YET,), "a record past the end was read"
    assert sorted(r for r, _ in got) == list(range(10))
    with pytest.raises(ValueError, match="ending must be"):
        KafkaSource(broker.bootstrap, topic, ending="soon")


def test_the_source_skips_aborted_transactions_and_can_start_at_the_end(broker):
    topic = broker.fresh_topic(prefix="t", partitions=2)
    produce(broker, topic, ["old", "old"], 2)
    latest = KafkaSource(broker.bootstrap, topic, start="latest")
    assert latest.position == {"0": 1, "1": 1}
    tx = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic}"})
    tx.init_transactions(10)
    tx.begin_transaction()
    tx.produce(topic, b'"aborted"', partition=0)
    tx.abort_transaction(10)
    tx.begin_transaction()
    tx.produce(topic, b'"committed"', partition=0)
    tx.commit_transaction(10)
    assert [r for r, _ in take(latest, 1)] == ["committed"]
    assert next(latest) is NOT_YET
    latest.close()


def test_a_partition_added_to_the_topic_is_refused_clearly(broker):
    topic = broker.fresh_topic(prefix="t", partitions=2)
    produce(broker, topic, [1, 2], 2)
    now = [0.0]
    src = KafkaSource(broker.bootstrap, topic, check_every=5.0, clock=lambda: now[0])
    take(src, 2)
    old_position = src.position
    broker.add_partitions(topic, 3)
    assert next(src) is NOT_YET  # not looked yet
    now[0] += 6
    with pytest.raises(PartitionsChanged, match=rf"{topic}.*now has 3 partitions.*had 2"):
        next(src)
    src.close()
    with KafkaSource(broker.bootstrap, topic) as again:  # a checkpoint from before: refused
        with pytest.raises(PartitionsChanged, match=rf"{topic}.*has 3 partitions"):
            again.open(old_position)


def test_a_missing_topic_is_refused_clearly(broker):
    with KafkaSource(broker.bootstrap, "no-such-topic") as src:
        with pytest.raises(KafkaSourceError, match="no topic 'no-such-topic'"):
            next(src)


def test_offsets_committed_to_the_consumer_group_are_visible_to_it(broker):
    topic = broker.fresh_topic(prefix="t", partitions=2)
    produce(broker, topic, list(range(6)), 2)
    with KafkaSource(broker.bootstrap, topic, group="flux-lag") as src:
        take(src, 4)
        assert src.committed_offsets() == {"0": None, "1": None}
        where = src.position
        assert sum(where.values()) == 4
        src.commit_offsets(where, wait=True)
        assert src.committed_offsets() == where
    other = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "flux-lag",
                      "session.timeout.ms": 6000})
    try:  # what the usual lag tools read
        got = other.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        assert [tp.offset for tp in got] == [where["0"], where["1"]]
    finally:
        other.close()


# -- KafkaSink ---------------------------------------------------------------------------------

def outputs(first, last):
    return [((n, 0), {"k": f"key{n % 5}", "n": n}) for n in range(first, last + 1)]


def check_exactly_once_in_sn_order(rows, last):
    assert sorted(r["n"] for _, _, r in rows) == list(range(1, last + 1))
    for partition in {p for p, _, _ in rows}:
        sns = [sn for p, sn, _ in rows if p == partition]
        assert sns == sorted(sns), f"partition {partition} is out of SN order"
    assert all(sn == (r["n"], 0) for _, sn, r in rows)


def test_the_sink_commits_and_a_new_incarnation_drops_what_was_committed(broker):
    topic = broker.fresh_topic(prefix="t", partitions=3)
    tid = f"sink-{topic}"
    with KafkaSink(broker.bootstrap, topic, tid, key=lambda r: r["k"]) as sink:
        assert is_exactly_once(sink) and isinstance(sink, Sink)
        assert sink.committed() is None
        sink.write(outputs(1, 10))
        sink.commit((10, 0))
        sink.write(outputs(11, 15))  # committed by close
    again = KafkaSink(broker.bootstrap, topic, tid, key=lambda r: r["k"])
    assert again.committed() == (15, 0)
    again.write(outputs(8, 20))  # a replay from an older checkpoint, then new outputs
    assert again.skipped == 8
    again.commit((20, 0))
    again.close()
    rows = read_back(broker, topic)
    check_exactly_once_in_sn_order(rows, 20)
    assert len({p for p, _, _ in rows}) > 1  # keyed: the outputs spread over the partitions
    by_key = {}
    for partition, _, r in rows:  # one key, one partition
        assert by_key.setdefault(r["k"], partition) == partition


def test_a_transaction_left_open_by_a_crash_is_never_visible(broker):
    topic = broker.fresh_topic(prefix="t", partitions=2)
    tid = f"sink-{topic}"
    sink = KafkaSink(broker.bootstrap, topic, tid)
    sink.write(outputs(1, 5))
    sink.commit((5, 0))
    sink.write(outputs(6, 9))
    # the crash: the outputs and the SN are produced, and the transaction never commits
    sink.producer.begin_transaction()
    for sn, record in sink.pending:
        sink.producer.produce(topic, json.dumps(record).encode(),
                              headers=[(SN_HEADER, json.dumps(list(sn)).encode())])
    sink.producer.produce(sink.state_topic, json.dumps({"sn": [9, 0]}).encode(),
                          key=tid.encode())
    assert sink.producer.flush(10) == 0
    assert {r["n"] for _, _, r in read_back(broker, topic, "read_uncommitted")} >= {6, 9}
    again = KafkaSink(broker.bootstrap, topic, tid)  # aborts what the crashed one left open
    assert again.committed() == (5, 0)
    assert sorted(r["n"] for _, _, r in read_back(broker, topic)) == [1, 2, 3, 4, 5]
    again.write(outputs(1, 12))  # the replay
    again.close()
    check_exactly_once_in_sn_order(read_back(broker, topic), 12)
    del sink  # the crashed incarnation is gone


def test_a_fenced_sink_says_so_and_does_not_write(broker):
    topic = broker.fresh_topic(prefix="t", partitions=1)
    tid = f"sink-{topic}"
    old = KafkaSink(broker.bootstrap, topic, tid, timeout=10)
    old.write(outputs(1, 3))
    old.commit((3, 0))
    new = KafkaSink(broker.bootstrap, topic, tid, timeout=10)  # another incarnation took over
    old.write(outputs(4, 6))
    started = time.monotonic()
    with pytest.raises(SinkFenced, match=rf"transactional id '{tid}' took over"):
        old.commit((6, 0))
    assert time.monotonic() - started < 10
    old.pending = []
    assert new.committed() == (3, 0)
    new.write(outputs(4, 7))
    new.close()
    check_exactly_once_in_sn_order(read_back(broker, topic), 7)


def test_a_sink_opened_only_to_read_fences_no_running_writer(broker):
    """The driver asks what a running writer's sink committed (a drained rescale with the
    writers on the executors): its open must not take the transactional id over."""
    from flux.connector_api import SinkPerPartition

    topic = broker.fresh_topic(prefix="t", partitions=1)
    tid = f"sink-{topic}"
    writer = KafkaSink(broker.bootstrap, topic, tid, timeout=10)
    writer.write(outputs(1, 3))
    writer.commit((3, 0))
    reader, = SinkPerPartition(lambda p: KafkaSink(broker.bootstrap, topic, tid, timeout=10)
                               ).open_many([0], to_read=True)
    assert reader.committed() == (3, 0)
    reader.close()
    writer.write(outputs(4, 6))
    writer.commit((6, 0))  # not fenced
    writer.close()
    check_exactly_once_in_sn_order(read_back(broker, topic), 6)


def test_sinks_sharing_a_topic_each_read_back_their_own_sn(broker):
    topic = broker.fresh_topic(prefix="t", partitions=2)
    a = KafkaSink(broker.bootstrap, topic, f"a-{topic}")
    a.write(outputs(1, 2))
    a.commit((2, 0))
    b = KafkaSink(broker.bootstrap, topic, f"b-{topic}")
    for n in range(1, 101):  # pushes a's record far behind the end of the state topic
        b.commit((n, 1))
    a.close()
    b.close()
    assert KafkaSink(broker.bootstrap, topic, f"a-{topic}").committed() == (2, 0)
    assert KafkaSink(broker.bootstrap, topic, f"b-{topic}").committed() == (100, 1)


def test_how_far_the_furthest_sink_of_a_topic_committed_is_read_from_its_state(broker):
    from experiments.kafka_io import last_committed

    topic = broker.fresh_topic(prefix="t", partitions=2)
    assert last_committed(broker.bootstrap, topic) is None  # no sink yet
    a = KafkaSink(broker.bootstrap, topic, f"a-{topic}", partition=0)
    b = KafkaSink(broker.bootstrap, topic, f"b-{topic}", partition=1)
    assert last_committed(broker.bootstrap, topic) is None  # none committed
    a.write(outputs(1, 2))
    a.commit((2, 0))
    b.commit((7, 1))
    a.commit((9, 0))
    b.producer.begin_transaction()  # what is not committed does not count
    b.producer.produce(b.state_topic, json.dumps({"sn": [50, 1]}).encode(),
                       key=f"b-{topic}".encode())  # the state topic's records are keyed
    b.producer.flush()
    assert last_committed(broker.bootstrap, topic) == (9, 0)
    a.close()
    b.producer.abort_transaction()
    b.close()


def test_a_sink_with_a_partition_writes_only_there_and_a_missing_one_is_refused(broker):
    topic = broker.fresh_topic(prefix="t", partitions=3)
    with KafkaSink(broker.bootstrap, topic, f"p2-{topic}", key=lambda r: r["k"],
                   partition=2) as sink:
        sink.write(outputs(1, 12))
    rows = read_back(broker, topic)
    check_exactly_once_in_sn_order(rows, 12)
    assert {p for p, _, _ in rows} == {2}  # the partition, whatever the key says
    with pytest.raises(ValueError, match=f"KafkaSink {topic}: no partition 3 .the topic has 3"):
        KafkaSink(broker.bootstrap, topic, f"p3-{topic}", partition=3)
