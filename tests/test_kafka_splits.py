"""A Kafka topic's partitions as splits (``flux.KafkaSplits``), against a real
Kafka-protocol broker (noida-db, started for the module and stopped by its PID): each
split is its partition's records in order, the same every time it is read, after any
count of them, aborted transactions and tombstones left out, the starts and ends fixed
when the source was made, and the source pickles to the executors."""
from __future__ import annotations

import json
import os
import pickle
import time

import pytest

pytest.importorskip("confluent_kafka")
if not os.environ.get("NOIDA_DB"):
    pytest.importorskip("noida_db")

from confluent_kafka import Producer  # noqa: E402

from flux import KafkaSplits, SplitSource  # noqa: E402
from flux.connectors.kafka_source import KafkaSourceError  # noqa: E402
from flux.connectors.sources import NOT_YET  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def produce(broker, topic, values, partitions):
    """Value i, as JSON, into partition i % partitions."""
    broker.produce(topic, [json.dumps(v).encode() for v in values], partitions)


def read_all(inputs, seconds=10.0):
    """Every input of a bounded split, ``NOT_YET`` left out; fails if it does not end."""
    got, deadline = [], time.monotonic() + seconds
    for x in inputs:
        assert time.monotonic() < deadline, f"the split did not end ({len(got)} read)"
        if x is NOT_YET:
            time.sleep(0.01)
        else:
            got.append(x)
    return got


def test_each_split_is_its_partition_in_order_from_any_count(broker):
    topic = broker.fresh_topic(prefix="s", partitions=3)
    produce(broker, topic, [{"i": i} for i in range(30)], 3)
    source = KafkaSplits(broker.bootstrap, topic, ending="latest")
    assert isinstance(source, SplitSource) and source.splits() == 3
    source = pickle.loads(pickle.dumps(source))  # as the executors get it
    for p in range(3):
        want = [{"i": i} for i in range(p, 30, 3)]
        assert read_all(source.read_split(p, 0)) == want
        assert read_all(source.read_split(p, 0)) == want  # the same every time
        assert read_all(source.read_split(p, 4)) == want[4:]
        assert read_all(source.read_split(p, 50)) == []


def test_records_after_the_source_was_made_are_past_its_end_and_arrive_without_one(broker):
    topic = broker.fresh_topic(prefix="s", partitions=2)
    produce(broker, topic, [1, 2], 2)
    bounded = KafkaSplits(broker.bootstrap, topic, ending="latest")
    unbounded = KafkaSplits(broker.bootstrap, topic)
    from_now = KafkaSplits(broker.bootstrap, topic, start="latest", ending={0: 2, 1: 1})
    produce(broker, topic, [3, 4], 2)
    assert read_all(bounded.read_split(0, 0)) == [1]
    split = unbounded.read_split(0, 0)
    got, deadline = [], time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        x = next(split)
        if x is not NOT_YET:
            got.append(x)
    assert got == [1, 3]
    split.close()
    assert read_all(from_now.read_split(0, 0)) == [3]  # from offset 1 up to 2
    assert read_all(from_now.read_split(1, 0)) == []  # its end is its start


def test_aborted_transactions_and_tombstones_are_no_inputs(broker):
    topic = broker.fresh_topic(prefix="s", partitions=2)
    tx = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic}"})
    tx.init_transactions(10)
    tx.begin_transaction()
    tx.produce(topic, b'"aborted"', partition=0)
    tx.abort_transaction(10)
    tx.begin_transaction()
    for value in (b'"a"', None, b'"b"'):
        tx.produce(topic, value, partition=0)
    tx.commit_transaction(10)
    source = KafkaSplits(broker.bootstrap, topic, ending="latest")
    assert read_all(source.read_split(0, 0)) == ["a", "b"]
    assert read_all(source.read_split(0, 1)) == ["b"]  # counted in inputs, not offsets


def test_batches_hand_over_rows_and_skip_counts_them(broker):
    pa = pytest.importorskip("pyarrow")
    topic = broker.fresh_topic(prefix="s", partitions=2)
    produce(broker, topic, [{"k": f"k{i}", "v": i} for i in range(10)], 2)
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    source = KafkaSplits(broker.bootstrap, topic, ending="latest", schema=schema, batch=3)
    batches = read_all(source.read_split(1, 2))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert [v for b in batches for v in b.column("v").to_pylist()] == [5, 7, 9]


def test_a_topic_of_one_partition_or_none_is_refused_clearly(broker):
    topic = broker.fresh_topic(prefix="s", partitions=1)
    with pytest.raises(ValueError, match="has one partition; a split source has two or more"):
        KafkaSplits(broker.bootstrap, topic)
    with pytest.raises(KafkaSourceError, match="no topic 'nowhere'"):
        KafkaSplits(broker.bootstrap, "nowhere", timeout=5)


def test_a_source_made_again_reads_from_the_origin_recorded_by_the_first(broker):
    """``start="latest"`` made again later begins elsewhere; made at the first one's
    origin (what a job run again at the same checkpoint location does), it reads the
    same records as the first; another topic's origin is refused."""
    from flux.connector_api import SplitOrigin

    topic = broker.fresh_topic(prefix="o", partitions=2)
    produce(broker, topic, list(range(4)), 2)
    first = KafkaSplits(broker.bootstrap, topic, start="latest")
    assert isinstance(first, SplitOrigin)
    produce(broker, topic, list(range(4, 10)), 2)
    origin = json.loads(json.dumps(first.origin()))  # as recorded
    again = KafkaSplits(broker.bootstrap, topic, start="latest", ending="latest")
    assert again.origin()["starts"] != origin["starts"]
    at_first = again.at_origin({**origin, "ends": again.origin()["ends"]})
    assert [read_all(at_first.read_split(p, 0)) for p in range(2)] == [[4, 6, 8], [5, 7, 9]]
    with pytest.raises(ValueError, match="another topic's"):
        again.at_origin({**origin, "topic": "elsewhere"})


def test_a_reader_knows_the_offset_after_its_last_input_and_a_split_reads_from_one(broker):
    """What a restart seeks to: the offset after an input a reader returned; read from
    there (and a count skipped), the same inputs as from the origin."""
    from flux.connector_api import SeekableSplits, SplitReader

    topic = broker.fresh_topic(prefix="p", partitions=2)
    produce(broker, topic, list(range(10)), 2)  # partition 0: 0, 2, 4, 6, 8 at offsets 0-4
    source = KafkaSplits(broker.bootstrap, topic, ending="latest")
    assert isinstance(source, SeekableSplits)
    reader = source.read_split(0, 2)
    assert isinstance(reader, SplitReader) and reader.position == 0
    first = next(x for x in reader if x is not NOT_YET)
    assert (first, reader.position) == (4, 3)
    assert read_all(source.read_split_from(0, reader.position, 1)) == [8]
    assert read_all(source.read_split_from(0, 0, 0)) == read_all(source.read_split(0, 0))
    with pytest.raises(ValueError, match="before its origin"):
        KafkaSplits(broker.bootstrap, topic, start="latest").read_split_from(0, 2, 0)


def test_a_read_never_waits_on_the_broker_while_records_trickle_in(broker):
    """A split is read on its node's loop, which runs every replica there, gathering
    records until it has a batch or the split says ``NOT_YET``: a read that waits for
    the broker holds them all. Reads that waited 50 ms for records each held the loop
    for nearly all of the time of a topic fed live (a job fed at 2000 records a second
    gave its first output only when the feed ended, 6 s after the start, against 0.5 s
    with reads that wait for nothing). Reads hand over what has arrived, or
    ``NOT_YET``, at once: the loop waits in its own poll, for its messages too."""
    import threading

    topic = broker.fresh_topic(2, prefix="trickle")
    stop = threading.Event()

    def trickle():
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        i = 0
        while not stop.is_set():
            producer.produce(topic, json.dumps(i).encode(), partition=0)
            producer.poll(0)
            i += 1
            time.sleep(0.0025)  # 400 records a second
        producer.flush(10)

    feeder = threading.Thread(target=trickle)
    feeder.start()
    try:
        reader = iter(KafkaSplits(broker.bootstrap, topic).read_split(0, 0))
        inside, got, began_all = 0.0, 0, time.monotonic()
        while time.monotonic() < began_all + 3:
            began = time.monotonic()
            x = next(reader)
            inside += time.monotonic() - began
            got += x is not NOT_YET
            if x is NOT_YET:
                time.sleep(0.005)  # the loop's own wait
        share = inside / (time.monotonic() - began_all)
    finally:
        stop.set()
        feeder.join(15)
    assert got > 100  # the records did arrive
    print("share", share)
    assert share < 0.5, f"reads held the thread {share:.0%} of the time"
