"""A replayable source over the partitions of a Kafka topic (DESIGN 10).

It reads every partition the topic has when it is opened, assigned by hand
(``assign``, no consumer-group rebalancing: the checkpoint, not the group,
says where reading starts), with ``read_committed`` isolation, so records of
aborted transactions are never read. Its position is a JSON object
``{"<partition>": next offset}`` after the records returned so far, every
partition named; ``open(position)`` seeks each partition there. A partition
added to the topic later is refused with ``PartitionsChanged`` instead of
being silently left unread. An offset that retention already deleted is
refused too (``auto.offset.reset`` is ``error``).

The order in which records of different partitions interleave is not
repeatable: for a replay to give every input the same SN, the ingress logs
which partition each input came from (DESIGN 10, the input log; ``last`` is
``(partition, offset)`` of the record returned last), and after a restart
``replay(partitions)`` makes the next records come from those partitions in
that order, whatever arrives first (records read ahead of their turn wait).

``commit_offsets(position)`` stores a position in the consumer group, for lag
monitoring only: reading never starts from there.

With ``schema=`` (a ``pyarrow.Schema``) the source hands over Arrow batches
instead of records: the JSON objects of up to ``batch`` messages that are
there, parsed together by Arrow's JSON reader into a ``pyarrow.RecordBatch``
(columns as the schema says, fields it does not name left out), for a first
stage of operators on batches (DESIGN 11); ``decode_batch=`` parses the values
otherwise (a function of the list of value bytes to a ``RecordBatch``, a row
per value). Each row is an input, and ``last_rows`` names the partition and
offset of each, which the input log records as it does a record's.

A stream never ends; ``ending="latest"`` (or a position) bounds it, as
Structured Streaming's ``endingOffsets``: the source ends once every
partition is read up to the end it had when the source was first opened (for
a batch over a topic, tests and experiments).
"""
from __future__ import annotations

import json
import logging
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from flux.connectors.sources import NOT_YET

log = logging.getLogger(__name__)

STARTS = ("earliest", "latest")
#: how every reader of a topic here consumes: committed records only, positions kept by
#: the job and never by the group, an offset retention deleted an error, not a jump
READ_SETTINGS = {"isolation.level": "read_committed", "enable.auto.commit": False,
                 "enable.auto.offset.store": False, "auto.offset.reset": "error"}


class PartitionsChanged(RuntimeError):
    """The topic's partitions are not the ones the source (or its position) reads."""


class KafkaSourceError(RuntimeError):
    """Reading the topic failed in a way that retrying would not mend."""


class KafkaSource:
    """Records of every partition of ``topic``, decoded by ``decode`` (the value's bytes;
    JSON by default). Tombstones (no value) are skipped and counted in ``tombstones``.

    ``start``: where partitions start when ``open`` is not called, ``earliest`` or
    ``latest`` (turned into offsets at once, so the position replays exactly).
    ``group``: the consumer group ``commit_offsets`` reports to. ``config``: more
    librdkafka settings. ``batch``: records fetched per call; ``poll_timeout``: seconds
    to wait for one before saying ``NOT_YET``. The partition count is checked every
    ``check_every`` seconds; ``timeout`` bounds every other call to the broker.
    ``schema`` (JSON objects) or ``decode_batch`` (any form): hand over Arrow batches of
    up to ``batch`` rows instead of records (``decode`` is then not used)."""

    replay_order = "logged"  # partitions interleave by arrival: the input log

    def __init__(self, bootstrap: str, topic: str, group: str = "flux",
                 decode: Callable[[bytes], Any] = json.loads, start: str = "earliest",
                 config: Optional[Dict[str, Any]] = None, batch: int = 500,
                 poll_timeout: float = 0.0, check_every: float = 5.0, timeout: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, ending: Any = None,
                 schema: Any = None, decode_batch: Optional[Callable[[List[bytes]], Any]] = None):
        from confluent_kafka import Consumer

        #: values -> RecordBatch: the source hands over batches (None: records)
        self.decode_batch = checked_options(start, ending, batch, schema, decode_batch)
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.decode, self.start = decode, start
        self.batch, self.poll_timeout = batch, poll_timeout
        self.check_every, self.timeout, self.clock = check_every, timeout, clock
        settings = {"bootstrap.servers": bootstrap, "group.id": group, **READ_SETTINGS,
                    "session.timeout.ms": 6000, "on_commit": self._committed_offsets,
                    "logger": log}
        settings.update(config or {})
        self.consumer = Consumer(settings)
        self._next: Optional[Dict[int, int]] = None  # partition -> next offset; None: not open
        self._fetched: Deque[Any] = deque()
        #: a restart's replay: the partitions of the next records, in the input log's order,
        #: and the records read ahead of their turn (partition -> messages)
        self._replay: Deque[int] = deque()
        self._held: Dict[int, Deque[Any]] = {}
        self._held_count = 0
        self.ending = ending
        self._end: Optional[Dict[int, int]] = None  # partition -> the offset reading ends at
        self._checked_at = float("-inf")
        #: (partition, offset) of the record returned last (of a batch: of its last row)
        self.last: Optional[Tuple[int, int]] = None
        #: (partition, offset) of each row of the batch returned last
        self.last_rows: List[Tuple[int, int]] = []
        self.records = self.tombstones = 0

    # -- the Source protocol ----------------------------------------------------------------
    @property
    def position(self) -> Dict[str, int]:
        if self._next is None:
            self._open(None)
        return {str(p): o for p, o in sorted(self._next.items())}

    def open(self, position: Any) -> None:
        """Go on from ``position`` (``{"<partition>": next offset}``, every partition)."""
        try:
            wanted = {int(p): int(o) for p, o in dict(position).items()}
        except (TypeError, ValueError):
            raise ValueError(f"KafkaSource: not a position: {position!r}") from None
        if any(o < 0 for o in wanted.values()):
            raise ValueError(f"KafkaSource: not a position: {position!r}")
        self._open(wanted)

    def __iter__(self) -> "KafkaSource":
        return self

    def replay(self, partitions) -> None:
        """The next records come from ``partitions``, in this order (after ``open``: the
        input log's record of how they interleaved before a restart)."""
        if self._next is None:
            self._open(None)
        unknown = sorted(set(partitions) - set(self._next))
        if unknown:
            raise PartitionsChanged(f"KafkaSource: the input log names partitions {unknown} "
                                    f"of topic {self.topic!r}, which has {len(self._next)}")
        self._replay = deque(partitions)

    def __next__(self) -> Any:
        if self._next is None:
            self._open(None)
        if self.decode_batch is not None:
            return self._next_batch()
        taken = self._next_value(fetch=True)
        if taken is None:
            return NOT_YET
        partition, offset, value = taken
        try:
            return self.decode(value)
        except ValueError as exc:
            raise ValueError(f"KafkaSource: {self.topic} partition {partition} offset "
                             f"{offset} cannot be decoded: {exc}") from None

    def _next_value(self, fetch: bool) -> Optional[Tuple[int, int, bytes]]:
        """``(partition, offset, value)`` of the next record, past tombstones; None when
        none is here (``fetch``: after asking the broker); StopIteration at a bounded
        source's end."""
        while True:
            message = self._take(fetch)
            if message is None:
                if self._end is not None and self._at_end():
                    raise StopIteration
                return None
            partition, offset = message.partition(), message.offset()
            if self._end is not None and offset >= self._end[partition]:
                continue  # past where this bounded source ends: never read
            self._next[partition] = offset + 1
            self.last = (partition, offset)
            value = message.value()
            if value is None:
                self.tombstones += 1
                continue
            if self._replay:
                self._replay.popleft()
            self.records += 1
            return partition, offset, value

    def _next_batch(self) -> Any:
        """The records that are here (up to ``batch``; the broker asked only for the first)
        as one Arrow batch, a row per record; ``NOT_YET`` when none is."""
        values: List[bytes] = []
        rows: List[Tuple[int, int]] = []
        try:
            while len(values) < self.batch:
                taken = self._next_value(fetch=not values)
                if taken is None:
                    break
                rows.append(taken[:2])
                values.append(taken[2])
        except StopIteration:
            if not values:
                raise
        if not values:
            return NOT_YET
        self.last_rows = rows
        return decoded(self.decode_batch, values, rows, self.topic)

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None

    def __enter__(self) -> "KafkaSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the consumer group (monitoring only) ---------------------------------------------------
    def commit_offsets(self, position: Dict[str, int], wait: bool = False) -> None:
        """Report ``position`` (a checkpoint's, once complete) to the consumer group, so
        the usual tools show the lag. Without ``wait`` a failure is only logged."""
        from confluent_kafka import TopicPartition

        offsets = [TopicPartition(self.topic, int(p), int(o)) for p, o in position.items()]
        self.consumer.commit(offsets=offsets, asynchronous=not wait)

    def committed_offsets(self) -> Dict[str, Optional[int]]:
        """What the consumer group holds, per partition of the position (None: nothing)."""
        from confluent_kafka import TopicPartition

        asked = [TopicPartition(self.topic, int(p)) for p in self.position]
        return {str(tp.partition): (tp.offset if tp.offset >= 0 else None)
                for tp in self.consumer.committed(asked, timeout=self.timeout)}

    def _committed_offsets(self, error, partitions) -> None:
        if error is not None:
            log.warning("KafkaSource %s: committing offsets to group %r failed: %s",
                        self.topic, self.group, error)

    # -- reading ------------------------------------------------------------------------------
    def _take(self, fetch: bool = True):
        """The next message: of the partition whose turn it is in a replay, else what came
        (records held back by a replay first: each partition's own order is kept); without
        ``fetch`` only what was fetched already."""
        if self._replay:
            want, held = self._replay[0], self._held
            while not held.get(want):
                if not self._fetched and (not fetch or not self._refill()):
                    return None
                message = self._fetched.popleft()
                held.setdefault(message.partition(), deque()).append(message)
                self._held_count += 1
            self._held_count -= 1
            return held[want].popleft()
        if self._held_count:
            for queue in self._held.values():
                if queue:
                    self._held_count -= 1
                    return queue.popleft()
        if not self._fetched and (not fetch or not self._refill()):
            return None
        return self._fetched.popleft()

    def _at_end(self) -> bool:
        """Every partition read up to its end (past transaction markers too: the consumer's
        own position says so)."""
        from confluent_kafka import TopicPartition

        if self._held_count or self._fetched:
            return False
        behind = [p for p, o in self._next.items() if o < self._end[p]]
        if not behind:
            return True
        at = self.consumer.position([TopicPartition(self.topic, p) for p in behind])
        return all(tp.offset >= self._end[tp.partition] for tp in at)

    def _refill(self) -> bool:
        self._check_partitions()
        self._fetch()
        return bool(self._fetched)

    def _open(self, wanted: Optional[Dict[int, int]]) -> None:
        """Assign every partition the topic has now, at ``wanted`` or at ``start``."""
        from confluent_kafka import TopicPartition

        count = self._partition_count()
        if count is None:
            raise KafkaSourceError(f"KafkaSource: no topic {self.topic!r} at {self.bootstrap}")
        if wanted is not None and sorted(wanted) != list(range(count)):
            raise PartitionsChanged(
                f"KafkaSource: topic {self.topic!r} has {count} partitions but the position "
                f"names partitions {sorted(wanted)}: a replay would not read the same records "
                f"(changing a source's partitions needs a fresh start, without checkpoint)")
        if wanted is None:
            end = 0 if self.start == "earliest" else 1
            wanted = {p: self.consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), timeout=self.timeout, cached=False)[end]
                for p in range(count)}
        if self.ending is not None and self._end is None:  # fixed once: a replay ends alike
            self._end = ({int(p): int(o) for p, o in self.ending.items()}
                         if isinstance(self.ending, dict) else
                         {p: self.consumer.get_watermark_offsets(
                             TopicPartition(self.topic, p), timeout=self.timeout,
                             cached=False)[1] for p in range(count)})
        self.consumer.assign([TopicPartition(self.topic, p, o) for p, o in wanted.items()])
        self._next, self._fetched = dict(wanted), deque()
        self._replay, self._held, self._held_count = deque(), {}, 0
        self._checked_at = self.clock()
        log.info("KafkaSource %s: reading %d partitions from %s", self.topic, count, wanted)

    def _fetch(self) -> None:
        for message in self.consumer.consume(self.batch, self.poll_timeout):
            if is_record(message, "KafkaSource", self.topic, self._next):
                self._fetched.append(message)

    def _check_partitions(self) -> None:
        now = self.clock()
        if now - self._checked_at < self.check_every:
            return
        self._checked_at = now
        try:
            count = self._partition_count(timeout=min(self.timeout, 1.0))
        except Exception as exc:  # the broker did not answer in time: look again later
            log.warning("KafkaSource %s: could not check its partitions: %s", self.topic, exc)
            return
        if count is not None and count != len(self._next):
            raise PartitionsChanged(
                f"KafkaSource: topic {self.topic!r} now has {count} partitions, it had "
                f"{len(self._next)} when the source was opened; the new ones would not be "
                f"read (changing a source's partitions needs a fresh start, without "
                f"checkpoint)")

    def _partition_count(self, timeout: Optional[float] = None) -> Optional[int]:
        """The topic's partition count now (None: no such topic). Asked through the
        consumer, which never creates a topic by asking."""
        from confluent_kafka import KafkaError

        metadata = self.consumer.list_topics(self.topic, timeout=timeout or self.timeout)
        topic = metadata.topics.get(self.topic)
        if topic is None or (topic.error is not None
                             and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        if topic.error is not None:
            raise KafkaSourceError(f"KafkaSource: topic {self.topic!r}: {topic.error}")
        return len(topic.partitions)


def is_record(message, who: str, topic: str, offsets: Optional[Dict[int, int]] = None) -> bool:
    """Is a fetched ``message`` a record? An error the client retries by itself (a broker
    away for a while) is logged and is none; one it cannot mend is raised
    (``KafkaSourceError``). ``offsets``: where each partition's reading must go on."""
    from confluent_kafka import KafkaError

    error = message.error()
    if error is None:
        return True
    if error.code() == KafkaError._AUTO_OFFSET_RESET:
        at = (offsets or {}).get(message.partition())
        offset = "the offset" if at is None else f"offset {at}"
        raise KafkaSourceError(
            f"{who}: {topic} partition {message.partition()} no longer has {offset} where "
            f"reading must go on (deleted by retention?): {error.str()}")
    if error.fatal() or error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        raise KafkaSourceError(f"{who}: reading {topic} failed: {error}")
    log.warning("%s %s: %s", who, topic, error)
    return False


def checked_options(start: str, ending: Any, batch: int, schema: Any,
                    decode_batch: Optional[Callable[[List[bytes]], Any]]):
    """``KafkaSource``'s options refused with what is wrong; returns how values become a
    batch (None: the source hands over records)."""
    if start not in STARTS:
        raise ValueError(f"KafkaSource: start must be one of {STARTS}, got {start!r}")
    if ending is not None and ending != "latest" and not isinstance(ending, dict):
        raise ValueError(f"KafkaSource: ending must be None, 'latest' or a position, "
                         f"got {ending!r}")
    if batch < 1:
        raise ValueError(f"KafkaSource: batch must be >= 1, got {batch!r}")
    if schema is not None and decode_batch is not None:
        raise ValueError("KafkaSource: give schema= (JSON objects) or decode_batch=, not both")
    if schema is None:
        return decode_batch
    import pyarrow as pa

    if not isinstance(schema, pa.Schema):
        raise ValueError(f"KafkaSource: schema must be a pyarrow.Schema, got "
                         f"{type(schema).__name__}")
    return json_batches(schema)


def decoded(decode_batch: Callable[[List[bytes]], Any], values: List[bytes],
            rows: List[Tuple[int, int]], topic: str) -> Any:
    """``values`` (of the records at ``rows``) as one batch of as many rows, or an error
    naming the first record that cannot be decoded alone."""
    try:
        batch = decode_batch(values)
        if batch.num_rows == len(values):
            return batch
        why = f"{batch.num_rows} rows for {len(values)} records"
    except Exception as exc:  # pyarrow's errors are no ValueErrors
        why = str(exc)
    for (partition, offset), value in zip(rows, values):
        try:
            if decode_batch([value]).num_rows == 1:
                continue
            alone = "not one row"
        except Exception as exc:
            alone = str(exc)
        raise ValueError(f"KafkaSource: {topic} partition {partition} offset {offset} "
                         f"cannot be decoded into a row: {alone}")
    raise ValueError(f"KafkaSource: {topic}: records cannot be decoded into one batch: {why}")


def json_batches(schema: Any) -> Callable[[List[bytes]], Any]:
    """Values that are JSON objects -> one ``RecordBatch`` of ``schema``, parsed together
    by Arrow's JSON reader (fields the schema does not name are left out, a missing one
    is null). A raw newline can only be whitespace in JSON, so each value is made one
    line of the newline-delimited text the reader takes."""
    import io

    import pyarrow as pa
    import pyarrow.json as pj

    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    empty = pa.RecordBatch.from_pylist([], schema=schema)

    def decode(values: List[bytes]) -> Any:
        text = b"\n".join(v.replace(b"\n", b" ").replace(b"\r", b" ") for v in values)
        # one block, one thread: the batch is small, and threads would only contend with
        # the process's others (1.6 against 2.0 us a row here)
        read = pj.ReadOptions(use_threads=False, block_size=max(1 << 20, len(text) + 1))
        table = pj.read_json(io.BytesIO(text), read_options=read, parse_options=options)
        batches = table.combine_chunks().to_batches()
        return batches[0] if batches else empty

    return decode
