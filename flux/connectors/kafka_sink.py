"""An exactly-once sink into a Kafka topic, by Kafka transactions (DESIGN 10).

Each ``commit(sn)`` is one Kafka transaction of a producer with a fixed
``transactional_id``: the outputs written since the last commit (JSON values,
in SN order, so in SN order within each partition, each with its SN in the
header ``flux.sn``) and one record of the last SN, keyed by the transactional
id, in a small state topic (``<topic>.flux-sink-state``: one partition,
compacted, created if missing). Opened again, the sink first fences every
earlier producer with the same id (``init_transactions``, which also aborts
what a crashed one left open), then reads the last SN back with a
``read_committed`` consumer: outputs whose SN is not above it are dropped, a
restart's replay regenerates them. Readers see the outputs exactly once with
``isolation.level=read_committed``.

Sinks into one topic share its state topic (each reads back only the records
keyed by its own id), and one being opened waits for a transaction another
left open there, as ``read_committed`` must: a crashed sink's transaction
lasts at most its ``timeout`` on Kafka (noida-db never ends it).

A producer fenced by a newer one (another incarnation of the job took over)
raises ``SinkFenced``. Every call to the broker has a deadline (``timeout``).
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Dict, Optional

from flux.connector_api import CommitsBySN, opened_to_read
from flux.errors import SinkFenced

log = logging.getLogger(__name__)

SN_HEADER = "flux.sn"
STATE_SUFFIX = ".flux-sink-state"


class KafkaSinkError(RuntimeError):
    """A commit failed without being fenced. If the transaction was aborted (``aborted``)
    the outputs stay pending and ``commit`` may be called again; otherwise (the broker away
    past the deadline mid-commit, a fatal error) whether it committed is unknown, the sink
    refuses every further call, and a ``KafkaSink`` opened again reads what was."""

    def __init__(self, message: str, aborted: bool = False):
        super().__init__(message)
        self.aborted = aborted


def _fence_codes():
    from confluent_kafka import KafkaError

    return {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


class KafkaSink(CommitsBySN):
    """Exactly-once outputs into ``topic`` (which must exist), under ``transactional_id``
    (one per sink of a job; the same across its restarts). ``key``: a record's Kafka key
    (str or bytes; None: no key). ``partition``: the topic's partition every output goes
    to (None: by key, or the client's choice; a sink per job partition,
    ``flux.SinkPerPartition``, may give each its own). ``state_topic``: where the last SN
    goes. ``config``: more librdkafka producer settings. Also a plain callable sink
    (``sink(item)``)."""

    name = "KafkaSink"

    def __init__(self, bootstrap: str, topic: str, transactional_id: str,
                 key: Optional[Callable[[Any], Any]] = None, partition: Optional[int] = None,
                 state_topic: Optional[str] = None,
                 config: Optional[Dict[str, Any]] = None, commit_every: int = 10_000,
                 timeout: float = 30.0):
        from confluent_kafka import KafkaException, Producer

        self.bootstrap, self.topic, self.transactional_id = bootstrap, topic, transactional_id
        self.state_topic = state_topic or topic + STATE_SUFFIX
        self.key, self.partition, self.timeout = key, partition, timeout
        self.commits = 0
        self._broken: Optional[str] = None  # why the sink refuses every further call
        settings = {"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                    "partitioner": "murmur2_random",  # the Java client's, for keyed records
                    # one commit lasts at most ``timeout``: what a crash leaves open goes soon
                    "transaction.timeout.ms": max(int(timeout * 1000), 1000),
                    "logger": log}
        settings.update(config or {})
        self._ensure_state_topic()
        self.producer = None
        if opened_to_read():  # the driver asks what a running writer committed: no fence
            super().__init__(self._read_committed(), commit_every)
            return
        self.producer = Producer(settings)
        try:  # fences every earlier incarnation and aborts what it left open
            self.producer.init_transactions(timeout)
        except KafkaException as exc:
            self._raise(exc, "starting")
        super().__init__(self._read_committed(), commit_every)
        log.info("KafkaSink %s (%s): committed up to %s", topic, transactional_id,
                 self._committed)

    def _commit(self, rows: list, sn: tuple) -> None:
        """One transaction: the rows, then the SN in the state topic."""
        from confluent_kafka import KafkaException

        if self._broken is not None:
            raise KafkaSinkError(self._broken)
        if self.producer is None:
            raise RuntimeError(f"KafkaSink {self.topic}: opened only to read, not to commit")
        deadline = time.monotonic() + self.timeout
        try:
            self.producer.begin_transaction()
            for row_sn, record in rows:
                self._produce(self.topic, json.dumps(record).encode(), self._key_of(record),
                              [(SN_HEADER, json.dumps(list(row_sn)).encode())], deadline,
                              self.partition)
            self._produce(self.state_topic, json.dumps({"sn": list(sn)}).encode(),
                          self.transactional_id.encode(), None, deadline)
            self._commit_transaction(deadline)
        except KafkaException as exc:
            self._raise(exc, f"committing {len(rows)} outputs up to {sn}")
        self.commits += 1

    def close(self) -> None:
        try:
            if self._broken is None:
                super().close()
        finally:
            if self.producer is not None:
                if self.producer.flush(self.timeout):  # left unsent: not to wait at close
                    self.producer.purge()
                if hasattr(self.producer, "close"):
                    self.producer.close()
                self.producer = None

    # -- producing ------------------------------------------------------------------------------
    def _produce(self, topic: str, value: bytes, key, headers, deadline: float,
                 partition: Optional[int] = None) -> None:
        where = {} if partition is None else {"partition": partition}
        while True:
            try:
                self.producer.produce(topic, value, key=key, headers=headers, **where)
                return
            except BufferError:  # the client's queue is full: let it send
                if time.monotonic() >= deadline:
                    self._abort()
                    raise KafkaSinkError(f"KafkaSink {self.topic} ({self.transactional_id}): "
                                         f"the broker took no output for {self.timeout} s; "
                                         f"the transaction was aborted", aborted=True)
                self.producer.poll(0.05)

    def _commit_transaction(self, deadline: float) -> None:
        """``commit_transaction``, again while it fails retriably and time is left."""
        from confluent_kafka import KafkaException

        while True:
            try:
                self.producer.commit_transaction(max(deadline - time.monotonic(), 0.1))
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() in _fence_codes() or error.fatal():
                    raise
                if error.txn_requires_abort():  # surely not committed: it can be done again
                    self._abort()
                    raise KafkaSinkError(f"KafkaSink {self.topic} ({self.transactional_id}): "
                                         f"the transaction was aborted: {error.str()}",
                                         aborted=True) from None
                if error.retriable() and time.monotonic() < deadline:
                    continue  # librdkafka: call it again to go on with the same commit
                self._broken = (f"KafkaSink {self.topic} ({self.transactional_id}): a commit "
                                f"did not finish within {self.timeout} s ({error.str()}), "
                                f"whether it committed is unknown: open the sink again")
                raise KafkaSinkError(self._broken) from None

    def _abort(self) -> None:
        from confluent_kafka import KafkaException

        try:
            self.producer.abort_transaction(self.timeout)
        except KafkaException as exc:
            log.warning("KafkaSink %s: aborting the transaction failed: %s", self.topic, exc)

    def _key_of(self, record: Any) -> Optional[bytes]:
        if self.key is None:
            return None
        key = self.key(record)
        if key is None or isinstance(key, bytes):
            return key
        return key.encode() if isinstance(key, str) else json.dumps(key).encode()

    def _raise(self, exc, doing: str):
        error = exc.args[0]
        if error.code() in _fence_codes():
            raise SinkFenced(f"KafkaSink {self.topic}: another producer with transactional id "
                             f"{self.transactional_id!r} took over (this one is fenced) while "
                             f"{doing}: this incarnation must stop. {error.str()}") from None
        raise KafkaSinkError(f"KafkaSink {self.topic} ({self.transactional_id}): {doing} "
                             f"failed{' fatally' if error.fatal() else ''}: {error.str()}") \
            from None

    # -- the state topic --------------------------------------------------------------------------
    def _ensure_state_topic(self) -> None:
        """The state topic created if missing; the output partition checked."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": log})
        topics = admin.list_topics(timeout=self.timeout).topics
        if self.partition is not None:  # a missing one would fail only at the first commit
            have = len(topics[self.topic].partitions) if self.topic in topics else 0
            if not 0 <= self.partition < have:
                raise ValueError(f"KafkaSink {self.topic}: no partition {self.partition} "
                                 f"(the topic has {have})")
        if self.state_topic in topics:
            return
        topic = NewTopic(self.state_topic, 1, -1, config={"cleanup.policy": "compact"})
        try:
            admin.create_topics([topic], request_timeout=self.timeout
                                )[self.state_topic].result(self.timeout)
            log.info("KafkaSink %s: created the state topic %s", self.topic, self.state_topic)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another sink was first
                raise

    def _read_committed(self) -> Optional[tuple]:
        """The SN of this transactional id's last committed record in the state topic: read
        from its end backwards, in windows growing four times, up to the offset that was the
        end when asked (committed or not: a transaction still open of another sink sharing the
        topic is waited for, so a record of ours behind it is not missed)."""
        from confluent_kafka import Consumer, TopicPartition

        settings = {"bootstrap.servers": self.bootstrap, "group.id": "flux-sink-state",
                    "enable.auto.commit": False, "session.timeout.ms": 6000,
                    "enable.partition.eof": True, "logger": log}
        # a transaction a crash left open lasts ``timeout`` at most, and the broker aborts
        # it at its next check (Kafka: every 10 s): wait for that, not only ``timeout``
        deadline = time.monotonic() + 2 * self.timeout
        reader = Consumer({**settings, "isolation.level": "read_committed"})
        ender = Consumer({**settings, "isolation.level": "read_uncommitted"})
        try:
            tp = TopicPartition(self.state_topic, 0)
            low, end = ender.get_watermark_offsets(tp, timeout=self.timeout, cached=False)
            window = 64
            while True:
                first = max(low, end - window)
                sn = self._last_sn(reader, first, end, deadline)
                if sn is not None or first == low:
                    return sn
                window *= 4
        finally:
            reader.close()
            ender.close()

    def _last_sn(self, reader, first: int, end: int, deadline: float) -> Optional[tuple]:
        from confluent_kafka import KafkaError, TopicPartition

        if first >= end:
            return None
        reader.assign([TopicPartition(self.state_topic, 0, first)])
        mine, sn = self.transactional_id.encode(), None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KafkaSinkError(f"KafkaSink {self.topic}: could not read the state topic "
                                     f"{self.state_topic} up to offset {end} within "
                                     f"{2 * self.timeout} s (a transaction of another sink "
                                     f"sharing it still open?)")
            message = reader.poll(min(left, 0.5))
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaSinkError(f"KafkaSink {self.topic}: reading the state topic "
                                         f"{self.state_topic} failed: {error}")
                if message.offset() >= end:
                    return sn
                continue
            if message.key() == mine:
                sn = tuple(json.loads(message.value())["sn"])
            if message.offset() + 1 >= end:
                return sn
