"""KafkaSource handing Arrow batches over (``schema=``, ``decode_batch=``), against a real
Kafka-protocol broker (noida-db, per module, stopped by its PID): the rows are the records,
each row's partition and offset are named for the input log, a logged interleaving is
replayed row for row, and a value that is not a row is named by partition and offset."""
from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("confluent_kafka")
pytest.importorskip("noida_db")
pa = pytest.importorskip("pyarrow")

from flux.connector_api import PartitionedBatches, replay_order_of  # noqa: E402
from flux.connectors.kafka_source import KafkaSource  # noqa: E402
from flux.connectors.sources import NOT_YET  # noqa: E402

pytestmark = pytest.mark.timeout(60)

SCHEMA = pa.schema([("key", pa.int64()), ("name", pa.string()), ("value", pa.float64())])


def produce(broker, topic, values, partitions):
    broker.produce(topic, values, partitions)


def obj(i):
    return json.dumps({"key": i, "name": f"n{i % 7}", "value": i / 4, "unused": [i]}).encode()


def rows_of(source, n, seconds=10.0, most=500):
    """The next ``n`` rows of ``source``'s batches (of at most ``most`` rows), each with its
    (partition, offset)."""
    got, deadline = [], time.monotonic() + seconds
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} rows arrived"
        batch = next(source)
        if batch is NOT_YET:
            time.sleep(0.01)
            continue
        assert isinstance(batch, pa.RecordBatch) and batch.schema == SCHEMA
        assert 1 <= batch.num_rows <= most
        assert len(source.last_rows) == batch.num_rows
        assert source.last == source.last_rows[-1]
        got += list(zip(batch.to_pylist(), source.last_rows))
    return got


def test_batches_hold_the_records_as_rows_and_resume_after_the_position(broker):
    topic = broker.fresh_topic(prefix="a", partitions=3)
    produce(broker, topic, [obj(i) for i in range(60)], 3)
    with KafkaSource(broker.bootstrap, topic, schema=SCHEMA, batch=8) as src:
        assert isinstance(src, PartitionedBatches) and replay_order_of(src) == "logged"
        first = rows_of(src, 25, most=8)
        where = json.loads(json.dumps(src.position))
    with KafkaSource(broker.bootstrap, topic, schema=SCHEMA) as again:
        again.open(where)
        rest = rows_of(again, 60 - len(first))
        assert next(again) is NOT_YET
    everything = first + rest
    assert sorted(r["key"] for r, _ in everything) == list(range(60))  # none lost or twice
    for row, (partition, offset) in everything:  # row i went to i % 3 at offset i // 3
        i = row["key"]
        assert row == {"key": i, "name": f"n{i % 7}", "value": i / 4}  # unnamed fields left out
        assert (partition, offset) == (i % 3, i // 3)


def test_a_logged_interleaving_is_replayed_row_for_row(broker):
    topic = broker.fresh_topic(prefix="a", partitions=3)
    produce(broker, topic, [obj(i) for i in range(30)], 3)
    order = [2, 2, 2, 0, 1, 2, 2, 0]
    with KafkaSource(broker.bootstrap, topic, schema=SCHEMA, batch=3) as src:
        src.open({"0": 1, "1": 0, "2": 1})
        src.replay(order)
        replayed = rows_of(src, len(order))
        assert [p for _, (p, _) in replayed[:len(order)]] == order
        assert [r["key"] for r, _ in replayed[:len(order)]] == [5, 8, 11, 3, 1, 14, 17, 6]


def test_a_bounded_source_of_batches_ends(broker):
    topic = broker.fresh_topic(prefix="a", partitions=2)
    produce(broker, topic, [obj(i) for i in range(10)], 2)
    with KafkaSource(broker.bootstrap, topic, schema=SCHEMA, ending="latest") as src:
        assert sorted(r["key"] for r, _ in rows_of(src, 10)) == list(range(10))
        with pytest.raises(StopIteration):
            while True:
                assert next(src) is NOT_YET


def test_a_value_that_is_not_a_row_is_named_by_partition_and_offset(broker):
    topic = broker.fresh_topic(prefix="a", partitions=1)
    produce(broker, topic, [obj(0), obj(1), b'{"key": "one"}', obj(3)], 1)
    with KafkaSource(broker.bootstrap, topic, schema=SCHEMA, batch=10) as src:
        with pytest.raises(ValueError, match=rf"{topic} partition 0 offset 2 cannot be "
                                             r"decoded into a row"):
            deadline = time.monotonic() + 10
            while next(src) is NOT_YET:
                assert time.monotonic() < deadline
                time.sleep(0.01)


def test_decode_batch_parses_any_form_and_the_options_are_checked(broker):
    topic = broker.fresh_topic(prefix="a", partitions=2)
    produce(broker, topic, [f"{i},{i * i}".encode() for i in range(12)], 2)

    def csv(values):
        pairs = [v.decode().split(",") for v in values]
        return pa.RecordBatch.from_pydict({"i": [int(a) for a, _ in pairs],
                                           "sq": [int(b) for _, b in pairs]})

    with KafkaSource(broker.bootstrap, topic, decode_batch=csv) as src:
        got, deadline = [], time.monotonic() + 10
        while len(got) < 12:
            assert time.monotonic() < deadline
            batch = next(src)
            if batch is not NOT_YET:
                got += batch.to_pylist()
    assert sorted((r["i"], r["sq"]) for r in got) == [(i, i * i) for i in range(12)]
    with pytest.raises(ValueError, match="not both"):
        KafkaSource(broker.bootstrap, topic, schema=SCHEMA, decode_batch=csv)
    with pytest.raises(ValueError, match="schema must be a pyarrow.Schema"):
        KafkaSource(broker.bootstrap, topic, schema={"key": "int64"})
