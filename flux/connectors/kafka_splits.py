"""The partitions of a Kafka topic as splits (``flux.SplitSource``, DESIGN 12): each
partition read by a pair of ingresses on the executors, no record through the driver.

Where each partition starts (``earliest`` or ``latest``, turned into offsets) and, with
``ending="latest"``, where it ends are fixed when the source is made, on the driver:
both replicas of a pair, and a replica rebuilt on a standby, read the same records.
Each replica reads its partition with a consumer of its own, assigned by hand (no
consumer group), with ``read_committed`` isolation: records of aborted transactions are
never read. Tombstones (no value) are no inputs.

``read_split(split, skip)`` skips the first ``skip`` records by reading them: a count is
not an offset (transaction markers and compaction take offsets too). Its reader knows
the offset after the last record it returned (``KafkaSplitReader.position``), and
``read_split_from(split, offset, skip)`` reads from one (``flux.connector_api.
SeekableSplits``): a checkpoint keeps, beside each split's count, the offset at a count
at or before it, so a restart seeks there, and a replica rebuilt on a standby seeks to
the one its twin's state carries. The starting offsets are its origin
(``flux.connector_api.SplitOrigin``): with ``checkpoint=``, a job run again reads from
the origin its first run recorded, not from a new ``earliest`` or ``latest``; records
the topic no longer keeps stop the job, naming the partition and offset.
"""
from __future__ import annotations

import copy
import json
import logging
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from flux.connectors.kafka_source import (
    READ_SETTINGS,
    KafkaSourceError,
    checked_options,
    is_record,
)
from flux.connectors.sources import NOT_YET

log = logging.getLogger(__name__)


class KafkaSplits:
    """Every partition of ``topic`` a split, its values decoded by ``decode`` (JSON by
    default), or with ``schema``/``decode_batch`` handed over as Arrow batches of up to
    ``batch`` rows (as ``KafkaSource``'s). ``ending="latest"`` (or ``{partition:
    offset}``) ends each split there, as Structured Streaming's ``endingOffsets``;
    without it a split never ends. ``config``: more librdkafka settings;
    ``poll_timeout``: seconds a read waits for records before saying ``NOT_YET`` (none
    by default: a split is read on its node's loop, which runs every replica there and
    waits in its own poll; reads that waited 50 ms held it nearly all the time of a
    topic fed live); ``timeout`` bounds every other call to the broker."""

    def __init__(self, bootstrap: str, topic: str, decode: Callable[[bytes], Any] = json.loads,
                 start: str = "earliest", ending: Any = None,
                 config: Optional[Dict[str, Any]] = None, batch: int = 500,
                 poll_timeout: float = 0.0, timeout: float = 30.0, schema: Any = None,
                 decode_batch: Optional[Callable[[List[bytes]], Any]] = None):
        from confluent_kafka import Consumer, TopicPartition

        self.decode_batch = checked_options(start, ending, batch, schema, decode_batch)
        self.bootstrap, self.topic, self.decode = bootstrap, topic, decode
        self.config = dict(config or {})
        self.batch, self.poll_timeout, self.timeout = batch, poll_timeout, timeout
        consumer = Consumer(self._settings())
        try:
            metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                raise KafkaSourceError(f"KafkaSplits: no topic {topic!r} at {bootstrap}"
                                       + (f" ({metadata.error})" if metadata else ""))
            count = len(metadata.partitions)
            if count < 2:
                raise ValueError(f"KafkaSplits: topic {topic!r} has one partition; a split "
                                 "source has two or more (read it with KafkaSource)")
            marks = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout,
                                                    cached=False) for p in range(count)]
        finally:
            consumer.close()
        #: each partition's first offset and (None: never) the offset it ends at
        self.starts = [low if start == "earliest" else high for low, high in marks]
        if ending is None:
            self.ends: Optional[List[int]] = None
        elif isinstance(ending, dict):
            self.ends = [int(ending.get(p, ending.get(str(p), high)))
                         for p, (_, high) in enumerate(marks)]
        else:
            self.ends = [high for _, high in marks]

    def _settings(self) -> Dict[str, Any]:
        settings = {"bootstrap.servers": self.bootstrap, "group.id": f"flux-{self.topic}",
                    **READ_SETTINGS, "logger": log}
        settings.update(self.config)
        return settings

    def splits(self) -> int:
        return len(self.starts)

    def origin(self) -> Dict[str, Any]:
        """Where each partition begins and ends (offsets, fixed when it was made)."""
        return {"topic": self.topic, "starts": list(self.starts),
                "ends": None if self.ends is None else list(self.ends)}

    def at_origin(self, origin: Dict[str, Any]) -> "KafkaSplits":
        """This source reading from a recorded origin (of the same topic and partition
        count)."""
        if origin.get("topic") != self.topic or len(origin.get("starts", ())) != len(
                self.starts):
            raise ValueError(f"KafkaSplits of {self.topic!r} ({len(self.starts)} partitions) "
                             f"cannot read from the origin {origin!r}: another topic's, or "
                             f"its partitions changed")
        again = copy.copy(self)
        again.starts = [int(x) for x in origin["starts"]]
        again.ends = None if origin["ends"] is None else [int(x) for x in origin["ends"]]
        return again

    def read_split(self, split: int, skip: int) -> "KafkaSplitReader":
        """Partition ``split``'s inputs after its first ``skip``; ``NOT_YET`` while none
        has arrived; the end once the partition is read to its end (``ending``)."""
        return KafkaSplitReader(self, split, self.starts[split], skip)

    def read_split_from(self, split: int, position: int, skip: int) -> "KafkaSplitReader":
        """Partition ``split``'s inputs from offset ``position`` (one a reader gave) on,
        after the first ``skip`` of them."""
        if not self.starts[split] <= int(position):
            raise ValueError(f"KafkaSplits: offset {position} of partition {split} lies "
                             f"before its origin {self.starts[split]}")
        return KafkaSplitReader(self, split, int(position), skip)

    def _records(self, split: int, first: int, skip: int) -> Iterator[Tuple[Any, int]]:
        """(input or ``NOT_YET``, the offset after it) from offset ``first`` on."""
        from confluent_kafka import Consumer, TopicPartition

        end = None if self.ends is None else self.ends[split]
        if end is not None and first >= end:
            return
        consumer = Consumer(self._settings())
        position = first
        try:
            consumer.assign([TopicPartition(self.topic, split, first)])
            while True:
                values, done = [], False
                for message in consumer.consume(self.batch, self.poll_timeout):
                    if not is_record(message, "KafkaSplits", self.topic):
                        continue
                    if end is not None and message.offset() >= end:
                        done = True
                        break
                    if message.value() is not None:
                        values.append((message.value(), message.offset() + 1))
                if skip:
                    dropped = min(skip, len(values))
                    values, skip = values[dropped:], skip - dropped
                if values:
                    position = values[-1][1]
                    if self.decode_batch is not None:
                        yield self.decode_batch([v for v, _ in values]), position
                    else:
                        for value, after in values:
                            yield self.decode(value), after
                if done or (end is not None and self._read_to(consumer, split, end)):
                    return
                if not values:
                    yield NOT_YET, position
        finally:
            consumer.close()

    def _read_to(self, consumer, split: int, end: int) -> bool:
        """Is the consumer's position at ``end`` (past transaction markers too)?"""
        from confluent_kafka import TopicPartition

        (at,) = consumer.position([TopicPartition(self.topic, split)])
        return at.offset >= end

    def __repr__(self) -> str:
        return f"KafkaSplits({self.topic!r}, {len(self.starts)} partitions)"


class KafkaSplitReader:
    """One replica's reader of a partition (``flux.connector_api.SplitReader``): its
    inputs, and the offset after the one returned last (``position``)."""

    def __init__(self, source: KafkaSplits, split: int, first: int, skip: int):
        self.position = first
        self._records = source._records(split, first, skip)

    def __iter__(self) -> "KafkaSplitReader":
        return self

    def __next__(self) -> Any:
        item, self.position = next(self._records)
        return item

    def close(self) -> None:
        self._records.close()
