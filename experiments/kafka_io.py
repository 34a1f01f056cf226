"""Records into a Kafka topic at a steady rate, the job's SN order, and its output read back
: what ``experiments.failover --kafka`` and the Spark tests over Kafka share.

The partitions of a topic interleave differently on every read, so "the failure-free
output" means the failure-free run over the inputs *in the order this job numbered
them*. ``RecordedOrder`` wraps the job's source and remembers that order, through
restarts: a restart reopens the source at a checkpoint's position, and what was read
before the position stays, what came after is read again (in the input log's order, as
far as the log goes). The reference is then ``reference_output`` over that order, and
the sink's content, read back with ``read_committed``, must equal it exactly.
"""
from __future__ import annotations

import json
import threading
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from exchange.rows import is_columnar
from flux.connectors.sources import NOT_YET


def partition_of(key: Any, partitions: int) -> int:
    """A record's topic partition, by its key: every key's records stay in one partition,
    in order (as a keyed producer does)."""
    return zlib.crc32(json.dumps(key).encode()) % partitions


class Feed:
    """``records`` produced into ``topic`` at ``rate`` per second, by a thread; ``ending``
    is the position after the last of them (a KafkaSource bounded there ends with them).

    ``hold_at``: the feed stops after that many records until ``release()``, then goes on at
    ``rate`` from there, so a job bounded by ``ending`` cannot finish before a test's failure
    lands, however slow the machine is that day. ``slow_after``: ``(count, rate)``, the
    records after the first ``count`` (up to ``hold_at``) go at that rate: a trickle
    that keeps the job's input flowing for a while, however late the job starts to
    read; after the hold, ``rate`` again."""

    def __init__(self, bootstrap: str, topic: str, records: Sequence[Any], partitions: int,
                 rate: float, key: Callable[[Any], Any] = lambda r: r[0],
                 hold_at: Optional[int] = None,
                 encode: Callable[[Any], bytes] = lambda r: json.dumps(r).encode(),
                 slow_after: Optional[Tuple[int, float]] = None):
        self.bootstrap, self.topic, self.records, self.rate = bootstrap, topic, records, rate
        self.slow_after = slow_after
        self.encode = encode
        self.parts = [partition_of(key(r), partitions) for r in records]
        self.ending = {str(p): self.parts.count(p) for p in range(partitions)}
        self.error: List[BaseException] = []
        self._stop = threading.Event()
        self._hold_at = hold_at
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-feed", daemon=True)

    def start(self) -> "Feed":
        self._thread.start()
        return self

    def release(self) -> None:
        """Let a feed held at ``hold_at`` go on."""
        self._released.set()

    def stop(self) -> None:
        self._stop.set()
        self._released.set()
        self._thread.join(30)

    def _offset(self, i: int) -> float:
        """Seconds after the start that record ``i`` is due (holds aside): at ``rate``,
        but at the slow rate from ``slow_after``'s count to ``hold_at``."""
        if self.slow_after is None or i <= self.slow_after[0]:
            return i / self.rate
        count, rate = self.slow_after
        slow_to = i if self._hold_at is None else min(i, max(self._hold_at, count))
        return count / self.rate + (slow_to - count) / rate + (i - slow_to) / self.rate

    def _run(self) -> None:
        from confluent_kafka import Producer

        try:
            producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
            start = time.monotonic()
            for i, (record, part) in enumerate(zip(self.records, self.parts)):
                if i == self._hold_at:
                    held = time.monotonic()
                    while not self._released.wait(0.05):
                        producer.poll(0)
                    start += time.monotonic() - held
                due = start + self._offset(i)
                while not self._stop.is_set() and time.monotonic() < due:
                    producer.poll(0)
                    time.sleep(min(0.005, max(0.0, due - time.monotonic())))
                if self._stop.is_set():
                    break
                while True:
                    try:
                        producer.produce(self.topic, self.encode(record), partition=part)
                        break
                    except BufferError:
                        producer.poll(0.05)
            if producer.flush(30):
                raise RuntimeError(f"{self.topic}: records still unsent after 30 s")
        except BaseException as exc:  # seen by the caller: a feed that failed is no test
            self.error.append(exc)


class RecordedOrder:
    """A ``PartitionedSource`` that remembers what it gave, in order: the job's SN order.
    ``inputs`` is the records as the job numbered them (input SN i is ``inputs[i - 1]``)."""

    replay_order = "logged"  # a wrapper says what its source is (flux.connectors)

    def __init__(self, source):
        self.source = source
        self._order: List[Tuple[int, int, Any]] = []  # (partition, offset, record)

    @property
    def inputs(self) -> List[Any]:
        return [record for _, _, record in self._order]

    # -- the source, passed through -----------------------------------------------------------
    @property
    def position(self) -> Any:
        return self.source.position

    @property
    def last(self) -> Tuple[int, int]:
        return self.source.last

    def open(self, position: Dict[str, int]) -> None:
        """What was read before ``position`` stays (a prefix of the order: a checkpoint's
        cut); the rest will be read again."""
        self.source.open(position)
        before = [o < position[str(p)] for p, o, _ in self._order]
        kept = before.index(False) if False in before else len(before)
        if any(before[kept:]):
            raise AssertionError(f"the position {position} is not after a prefix of the "
                                 f"inputs read: no cut of this run")
        del self._order[kept:]

    def replay(self, partitions: Sequence[int]) -> None:
        self.source.replay(partitions)

    def commit_offsets(self, position, wait: bool = False) -> None:
        self.source.commit_offsets(position, wait)

    def __iter__(self) -> "RecordedOrder":
        return self

    @property
    def last_rows(self) -> Sequence[Tuple[int, int]]:
        return self.source.last_rows

    def __next__(self) -> Any:
        record = next(self.source)
        if record is NOT_YET:
            return record
        if is_columnar(record):  # an Arrow batch: a row per input, each as its values
            from exchange.columns import to_records

            self._order.extend((partition, offset, row) for (partition, offset), row
                               in zip(self.source.last_rows, to_records(record)))
        else:
            partition, offset = self.source.last
            self._order.append((partition, offset, record))
        return record

    def close(self) -> None:
        self.source.close()


def last_committed(bootstrap: str, topic: str, timeout: float = 10.0) -> Optional[tuple]:
    """The largest SN any of ``topic``'s KafkaSinks committed (None: none yet), read
    ``read_committed`` from their shared state topic: how far the furthest partition's
    output is durable."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from flux.connectors.kafka_sink import STATE_SUFFIX

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "flux-last-committed",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False, "session.timeout.ms": 6000})
    state = topic + STATE_SUFFIX
    try:
        if state not in consumer.list_topics(timeout=timeout).topics:
            return None  # no sink opened yet
        consumer.assign([TopicPartition(state, 0, 0)])
        best, deadline = None, time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return best
                raise RuntimeError(f"reading {state}: {message.error()}")
            sn = tuple(json.loads(message.value())["sn"])
            best = sn if best is None else max(best, sn)
        raise TimeoutError(f"{state} not read to its end in {timeout} s")
    finally:
        consumer.close()


def read_output(bootstrap: str, topic: str, timeout: float = 60.0) -> List[Any]:
    """Everything a ``read_committed`` consumer reads in ``topic`` (a KafkaSink's), in SN
    order; each partition's records must come in increasing SN order, and no SN twice."""
    return [record for _, record in read_output_sns(bootstrap, topic, timeout)]


def read_output_sns(bootstrap: str, topic: str, timeout: float = 60.0) -> List[tuple]:
    """``read_output``'s records with their SNs: ``(sn, record)`` in SN order."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from flux.connectors.kafka_sink import SN_HEADER

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "flux-read-output",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False, "session.timeout.ms": 6000})
    try:
        count = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in range(count)])
        rows: Dict[int, List[Tuple[tuple, Any]]] = {p: [] for p in range(count)}
        ended, deadline = set(), time.monotonic() + timeout
        while len(ended) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: only partitions {sorted(ended)} read to the end")
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(message.partition())
                    continue
                raise RuntimeError(f"reading {topic}: {message.error()}")
            sn = tuple(json.loads(dict(message.headers())[SN_HEADER]))
            rows[message.partition()].append((sn, json.loads(message.value())))
    finally:
        consumer.close()
    for p, part in rows.items():
        sns = [sn for sn, _ in part]
        if sns != sorted(set(sns)):
            raise AssertionError(f"{topic} partition {p}: SNs out of order or twice")
    merged = sorted((row for part in rows.values() for row in part), key=lambda r: r[0])
    if len({sn for sn, _ in merged}) != len(merged):
        raise AssertionError(f"{topic}: an SN in two partitions")
    return merged
